"""Validation: the current weights, greedy, on held-out prompts, scored like training.

Every ``run.val_every`` steps (and at the end of a finished run; at the start too with
``run.val_before_train``, or when a resume starts at a validation step) rollout replica 0
generates one response per validation prompt (``RolloutRole.validate``: temperature
``rollout.val_temperature``, 0 = greedy) and the run's reward function scores them.  The
groups, the ledger and the trainer never see these responses: they are not training
samples, and nothing about them is checkpointed.

When: a validation of version ``k`` (the weights after ``k`` steps) is requested when step
``k`` has been applied, and issued once replica 0 holds version ``k`` or newer (its weight
sync, issued by the policy, comes first on the device; the result names the version it
actually ran with).  While the run goes on it is one more call on that device, shown in
the trace as ``validate``; the final one runs after the last step, on the final weights,
before the run's outputs are written.

Outputs: ``val/score/mean`` (and ``max``, ``min``), veRL's
``val-core/<data_source>/reward/mean@1``, ``val-aux/<data_source>/<key>/mean@1`` for a dict
reward's extra keys, ``val/response_length/mean``, ``val/bad_count`` and ``timing_s/val``;
``val/distinct`` (different response texts) and ``val/mode_share`` (the share of the most
common one: a policy collapsed to one answer scores what that answer scores, and shows
here first; the progress line flags a share over half),
logged with ``step`` = the version; and the first ``run.val_samples`` responses in
``samples.jsonl``.
"""

from __future__ import annotations

import statistics
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bidirl.core.timeline import Activity
from bidirl.runtime.reward_call import BadRewardError, call_reward, describe_bad_reward, reward_extras

BUILTIN_VAL_ROWS = 64  # a built-in task's validation prompts when data.val_max_samples is -1


@dataclass
class ValSet:
    """The validation prompts as the replica gets them, with what scoring them needs."""

    rows: list  # PromptRow
    prompt_ids: list[list[int]]
    max_new_tokens: int
    temperature: float = 0.0
    seed: int = 0
    images: list[tuple[bytes, ...]] | None = None
    """Each prompt's images (their placeholders in ``prompt_ids`` unexpanded); None: text only."""


@dataclass
class ValResult:
    version: int
    score: float
    metrics: dict[str, float]
    samples: list[dict] = field(default_factory=list)


def score_validation(vs: ValSet, out: dict, reward_fn, decode: Callable[[list[int]], str],
                     decode_prompt: Callable[[list[int]], str] | None = None, n_samples: int = 4) -> ValResult:
    """Score a replica's ``validate`` answer: metrics (see the module doc) and sample records.

    A bad reward follows ``data.on_bad_reward`` as in training: an error (``BadRewardError``
    naming the validation row) or 0, counted in ``val/bad_count``.
    """
    policy = getattr(reward_fn, "on_bad_reward", "error")
    scores, by_source, extras, bad, samples, texts = [], {}, {}, 0, [], Counter()
    for i, (row, ids) in enumerate(zip(vs.rows, out["responses"], strict=True)):
        text = decode(ids)
        texts[text] += 1
        value, raw = call_reward(reward_fn, row.data_source, text, row.ground_truth, row.extra_info)
        if value is None:
            if policy != "zero":
                name = getattr(reward_fn, "name", "the reward function")
                raise BadRewardError(f"bad reward in validation: {name} {describe_bad_reward(raw)} for "
                                     f"{row.path or 'data'} {row.label} (data_source {row.data_source!r}); fix "
                                     "the reward function or set data.on_bad_reward=zero to score such responses 0")
            bad += 1
            value = 0.0
        else:
            for k, v in reward_extras(raw).items():
                extras.setdefault((row.data_source, k), []).append(v)
        scores.append(value)
        by_source.setdefault(row.data_source, []).append(value)
        if i < n_samples:
            prompt = decode_prompt(vs.prompt_ids[i]) if decode_prompt else _last_user(row.messages)
            samples.append({"kind": "val", "step": out["version"], "version": out["version"],
                            "data_source": row.data_source, "prompt": prompt, "response": text,
                            "score": value, "ground_truth": _plain(row.ground_truth)})
    lengths = [len(ids) for ids in out["responses"]]
    score = statistics.fmean(scores) if scores else 0.0
    m = {"val/score/mean": score, "val/score/max": max(scores, default=0.0),
         "val/score/min": min(scores, default=0.0), "val/bad_count": bad,
         "val/response_length/mean": statistics.fmean(lengths) if lengths else 0.0,
         "val/response_length/clip_ratio": (sum(n >= vs.max_new_tokens for n in lengths) / len(lengths)
                                            if lengths else 0.0),
         "val/prompts": len(scores), "timing_s/val": float(out.get("seconds", 0.0)),
         "val/distinct": len(texts),
         "val/mode_share": texts.most_common(1)[0][1] / len(scores) if scores else 0.0}
    for source, vals in by_source.items():
        m[f"val-core/{source}/reward/mean@1"] = statistics.fmean(vals)
    for (source, k), vals in extras.items():
        m[f"val-aux/{source}/{k}/mean@1"] = statistics.fmean(vals)
    return ValResult(out["version"], score, m, samples)


