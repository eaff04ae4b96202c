"""What happens after each step a real run applies: the session's step boundary.

The executor calls ``StepBoundary.after_step`` when the primary trainer has applied a step,
before the controller has seen the step finish (so the primary trainer is idle).  In order:
the step's groups go to the ledger (``trained_groups.jsonl``; with dynamic sampling, the
groups filtered for the step as well), their figures are read and a few responses sampled,
the groups leave the store (the filtered ones too), the step's reward is kept, the metrics
are reported (``reporting.StepReporter``); then the boundary moves on, a validation is
requested every ``run.val_every`` steps, a checkpoint is written every
``run.checkpoint_every`` steps and at the last step always, and at the first boundary after
a stop signal (``stops.StopSignals``) that boundary's checkpoint is written and the run
stops there (the executor's ``should_stop`` reads ``stopped_at``).
"""

from __future__ import annotations

import statistics
from pathlib import Path

from bidirl.runtime.checkpoints import write_checkpoint
from bidirl.runtime.config import TrainConfig
from bidirl.runtime.reporting import StepGroups, StepReporter
from bidirl.runtime.run_dir import LedgerFile
from bidirl.runtime.stops import StopSignals


class StepBoundary:
    """The run's state at its step boundaries: where it is, what it has checkpointed, the
    rewards so far; and what each step's end does (see the module doc).

    ``ex`` is the run's ``DeviceExecutor`` (its ``job.store`` the ``GroupStore``),
    ``cursor`` the prompt cursor; ``rewards_by_step`` the checkpoint's, on resume."""

    def __init__(self, cfg: TrainConfig, run_dir: Path, start_step: int, rewards_by_step: dict[int, float],
                 stop: StopSignals, ex, cursor, reporter: StepReporter, ledger_path: Path) -> None:
        self.cfg, self.ckpt_root, self.stop = cfg, Path(run_dir) / "checkpoints", stop
        self.ex, self.cursor, self.reporter = ex, cursor, reporter
        self.start_step = start_step
        self.rewards_by_step = rewards_by_step
        self.next_step = start_step  # the step after the last one applied: where a checkpoint may be taken
        self.stopped_at: int | None = None  # a stop's boundary, once its checkpoint is written
        self.checkpointed: int | None = None  # the newest checkpoint this session wrote
        self.ledger = LedgerFile(ledger_path)

    @property
    def stopping(self) -> bool:
        """The executor's ``should_stop``: a stop's boundary is reached, or a second signal came."""
        return self.stopped_at is not None or self.stop.abandon

    def after_step(self, rec) -> None:
        """Called by the executor when the primary trainer has applied step ``rec.step``."""
        cfg, store = self.cfg, self.ex.job.store
        filtered = self.ex.rollout.filtered_of(rec.step)
        if cfg.algorithm.filter_groups.enable:
            rec.filtered = filtered
        self.ledger.append_step(rec.step, rec.group_ids, rec.staleness, filtered)
        groups = StepGroups.read(store, rec.group_ids)  # before the groups are retired
        self.reporter.train_samples(rec, store)
        for g in rec.group_ids + filtered:
            store.pop(g)
        self.rewards_by_step[rec.step] = statistics.mean(rec.rewards)
        self.reporter.report_step(rec, groups)
        self.next_step = rec.step + 1
        val = self.ex.validator
        if val is not None and cfg.run.val_every and self.next_step % cfg.run.val_every == 0 \
                and self.next_step < cfg.run.steps:  # the last step's is the final validation, after the loop
            val.request(self.next_step)
        every = cfg.run.checkpoint_every
        if (every and self.next_step % every == 0) or self.next_step == cfg.run.steps:  # the last step always
            self.checkpoint(self.next_step)
        if self.stop.requested and self.stopped_at is None and self.next_step < cfg.run.steps:
            self.checkpoint_boundary()  # a signal: this boundary is where the run stops
            self.stopped_at = self.next_step

    def checkpoint(self, next_step: int) -> Path:
        """A checkpoint of boundary ``next_step`` (``checkpoints.write_checkpoint``)."""
        out = write_checkpoint(self.ckpt_root, next_step, self.ex, self.ex.job.store, self.cursor,
                               self.rewards_by_step, self.cfg.rollout.prompts_per_step, self.cfg.run.keep_checkpoints)
        self.checkpointed = next_step
        return out

    def checkpoint_boundary(self) -> None:
        """A checkpoint of the current boundary (``next_step``), unless this session already wrote it."""
        if self.checkpointed != self.next_step and self.next_step > self.start_step:
            self.checkpoint(self.next_step)

    def close(self) -> None:
        self.ledger.close()
