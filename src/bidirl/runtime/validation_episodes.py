"""Validation of a multi-turn run: whole episodes on held-out rows, greedy, turn by turn.

As single-turn validation (``runtime/validation.py``: when, on which device, what is logged),
but each validation row is an episode of the run's environment (``runtime/trajectories.py``,
a hub of its own at ``rollout.val_temperature``), and replica 0 generates the episodes' model
turns in *rounds*: one ``validate`` call with every episode's next turn (its prompt plus the
trajectory so far), then the environments answer (each on its episode's thread, off the
executor's loop), then the next round once every live episode waits for its next turn.  A
round is one call on replica 0 like a single-turn validation, so training requests are set
aside and resumed around it as there.  Nothing here touches the training groups or the ledger.

Scores: the episode's return per row.  ``val/distinct`` and ``val/mode_share`` are taken over
each episode's *last* model turn (its answer), where a collapsed policy shows; the outcomes'
shares and the mean turns are logged as ``val/multi_turn/...``.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from collections.abc import Callable

from bidirl.core.timeline import Activity
from bidirl.runtime.messages import ResponseResult
from bidirl.runtime.trajectories import TrajectoryHub, verl_row
from bidirl.runtime.validation import Validator, ValResult, ValSet

VAL_GROUP = -1  # the hub's group id for validation episodes (training groups are >= 0)


class EpisodeValidator(Validator):
    """``Validator``'s interface (``request``, ``poke``, ``final``) over episodes in rounds."""

    def __init__(self, ex, vs: ValSet, make_hub: Callable[[float], TrajectoryHub],
                 on_result: Callable[[ValResult], None], decode: Callable, decode_prompt: Callable,
                 n_samples: int = 4) -> None:
        super().__init__(ex, vs, self._score, on_result)
        self.make_hub, self.decode, self.decode_prompt, self.n_samples = make_hub, decode, decode_prompt, n_samples
        self.hub: TrajectoryHub | None = None  # the validation in progress
        self.version = 0
        self.round_in_flight = False
        self.started_s = 0.0

    # -- in the loop ------------------------------------------------------------------------
    def poke(self) -> None:
        if self._claim():
            self._begin(self.ex.rollout.version.get(self.UNIT, self.ex.job.version_offset))

    def pump(self) -> None:
        """The next round, once every live episode waits for its turn; the result once all ended."""
        if self.hub is None or self.round_in_flight:
            return
        if self.hub.failure is not None:
            raise RuntimeError(f"a validation episode failed outside its environment: {self.hub.failure!r}")
        if self.hub.live == 0:
            self._end()
            return
        if not self.hub.all_asking():
            return
        reqs = self.hub.take_requests()
        if not reqs:
            return
        self.round_in_flight = True
        prompts, cap = self._round(reqs)
        self.ex.calls.issue(self.ex.unit_device(self.UNIT), lambda out: self._answered(reqs, out),
                            ("rollout", "validate"), "call", "rollout", "validate", prompts, cap,
                            self.vs.temperature, self.vs.seed, None, on_lost=self._lost)

    def waiting_on_environment(self) -> bool:
        """Work to come without a call finishing: an episode in its environment, or all ended
        since the last ``pump`` (the next one ends the validation; not a stall)."""
        return self.hub is not None and not self.round_in_flight and (self.hub.live == 0 or not self.hub.all_asking())

    def _lost(self) -> None:
        super()._lost()
        if self.hub is not None:
            self.hub.close()
        self.hub, self.round_in_flight = None, False

    # -- a validation ------------------------------------------------------------------------
    def _begin(self, version: int) -> None:
        self.version, self.started_s = version, time.perf_counter()
        self.hub = self.make_hub(self.vs.temperature)
        for i, row in enumerate(self.vs.rows):
            self.hub.start(VAL_GROUP, i, verl_row(row), self.vs.seed + i, self.vs.prompt_ids[i])

    @staticmethod
    def _round(reqs) -> tuple[list[list[int]], int]:
        prompts = [list(r.prompt_ids) + list(r.prefix_ids) for r in reqs]
        return prompts, min(r.max_new_tokens - len(r.prefix_ids) for r in reqs)

    def _answered(self, reqs, out: dict) -> None:
        self.round_in_flight = False
        for r, new, why in zip(reqs, out["responses"], out["finish_reasons"], strict=True):
            self.hub.turn_done(ResponseResult(
                r.group_id, r.index, r.prompt_ids, list(r.prefix_ids) + list(new),
                list(r.prefix_logprobs) + [0.0] * len(new), list(r.prefix_versions) + [out["version"]] * len(new),
                True, why, r.max_new_tokens, r.temperature, r.seed))

    def _end(self) -> None:
        hub, self.hub = self.hub, None
        results = sorted(hub.take_finished(), key=lambda r: r.index)
        hub.close()
        self.in_flight = False
        self._deliver({"version": self.version, "results": results, "seconds": time.perf_counter() - self.started_s})
        self.poke()

    def final(self, version: int) -> None:
        """The end-of-run validation: rounds issued and waited for here, after the loop."""
        ex = self.ex
        if self.hub is not None:  # one in progress is superseded
            self.hub.close()
        dev = self._final_weights(version)
        self.in_flight, self.round_in_flight = True, False
        self._begin(version)
        while self.hub.live:
            if self.hub.failure is not None:
                raise RuntimeError(f"a validation episode failed outside its environment: {self.hub.failure!r}")
            if not self.hub.all_asking():
                time.sleep(0.005)
                continue
            reqs = self.hub.take_requests()
            prompts, cap = self._round(reqs)
            self._answered(reqs, ex.call_now(dev, "call", "rollout", "validate", prompts, cap,
                                             self.vs.temperature, self.vs.seed, None))
        ex.clock.set((dev,), ex.now(), Activity.IDLE, "rollout", "run finished")
        self._end()

    # -- scoring -------------------------------------------------------------------------------
    def _score(self, out: dict) -> ValResult:
        results: list[ResponseResult] = out["results"]
        rows = self.vs.rows
        scores = [float(r.env_reward) for r in results]
        answers = Counter(self._last_turn(r) for r in results)
        m = {"val/score/mean": statistics.fmean(scores) if scores else 0.0,
             "val/score/max": max(scores, default=0.0), "val/score/min": min(scores, default=0.0),
             "val/bad_count": 0, "val/prompts": len(scores), "timing_s/val": float(out["seconds"]),
             "val/response_length/mean": statistics.fmean(len(r.token_ids) for r in results) if results else 0.0,
             "val/distinct": len(answers),
             "val/mode_share": answers.most_common(1)[0][1] / len(results) if results else 0.0,
             "val/multi_turn/turns_mean": statistics.fmean(r.turns for r in results) if results else 0.0}
        for outcome in sorted({r.outcome for r in results}):
            m[f"val/multi_turn/outcome/{outcome}"] = sum(r.outcome == outcome for r in results) / len(results)
        by_source: dict[str, list[float]] = {}
        for r in results:
            by_source.setdefault(rows[r.index].data_source, []).append(float(r.env_reward))
        for source, vals in by_source.items():
            m[f"val-core/{source}/reward/mean@1"] = statistics.fmean(vals)
        samples = [{"kind": "val", "step": out["version"], "version": out["version"],
                    "data_source": rows[r.index].data_source, "prompt": self.decode_prompt(r.prompt_ids),
                    "response": self.decode_prompt(r.token_ids), "score": float(r.env_reward),
                    "turns": r.turns, "outcome": r.outcome} for r in results[: self.n_samples]]
        return ValResult(out["version"], m["val/score/mean"], m, samples)

    def _last_turn(self, r: ResponseResult) -> str:
        mask = r.loss_mask or []
        end = max((i for i, x in enumerate(mask) if x), default=-1) + 1
        start = end
        while start > 0 and mask[start - 1]:
            start -= 1
        return self.decode(r.token_ids[start:end])