def _last_user(messages) -> str:
    users = [m["content"] for m in messages if m.get("role") == "user"]
    return users[-1] if users else (messages[-1]["content"] if messages else "")


def _plain(x: Any) -> Any:
    return x if isinstance(x, (str, int, float, bool, type(None), list, dict)) else str(x)


class Validator:
    """The executor side: when to validate, on which device, and the final validation.

    ``on_result(ValResult)`` receives every scored validation (the reporter logs it).
    """

    UNIT = 0  # rollout replica 0: a home replica, whose rollout role is always hosted

    def __init__(self, ex, vs: ValSet, score: Callable[[dict], ValResult],
                 on_result: Callable[[ValResult], None]) -> None:
        self.ex, self.vs, self.score, self.on_result = ex, vs, score, on_result
        self.pending: int | None = None  # the version waiting for replica 0 to hold it
        self.in_flight = False
        self.done_versions: list[int] = []

    def request(self, version: int) -> None:
        """Validate version ``version`` (or newer) as soon as replica 0 holds it."""
        self.pending = version if self.pending is None else max(self.pending, version)
        self.poke()

    def poke(self) -> None:
        """Issue the pending validation if replica 0 holds its version and none is in flight
        (the executor calls this whenever a replica is given new weights)."""
        if not self._claim():
            return
        ex, vs = self.ex, self.vs
        ex.calls.issue(ex.unit_device(self.UNIT), self._done, ("rollout", "validate"), "call", "rollout",
                       "validate", vs.prompt_ids, vs.max_new_tokens, vs.temperature, vs.seed, vs.images,
                       on_lost=self._lost)

    def _claim(self) -> bool:
        """Take the pending validation if replica 0 holds its version and none is in flight."""
        ex = self.ex
        if self.pending is None or self.in_flight:
            return False
        if ex.rollout.version.get(self.UNIT, ex.job.version_offset) < self.pending:
            return False
        self.pending, self.in_flight = None, True
        return True

    def pump(self) -> None:
        """Called on every pass of the executor's loop (a multi-turn validation's rounds)."""

    def waiting_on_environment(self) -> bool:
        """True while a validation waits on environments (the loop then looks again soon)."""
        return False

    def _done(self, out: dict) -> None:
        self.in_flight = False
        self._deliver(out)
        self.poke()

    def _lost(self) -> None:
        self.in_flight = False
        print("[bidirl] warning: replica 0's device died during a validation; it is skipped", file=sys.stderr)

    def _deliver(self, out: dict) -> None:
        result = self.score(out)
        self.done_versions.append(result.version)
        self.on_result(result)

    def final(self, version: int) -> None:
        """The end-of-run validation, on the primary's final weights (version ``version``).

        Called after the loop has ended, so it waits for its calls (behind anything still on
        the device) instead of going through the loop; a validation still in flight is
        superseded.  Its device time is recorded as ``validate`` like the others."""
        ex, vs = self.ex, self.vs
        dev = self._final_weights(version)
        out = ex.call_now(dev, "call", "rollout", "validate", vs.prompt_ids, vs.max_new_tokens, vs.temperature,
                          vs.seed, vs.images)
        ex.clock.set((dev,), ex.now(), Activity.IDLE, "rollout", "run finished")
        self._deliver(out)

    def _final_weights(self, version: int) -> int:
        """The final validation's start: nothing pending, replica 0 busy validating and holding
        version ``version`` (loaded now if it does not); returns its device."""
        ex = self.ex
        dev = ex.unit_device(self.UNIT)
        self.pending, self.in_flight = None, False
        ex.clock.set((dev,), ex.now(), Activity.BUSY, "rollout", "validate")
        if ex.rollout.version.get(self.UNIT) != version:
            ex.call_now(dev, "call", "rollout", "update_weights", ex.primary_weights(), version)
            ex.rollout.version[self.UNIT] = version
        return dev
