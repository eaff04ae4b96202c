"""Per-step reporting of a real run: metrics, progress line, samples, and the final outputs.

Metric names are veRL's where veRL has the metric (``critic/score/mean|max|min``,
``response_length/mean|max|min|clip_ratio``, ``prompt_length/mean|max|min``,
``actor/entropy``, ``actor/lr``, ``actor/pg_loss``, ``actor/pg_clipfrac``,
``actor/grad_norm``, ``timing_s/gen``, ``timing_s/update_actor``,
``timing_s/update_weights``, ``timing_s/step``, ``perf/throughput``,
``perf/total_num_tokens``; the importance ratio pi_current / pi_behaviour's spread as
``rollout_corr/rollout_is_mean|max|ratio_fraction_high``, whether or not
``algorithm.rollout_correction`` uses it) so users read them where they are used to; ``reward/mean|max|min``
(the same numbers as ``critic/score/*``) stay for the tests and benches that read them.
A dict reward's extra keys are logged as ``reward/extra/<key>`` means.  Validation
(``runtime/validation.py``) logs ``val/*`` and ``val-core/*`` and writes ``samples.jsonl``
with a few training responses every ``run.train_samples_every`` steps.  The guards against bad numbers report
here too: ``reward/bad_count`` (rewards scored 0 under ``data.on_bad_reward=zero``) and
``actor/skipped_steps`` (steps skipped for a non-finite loss or gradient) per step, and
their totals in ``summary.json`` (``reward_bad_count``, ``skipped_steps``).  With dynamic
sampling (``algorithm.filter_groups``) each step logs ``filter/groups_filtered`` and
``filter/keep_rate`` (its trained groups over trained + filtered).

The metrics of a step are a pure function (``step_metrics``) of the step's record, its
groups as the store held them (``StepGroups``) and what the executor saw since the step
before (``SinceLastStep``, which ``StepReporter.since_last_step`` gathers).  What else
happens after a step (the ledger, the store, checkpoints, a stop) is the session's
(``runtime/boundary.py``).
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from bidirl.obs.accounting import PoolTime, borrowed_seconds, pool_times
from bidirl.obs.metrics import MetricsLogger, read_metrics
from bidirl.obs.progress import COLLAPSE_SHARE, ProgressLine
from bidirl.obs.samples_log import SamplesLog
from bidirl.obs.trace import write_chrome_trace
from bidirl.runtime.config import TrainConfig
from bidirl.runtime.reward_call import slow_calls


@dataclass(frozen=True)
class StepGroups:
    """A step's groups as the store holds them, read before they are retired."""

    bad_count: int
    """Rewards scored 0 under ``data.on_bad_reward=zero``."""
    extra_means: dict[str, float]
    """A dict reward's extra keys, averaged."""
    response_lengths: list[int]
    prompt_lengths: list[int]
    multi_turn: dict[str, float] = field(default_factory=dict)
    """Trajectories' turns, environment time, tokens and outcomes (``GroupStore.trajectory_means``)."""

    @classmethod
    def read(cls, store, group_ids) -> StepGroups:
        return cls(store.bad_count(group_ids), store.extra_means(group_ids),
                   [len(store.groups[g].done[i].token_ids) for g in group_ids for i in range(store.n)],
                   [len(store.groups[g].trained_prompt_ids) for g in group_ids],
                   store.trajectory_means(group_ids))


@dataclass(frozen=True)
class SinceLastStep:
    """What the executor saw between the previous step and this one (and some totals so far)."""

    step_s: float
    idle_ratios: dict[str, float]
    """Per pool, over the whole run so far."""
    borrowed_s: dict[str, float]
    """Device-seconds lent each way, over the whole run so far."""
    gen_s: float | None
    """Generation time of the step's groups (None: not measured)."""
    syncs_s: list[float]
    """Weight syncs since the previous step."""
    switches: list[tuple[str, float]]
    """Every switch so far: (kind, seconds)."""
    pair_medians: dict[str, float]
    """Switch costs per node pair (``<kind>/n<src>-n<dst>``)."""
    decisions: list
    """Admission decisions since the previous step."""
    reclaim_waits: list[dict]
    model_errors: dict[str, float | None]
    """The decode and train stage models' median relative error (None: none scored yet)."""


def step_metrics(rec, groups: StepGroups, seen: SinceLastStep, max_new_tokens: int) -> dict:
    """The metrics of step ``rec`` (a ``TrainStepRecord``), by name (see the module doc)."""
    rewards, lengths, prompts = rec.rewards, groups.response_lengths, groups.prompt_lengths
    reward = statistics.mean(rewards)
    m = {
        "reward/mean": reward,
        "reward/max": max(rewards), "reward/min": min(rewards),
        "critic/score/mean": reward,
        "critic/score/max": max(rewards), "critic/score/min": min(rewards),
        "reward/bad_count": groups.bad_count,
        "response_length/mean": statistics.fmean(lengths),
        "response_length/max": max(lengths), "response_length/min": min(lengths),
        "response_length/clip_ratio": sum(n >= max_new_tokens for n in lengths) / len(lengths),
        "prompt_length/mean": statistics.fmean(prompts),
        "prompt_length/max": max(prompts), "prompt_length/min": min(prompts),
        "timing_s/step": seen.step_s,
        "timing_s/update_actor": rec.finished_s - rec.started_s,
        "perf/throughput": rec.total_tokens / seen.step_s if seen.step_s > 0 else 0.0,
        "perf/total_num_tokens": rec.total_tokens,
        "trainer/idle_ratio": seen.idle_ratios.get("train", 0.0),
        "rollout/idle_ratio": seen.idle_ratios.get("rollout", 0.0),
        "staleness/mean": statistics.mean(rec.staleness),
        "staleness/max": max(rec.staleness),
        "borrow/aux_chunks": sum(1 for ex, _ in rec.chunks if ex != "primary"),
    }
    if rec.filtered is not None:  # dynamic sampling: groups filtered for this step, and the share kept
        trained = len(rec.group_ids)
        m["filter/groups_filtered"] = len(rec.filtered)
        m["filter/keep_rate"] = trained / (trained + len(rec.filtered))
    # A stage model's error exists once one of its predictions has been scored; before
    # that the key is left out (None would be logged as a skipped metric on every run).
    for name, error in seen.model_errors.items():
        if error is not None:
            m[f"stage_model/{name}_median_error"] = error
    for k, name in (("loss", "actor/loss"), ("pg_loss", "actor/pg_loss"), ("clip_frac", "actor/pg_clipfrac"),
                    ("kl_ref", "actor/kl_loss"), ("kl_behaviour", "actor/kl_behaviour"), ("entropy", "actor/entropy"),
                    ("lr", "actor/lr"), ("grad_norm", "actor/grad_norm"), ("skipped_steps", "actor/skipped_steps"),
                    ("rollout_is_mean", "rollout_corr/rollout_is_mean"),
                    ("rollout_is_max", "rollout_corr/rollout_is_max"),
                    ("rollout_is_fraction_high", "rollout_corr/rollout_is_ratio_fraction_high"),
                    ("reward_kl_penalty", "actor/reward_kl_penalty"),
                    ("reward_kl_penalty_coeff", "actor/reward_kl_penalty_coeff"),
                    ("rewards_mean", "critic/rewards/mean")):
        if k in rec.metrics:
            m[name] = rec.metrics[k]
    for k, v in groups.extra_means.items():
        m[f"reward/extra/{k}"] = v
    m.update(groups.multi_turn)
    if seen.gen_s is not None:
        m["timing_s/gen"] = seen.gen_s
    if seen.syncs_s:
        m["timing_s/update_weights"] = statistics.fmean(seen.syncs_s)
    m.update(_switch_metrics(seen, rec.c_grad_s))
    m.update(_admission_metrics(seen.decisions))
    if seen.reclaim_waits:
        m["switch/reclaim_wait_max_s"] = max(w["wait_s"] for w in seen.reclaim_waits)
    for k, v in seen.borrowed_s.items():
        m[f"borrow/{k}_s"] = v
    return m


def _switch_metrics(seen: SinceLastStep, c_grad_s) -> dict:
    """Median switch costs per kind, per direction of C_in / C_out, and per node pair."""
    m = {}
    sw: dict[str, list[float]] = {}
    for kind, secs in seen.switches:
        sw.setdefault(kind, []).append(secs)
    for kind, vals in sw.items():
        m[f"switch/{kind.replace('.', '/')}_s"] = statistics.median(vals)
    for kind in ("c_in", "c_out"):
        vals = [v for k, vs in sw.items() if k.endswith(kind) for v in vs]
        if vals:
            m[f"switch/{kind}_s"] = statistics.median(vals)
    if c_grad_s:
        m["switch/c_grad_s"] = statistics.median(c_grad_s)
    for key, v in seen.pair_medians.items():  # per node pair: weights -> device
        kind, pair = key.split("/")
        direction, what = kind.split(".")
        m[f"switch/{what}_s/{direction}/{pair}"] = v
    return m


def _admission_metrics(decisions: list) -> dict:
    """Admitted and rejected borrows per direction, and their mean benefit, cost and margin."""
    m = {}
    for direction in ("roll_on_train", "train_on_roll"):
        ds = [d for d in decisions if d.direction == direction]
        if ds:
            m[f"admission/{direction}/admitted"] = sum(d.admit for d in ds)
            m[f"admission/{direction}/rejected"] = sum(not d.admit for d in ds)
            for key in ("benefit_s", "cost_s", "margin_s"):  # inf: "cannot pay" — not a number to average
                vals = [getattr(d, key) for d in ds if math.isfinite(getattr(d, key))]
                if vals:
                    m[f"admission/{direction}/{key}"] = statistics.mean(vals)
    return m


class StepReporter:
    """The run's metrics, progress line and samples, step by step; the output files at the end.

    ``ex`` is the run's ``DeviceExecutor``; ``wandb_config`` the config Weights & Biases
    records (with ``run.wandb``)."""

    def __init__(self, cfg: TrainConfig, run_dir: Path, start_step: int, ex, wandb_config: dict | None = None) -> None:
        self.cfg, self.run_dir, self.ex = cfg, Path(run_dir), ex
        wandb = None
        if cfg.run.wandb:
            wandb = {"project": cfg.run.wandb_project, "name": cfg.run.wandb_name,
                     "config": wandb_config if wandb_config is not None else cfg.to_dict()}
        self.metrics = MetricsLogger(self.run_dir, tensorboard="auto" if cfg.run.tensorboard else "none",
                                     wandb=wandb)
        self.progress = ProgressLine(cfg.run.steps, start_step=start_step)
        self.samples = SamplesLog(self.run_dir)
        self.decode_prompt = None  # set by the session: prompt ids -> text, template included
        self.val_score: float | None = None  # the latest validation's, for the progress line
        self.val_mode_share: float | None = None  # its most common response's share (collapse shows)
        self._last_t = 0.0
        self._seen_syncs = 0
        self._seen_admissions = 0
        self._seen_intervals = 0
        self._pool: dict[str, PoolTime] = {}
        self._borrowed: dict[str, float] = {}

    def since_last_step(self, rec) -> SinceLastStep:
        """What the executor saw since the previous step (read once per step: it moves on)."""
        ex = self.ex
        now = ex.now()
        step_s, self._last_t = now - self._last_t, now
        ratios = self._absorb_intervals(ex.clock.intervals)
        syncs = ex.sync_seconds[self._seen_syncs:]
        self._seen_syncs = len(ex.sync_seconds)
        decisions = ex.controller.state.admissions[self._seen_admissions:]
        self._seen_admissions += len(decisions)
        est = ex.controller.state.est
        return SinceLastStep(
            step_s=step_s, idle_ratios=ratios, borrowed_s=dict(self._borrowed),
            gen_s=ex.rollout.gen_seconds(rec.group_ids), syncs_s=list(syncs), switches=list(ex.switches),
            pair_medians=est.switch.pair_medians(), decisions=list(decisions), reclaim_waits=list(ex.reclaim_waits),
            model_errors={"decode": est.rollout.decode.median_rel_error(), "train": est.train.micro.median_rel_error()})

    def report_step(self, rec, groups: StepGroups) -> None:
        """Log step ``rec``'s metrics and move the progress line (its groups read beforehand)."""
        seen = self.since_last_step(rec)
        m = step_metrics(rec, groups, seen, self.cfg.rollout.max_new_tokens)
        if rec.metrics.get("skipped"):
            print(f"[bidirl] warning: step {rec.step}: non-finite loss {rec.metrics.get('loss')} or grad norm "
                  f"{rec.metrics.get('grad_norm')}; the step was skipped (trainer.on_nonfinite=skip), "
                  f"{int(rec.metrics.get('skipped_steps', 1))} so far", file=sys.stderr)
        self.metrics.log(rec.step, m)
        self.progress.update(rec.step + 1, reward=m["reward/mean"], val_score=self.val_score,
                             val_mode_share=self.val_mode_share,
                             tokens_per_s=m["perf/throughput"], idle_ratios=seen.idle_ratios,
                             staleness_mean=m["staleness/mean"], staleness_max=m["staleness/max"],
                             slow_rewards=slow_calls(self.ex.job.reward_fn))

    def on_validation(self, result) -> None:
        """A scored validation (``validation.ValResult``): metrics at step = its version, samples."""
        self.val_score = result.score
        self.val_mode_share = result.metrics.get("val/mode_share")
        if self.val_mode_share is not None and self.val_mode_share > COLLAPSE_SHARE:
            print(f"[bidirl] warning: validation at step {result.version}: one response is "
                  f"{100 * self.val_mode_share:.0f}% of {int(result.metrics.get('val/prompts', 0))} "
                  f"({int(result.metrics.get('val/distinct', 0))} distinct): the policy may have collapsed "
                  "to a single answer (samples.jsonl shows them)", file=sys.stderr)
        self.metrics.log(result.version, result.metrics)
        self._write_samples(result.version, "val", result.samples[:self.cfg.run.val_samples])

    def train_samples(self, rec, store) -> None:
        """A few of this step's responses (one per group) into ``samples.jsonl``, every
        ``run.train_samples_every`` steps; before ``store`` retires the step's groups."""
        every, n = self.cfg.run.train_samples_every, self.cfg.run.train_samples
        if not every or not n or rec.step % every:
            return
        out = []
        for g in rec.group_ids[:n]:
            grp = store.groups[g]
            r = grp.done[0]
            turns = r.loss_mask is not None  # a trajectory: its own prompt, and every turn with its role tags
            ids = r.prompt_ids if turns else grp.prompt_ids
            prompt = self.decode_prompt(ids) if self.decode_prompt else str(ids)
            response = (self.decode_prompt(r.token_ids) if turns and self.decode_prompt
                        else self.ex.job.decode(r.token_ids))
            out.append({"kind": "train", "step": rec.step, "version": min(r.versions) if r.versions else None,
                        "data_source": grp.data_source, "prompt": prompt,
                        "response": response, "score": grp.rewards.get(0),
                        "ground_truth": grp.ground_truth if isinstance(grp.ground_truth, (str, int, float))
                        else str(grp.ground_truth)})
            if turns:
                out[-1].update(turns=r.turns, outcome=r.outcome, env_seconds=round(r.env_seconds, 4))
        self._write_samples(rec.step, "train", out)

    def _write_samples(self, step: int, kind: str, records: list[dict]) -> None:
        if not records:
            return
        self.samples.write(records)
        text = "\n\n".join(f"**prompt** {r['prompt']!r}  \n**response** {r['response']!r}  \n"
                            f"**score** {r['score']}" for r in records)
        self.metrics.log_text(step, f"samples/{kind}", text)

    def _absorb_intervals(self, intervals: list) -> dict[str, float]:
        """Add the intervals closed since the last step to running totals; idle ratios so far.

        Incremental, so a long run does not rescan its whole history every step.
        """
        new = intervals[self._seen_intervals:]
        self._seen_intervals = len(intervals)
        for pool, t in pool_times(new).items():
            old = self._pool.get(pool, PoolTime())
            self._pool[pool] = PoolTime(old.busy_s + t.busy_s, old.idle_s + t.idle_s,
                                        old.switching_s + t.switching_s)
        for k, v in borrowed_seconds(new).items():
            self._borrowed[k] = self._borrowed.get(k, 0.0) + v
        return {pool: t.idle_ratio for pool, t in self._pool.items()}

    def _guard_totals(self) -> dict:
        """Bad rewards scored 0 and steps skipped over the whole run, resumes included.

        Read back from ``metrics.jsonl``, which a resume cuts back to its checkpoint's step
        before appending (should a step still be logged twice, it counts once: its last record).
        """
        by_step: dict[int, dict] = {}
        for r in read_metrics(self.run_dir):
            if "reward/mean" in r and r["step"] < self.cfg.run.steps:
                by_step[r["step"]] = r
        last = by_step[max(by_step)] if by_step else {}
        vals = {r["step"]: r["val/score/mean"] for r in read_metrics(self.run_dir)
                if "val/score/mean" in r}
        return {"reward_bad_count": int(sum(r.get("reward/bad_count", 0) for r in by_step.values())),
                "skipped_steps": int(last.get("actor/skipped_steps", 0)),
                "val_score": vals[max(vals)] if vals else None,
                "val_scores": [{"step": k, "score": vals[k]} for k in sorted(vals)]}

    def close(self) -> None:
        self.progress.close()
        self.samples.close()

    def finish(self, summary: dict, intervals, final_step: int | None = None) -> None:
        """Final metrics (logged at ``final_step``: ``run.steps``, or where a stopped run
        stopped), trace, timeline and summary files."""
        cfg, run_dir = self.cfg, self.run_dir
        final = {"final/stage_model_median_error/" + k: v
                 for k, v in summary["stage_model_median_error"].items() if v is not None}
        final["final/wall_s"] = summary["wall_s"]
        final["final/throughput_tokens_per_s"] = summary["throughput_tokens_per_s"]
        self.metrics.log(cfg.run.steps if final_step is None else final_step, final)
        self.metrics.close()
        summary.update(self._guard_totals())
        if intervals:
            write_chrome_trace(intervals, run_dir / "trace.json", process_name="bidirl train")
            if cfg.run.plot:
                # lazy: pulls in matplotlib (half a second), and only a run that plots needs it
                from bidirl.obs.timeline_plot import plot_timeline

                plot_timeline(intervals, run_dir / "timeline.png",
                              title=f"bidirl train ({cfg.scheduler.policy}), {summary['wall_s']:.0f} s")
        out = dict(summary)
        out["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%S")
        (run_dir / "summary.json").write_text(json.dumps(out, indent=1, default=str))
