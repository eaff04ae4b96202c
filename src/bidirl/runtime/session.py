"""One real training run: workers, controller, runtime, metrics, checkpoints, outputs.

Resuming: a checkpoint is taken at a step boundary and holds the primary trainer
(weights as safetensors, optimizer, version), the prompt cursor, and every group that was
created but not yet trained — complete ones with their responses, in-flight ones with
their partial prefixes (snapshotted from the replicas without aborting them).  A resumed
run starts a fresh controller whose group ids and versions are offset by the checkpoint's
step, so the scheduling state needs no serialisation, and the ledger of trained groups
and ``metrics.jsonl`` are cut back to the checkpoint: no group is lost, none is trained
twice, no step is reported twice.

Which checkpoint: the newest *usable* complete one (two are kept).  Usable means its
``state.json`` parses and names its own step, its trainer files are whole (the
safetensors header matches the file's size, ``optimizer.pt`` is a whole zip) and the
ledger holds every group of every step before it exactly once (a torn last line, what a
crash mid-write leaves, is dropped).  An unusable one is reported, its ``COMPLETE`` marker
renamed to ``DAMAGED`` (holding the reason) and the next older one is tried; complete
checkpoints none of which is usable are a one-line :class:`ResumeError`.

Stopping: SIGINT and SIGTERM (installed after Ray starts, in the driver only; Ray's own
SIGTERM handler is put back afterwards) ask the run to stop at the next step boundary:
the step in progress finishes, a checkpoint of that boundary is written, then the
summary, the trace and the timeline, and ``bidirl train`` exits with status 128 + the
signal's number (130 for SIGINT, 143 for SIGTERM), the shell's convention for "ended by
this signal".  A second signal abandons the step in progress (the loop returns within a
wait of at most 5 s; no new checkpoint, ``--resume`` continues from the last one); a
third acts as it would have without bidirl (Ray's handler, or ``KeyboardInterrupt``).

A step whose loss or gradient norm is not finite under ``trainer.on_nonfinite=stop``
(``NonFiniteStepError``, maybe wrapped by Ray) ends the loop with the primary trainer's
weights and optimizer untouched and the failed step's groups still in the store, so the
same boundary checkpoint is written before the error is reported (exit status 2).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import struct
import sys
import threading
import time
import zipfile
from pathlib import Path

from bidirl.runtime.config import ConfigError, TrainConfig


class ResumeError(ConfigError):
    """``--resume`` cannot continue this run directory (reported in one line, exit 2)."""


def _admission_summary(decisions: list) -> dict:
    """Counts of admitted / rejected borrows per direction, and the latest decisions."""
    from bidirl.frame.result import admission_counts

    return {"latest": [{"direction": d.direction, "t": round(d.t, 3), "units": d.units,
                        "benefit_s": round(d.benefit_s, 4), "cost_s": round(d.cost_s, 4), "admit": d.admit}
                       for d in decisions[-20:]], **admission_counts(decisions)}


# -- graceful stops ---------------------------------------------------------------------------
class StopSignals:
    """SIGINT / SIGTERM while the loop runs: stop at the next step boundary; again: now.

    The handler only records the signal (and prints one line): the loop checks
    ``requested`` at each step boundary and ``abandon`` after each wait.  ``installed()``
    sets the handlers for its block and puts the previous ones back after it; outside the
    main thread (where Python allows no handler) it does nothing.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.signum: int | None = None
        self.count = 0
        self._previous: dict[int, object] = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def abandon(self) -> bool:
        return self.count >= 2

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else ""

    @property
    def exit_status(self) -> int:
        return 128 + int(self.signum or 0)

    def handle(self, signum: int, frame=None) -> None:
        self.count += 1
        if self.signum is None:
            self.signum = signum
        name = signal.Signals(signum).name
        if self.count == 1:
            print(f"\n[bidirl] {name}: stopping at the next step boundary (checkpoint, summary, trace); "
                  f"send it again to abandon the step in progress", file=sys.stderr, flush=True)
        elif self.count == 2:
            print(f"\n[bidirl] {name} again: abandoning the step in progress (no new checkpoint); "
                  "a third signal ends bidirl at once", file=sys.stderr, flush=True)
            self.restore()

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for s in self.SIGNALS:
            self._previous[s] = signal.getsignal(s)
            signal.signal(s, self.handle)

    def restore(self) -> None:
        for s, h in self._previous.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)
        self._previous.clear()


def nonfinite_step_error(e: BaseException):
    """The ``NonFiniteStepError`` that ``e`` is (or that Ray's ``RayTaskError`` wraps), or None."""
    from bidirl.engines.trainer_config import NonFiniteStepError

    cause = getattr(e, "cause", None)
    if isinstance(cause, NonFiniteStepError):
        return cause
    return e if isinstance(e, NonFiniteStepError) else None


# -- run-directory files: jsonl tolerant of a torn last line, checkpoint checks ---------------------
def read_jsonl(path: Path) -> tuple[list[dict], int]:
    """(records, torn): a JSON-lines file whose malformed *last* line (a crash mid-write) is
    dropped and counted; a malformed line before the last one raises ``ValueError``."""
    if not path.is_file():
        return [], 0
    lines = [ln for ln in path.read_text(encoding="utf-8", errors="replace").splitlines() if ln.strip()]
    records = []
    for i, ln in enumerate(lines, start=1):
        try:
            rec = json.loads(ln)
            if not isinstance(rec, dict):
                raise ValueError("not a JSON object")
        except ValueError as e:
            if i == len(lines):
                return records, 1
            raise ValueError(f"{path}: line {i} is corrupt ({e})") from None
        records.append(rec)
    return records, 0


def rewrite_jsonl(path: Path, records: list[dict]) -> None:
    """Replace ``path`` with ``records``, atomically (a crash leaves the old or the new file)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    os.replace(tmp, path)


def safetensors_problem(path: Path) -> str | None:
    """Why a safetensors file is not whole (header length, header, data size), or None."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n <= 0 or 8 + n > size:
                return f"{path.name}: truncated header"
            header = json.loads(f.read(n))
    except (OSError, struct.error, ValueError) as e:
        return f"{path.name}: unreadable ({e})"
    ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"]
    if 8 + n + max(ends, default=0) != size:
        return f"{path.name}: {size} bytes, its header describes {8 + n + max(ends, default=0)}"
    return None


def checkpoint_problem(ckpt: Path) -> tuple[str | None, dict | None]:
    """(why a complete checkpoint cannot be resumed from, or None; its parsed state)."""
    try:
        state = json.loads((ckpt / "state.json").read_text())
    except (OSError, ValueError) as e:
        return f"state.json: {'missing' if isinstance(e, OSError) else 'truncated or corrupt'}", None
    step = int(ckpt.name.split("_")[1])
    if not isinstance(state, dict) or state.get("next_step") != step or not {"cursor", "store"} <= set(state):
        return f"state.json does not describe step {step}", None
    trainer = ckpt / "trainer"
    for name in ("model.safetensors", "optimizer.pt", "trainer_state.json"):
        if not (trainer / name).is_file():
            return f"trainer/{name} missing", None
    bad = safetensors_problem(trainer / "model.safetensors")
    if bad:
        return f"trainer/{bad}", None
    if not zipfile.is_zipfile(trainer / "optimizer.pt"):
        return "trainer/optimizer.pt: truncated or corrupt", None
    try:
        json.loads((trainer / "trainer_state.json").read_text())["version"]
    except (OSError, ValueError, KeyError, TypeError):
        return "trainer/trainer_state.json: truncated or corrupt", None
    return None, state


def ledger_problem(records: list[dict], next_step: int, prompts_per_step: int) -> str | None:
    """Why the ledger's records before ``next_step`` are not every group of those steps once."""
    from collections import Counter

    try:
        counts = Counter(int(r["group"]) for r in records if int(r["step"]) < next_step)
    except (KeyError, TypeError, ValueError):
        return "trained_groups.jsonl: a record without group and step"
    expected = next_step * prompts_per_step
    missing = [g for g in range(expected) if counts[g] == 0]
    twice = [g for g, c in counts.items() if c > 1 or g >= expected]
    if missing or twice:
        return (f"trained_groups.jsonl holds {sum(counts.values())} records of steps < {next_step}, "
                f"expected groups 0..{expected - 1} once each ({len(missing)} missing, {len(twice)} extra)")
    return None


def complete_checkpoints(ckpt_root: Path) -> list[Path]:
    """``step_<k>`` directories with a ``COMPLETE`` marker, oldest first."""
    if not ckpt_root.is_dir():
        return []
    return sorted((p for p in ckpt_root.glob("step_*") if p.name[5:].isdigit() and (p / "COMPLETE").is_file()),
                  key=lambda p: int(p.name.split("_")[1]))


def select_checkpoint(ckpt_root: Path, ledger_path: Path, prompts_per_step: int,
                      mark_damaged: bool = True) -> tuple[Path | None, dict | None]:
    """(newest usable checkpoint, its state) as the module docstring describes, or
    (None, None) when there is no complete checkpoint; ``ResumeError`` when none is usable."""
    done = complete_checkpoints(ckpt_root)
    if not done:
        return None, None
    try:
        ledger, torn = read_jsonl(ledger_path)
        ledger_error = None
    except ValueError as e:
        ledger, torn, ledger_error = [], 0, str(e)
    if torn:
        print(f"[bidirl] {ledger_path.name}: dropping a torn last line", file=sys.stderr)
    unusable: list[tuple[Path, str]] = []
    for ckpt in reversed(done):
        why, state = checkpoint_problem(ckpt)
        if why is None:
            why = ledger_error or ledger_problem(ledger, state["next_step"], prompts_per_step)
        if why is None:
            for bad, reason in unusable if mark_damaged else ():
                (bad / "DAMAGED").write_text(reason + "\n")
                (bad / "COMPLETE").unlink(missing_ok=True)
            if unusable:
                print(f"[bidirl] falling back to {ckpt}, the newest usable checkpoint", file=sys.stderr)
            return ckpt, state
        unusable.append((ckpt, why))
        print(f"[bidirl] checkpoint {ckpt} is unusable: {why}", file=sys.stderr)
    reasons = [f"{c.name}: {why}" for c, why in unusable]
    raise ResumeError(f"--resume: no usable checkpoint in {ckpt_root} ({'; '.join(reasons)}); "
                      "start a new run, or repair the run directory")


class TrainSession:
    def __init__(self, cfg: TrainConfig, run_dir: Path, resume: bool = False, wrap_backend=None) -> None:
        """``wrap_backend(backend, spec) -> backend`` lets tests inject faults around the
        device backend; production runs leave it None."""
        self.cfg, self.run_dir, self.resume = cfg, Path(run_dir), resume
        self.wrap_backend = wrap_backend
        self.ckpt_root = self.run_dir / "checkpoints"
        self.start_step = 0
        self.rewards_by_step: dict[int, float] = {}
        self.stop = StopSignals()
        self.boundary = 0  # the step after the last one applied: where a checkpoint may be taken
        self.stopped_at: int | None = None  # a stop's boundary, once its checkpoint is written
        self.checkpointed: int | None = None  # the newest checkpoint this session wrote
        self._chosen: tuple[Path | None, dict | None] | None = None  # prepare_resume's answer

    # -- set-up ---------------------------------------------------------------------------
    def prepare_resume(self) -> tuple[Path | None, dict | None]:
        """Resume: the checkpoint to continue from; the ledger and metrics cut back to it.

        Called once (by ``run`` if not before).  A finished run (its checkpoint at
        ``run.steps``) is left as it is; ``run.steps`` below the checkpoint's step is a
        ``ResumeError``.
        """
        if self._chosen is not None:
            return self._chosen
        from bidirl.obs.metrics import truncate_metrics

        ckpt, state = select_checkpoint(self.ckpt_root, self.ledger_path, self.cfg.rollout.prompts_per_step)
        self.start_step = state["next_step"] if state else 0
        self.rewards_by_step = {int(k): v for k, v in (state or {}).get("rewards_by_step", {}).items()
                                if int(k) < self.start_step}
        steps = self.cfg.run.steps
        if self.start_step > steps:
            raise ResumeError(f"--resume: run.steps={steps} is below the checkpoint's step {self.start_step}; "
                              f"give run.steps={self.start_step} or more")
        if self.start_step < steps:
            self._truncate_ledger(self.start_step)
            dropped = truncate_metrics(self.run_dir, self.start_step)
            if dropped:
                print(f"[bidirl] metrics.jsonl: dropped {dropped} record(s) of steps from {self.start_step} on "
                      "(they are trained again)", file=sys.stderr)
        self._chosen = ckpt, state
        return ckpt, state

    def run(self) -> dict:
        from bidirl.algo.data import PromptCursor
        from bidirl.algo.tiny_model import encode_prompt, load_tokenizer
        from bidirl.runtime.cluster import ray_session
        from bidirl.runtime.group_store import GroupStore
        from bidirl.runtime.train import fit_prompts, prepare_data, prepare_model

        cfg = self.cfg
        ckpt, state = self.prepare_resume() if self.resume else (None, None)
        if self.resume and self.start_step >= cfg.run.steps:
            print(f"[bidirl] this run is finished ({cfg.run.steps} steps, checkpoint {ckpt}); nothing to train",
                  file=sys.stderr)
            return {**self._summary(0.0, None, []), "finished": True}
        rows, reward_fn = prepare_data(cfg)  # bad data fails before any slow set-up
        model_dir = prepare_model(cfg)
        tok = load_tokenizer(model_dir)
        rows, self.prompt_lengths = fit_prompts(cfg, rows, tok, model_dir)  # before Ray and any worker
        cursor = PromptCursor(rows, seed=cfg.data.seed)
        store = GroupStore(cfg.rollout.group_size, cfg.rollout.max_new_tokens, cfg.rollout.temperature,
                           cfg.run.seed)
        if state is not None:
            cursor.load_state_dict(state["cursor"])
            store.load_state_dict(state["store"])
            print(f"[bidirl] resuming from {ckpt} at step {self.start_step} "
                  f"({len(store.groups)} buffered or in-flight groups)", file=sys.stderr)
        elif self.resume:
            print("[bidirl] no complete checkpoint yet: starting from step 0", file=sys.stderr)
        self.boundary = self.start_step
        remaining = cfg.run.steps - self.start_step
        prompt_ids = {}

        def new_group(gid: int) -> None:
            item = cursor.next()
            key = item.index
            if key not in prompt_ids:
                prompt_ids[key] = encode_prompt(tok, item.row.messages)
            store.add(gid, item.uid, prompt_ids[key], item.row.data_source, item.row.ground_truth,
                      item.row.extra_info)

        def decode(ids):
            return tok.decode(ids, skip_special_tokens=True)

        self._cursor, self._store = cursor, store
        with ray_session(cfg.cluster.ray_address, num_cpus=cfg.cluster.rollout_devices + cfg.cluster.train_devices):
            self.stop.install()  # after ray.init, which sets its own SIGTERM handler
            try:
                return self._run_cluster(model_dir, ckpt, remaining, store, new_group, reward_fn, decode)
            finally:
                self.stop.restore()

    def _run_cluster(self, model_dir, ckpt, remaining, store, new_group, reward_fn, decode) -> dict:
        import ray

        from bidirl.controller.loop import Controller
        from bidirl.policy.base import make_policy
        from bidirl.runtime.backend import RayBackend
        from bidirl.runtime.executor import DeviceExecutor, Job, Layout
        from bidirl.runtime.placement import build_spec, start_workers

        cfg = self.cfg
        mean_prompt = self.prompt_lengths.mean  # measured over every row (train.fit_prompts)
        spec = build_spec(cfg, remaining, mean_prompt)
        rollout_kwargs = dict(model_dir=model_dir, max_num_seqs=cfg.rollout.max_num_seqs,
                              max_model_len=self.prompt_lengths.max_model_len,
                              dtype=cfg.model.dtype, kv_cache_bytes=cfg.rollout.kv_cache_mb << 20)
        from bidirl.engines.trainer_config import NonFiniteStepError, trainer_wire

        trainer_config = trainer_wire(cfg.trainer, device=cfg.cluster.device, seed=cfg.run.seed)
        t_boot = time.perf_counter()
        workers, unit_device, train_devices, switch_measurements, new_worker = start_workers(
            cfg, spec, rollout_kwargs, model_dir, trainer_config, ckpt / "trainer" if ckpt else None)
        print(f"[bidirl] {len(workers)} device workers up in {time.perf_counter() - t_boot:.1f} s "
              f"(policy {cfg.scheduler.policy}, staleness {cfg.scheduler.staleness})", file=sys.stderr)
        controller = Controller(spec, make_policy(cfg.scheduler.policy))
        for kind, seconds in switch_measurements:
            controller.state.est.observe(kind, (), seconds)
        backend = RayBackend(workers, new_worker)
        if self.wrap_backend is not None:
            backend = self.wrap_backend(backend, spec)
        job = Job(store, new_group, reward_fn, decode, rollout_kwargs,
                  trainer_kwargs={"model_dir": model_dir, "config": trainer_config},
                  group_offset=self.start_step * cfg.rollout.prompts_per_step, version_offset=self.start_step)
        rt = DeviceExecutor(controller, backend, job, Layout(unit_device, train_devices))
        rt.switches.extend((f"prewarm.{k}", v) for k, v in switch_measurements)
        controller.bind(rt)
        from bidirl.runtime.reporting import StepReporter

        reporter = StepReporter(self, rt, cfg)
        rt.on_step = reporter.on_step
        if self.stop.requested:  # a signal during the start-up: stop at the first boundary, this one
            self.stopped_at = self.start_step
        failed = None
        try:
            rt.run(should_stop=lambda: self.stopped_at is not None or self.stop.abandon)
        except Exception as e:
            failed = nonfinite_step_error(e)
            if failed is None:
                raise
        finally:
            wall = rt.now()
            intervals = rt.finish()
            reporter.close()
        finished = controller.finished
        if failed is not None:  # the weights are the last good ones; the step's groups are in the store
            self.checkpoint_boundary(rt)
        summary = self._summary(wall, rt, intervals, upto=None if finished else self.boundary)
        if not finished:
            summary["stopped"] = self._stop_record(failed)
        reporter.finish(summary, intervals, final_step=cfg.run.steps if finished else self.boundary)
        del ray
        if failed is not None:
            what = " ".join(str(failed).split()).split(": no weight")[0]
            raise NonFiniteStepError(f"{what}: no weight was changed; checkpoint of step {self.boundary} written; "
                                     f"resume with: bidirl train --resume {self.run_dir} trainer.on_nonfinite=skip "
                                     "(or without the override, to stop at such a step again)")
        return summary

    def checkpoint_boundary(self, rt) -> None:
        """A checkpoint of ``self.boundary``, unless this session already wrote it."""
        if self.checkpointed != self.boundary and self.boundary > self.start_step:
            self.checkpoint(self.boundary, rt)

    def _stop_record(self, failed) -> dict:
        """What ended the run early: the signal or the non-finite step, and where to resume."""
        done = complete_checkpoints(self.ckpt_root)
        resume_step = int(done[-1].name.split("_")[1]) if done else 0
        why = "nonfinite_step" if failed is not None else self.stop.name
        return {"by": why, "at_step": self.boundary, "resume_step": resume_step,
                "abandoned": failed is None and self.stopped_at is None, "exit_status": self.exit_status(failed)}

    def exit_status(self, failed=None) -> int:
        return 2 if failed is not None else self.stop.exit_status

    # -- ledger and summary ---------------------------------------------------------------
    @property
    def ledger_path(self) -> Path:
        return self.run_dir / "trained_groups.jsonl"

    def _truncate_ledger(self, next_step: int) -> None:
        """Keep the records of steps before ``next_step`` (a torn last line is dropped)."""
        if not self.ledger_path.is_file():
            return
        records = read_jsonl(self.ledger_path)[0] if next_step > 0 else []
        rewrite_jsonl(self.ledger_path, [r for r in records if r["step"] < next_step])

    def audit(self, upto: int | None = None) -> dict:
        """Every group of every step (before ``upto``, default ``run.steps``) trained exactly
        once; staleness within the bound.

        Read from ``trained_groups.jsonl``, which spans resumes, and checked by the one
        ledger audit (``core.ledger.audit_trained``) the controller's ledger uses too.
        """
        from collections import Counter

        from bidirl.core.ledger import audit_trained

        cfg = self.cfg
        counts, staleness = Counter(), {}
        for rec in read_jsonl(self.ledger_path)[0]:
            counts[rec["group"]] += 1
            staleness[rec["group"]] = max(staleness.get(rec["group"], 0), rec["staleness"])
        steps = cfg.run.steps if upto is None else upto
        expected = range(steps * cfg.rollout.prompts_per_step)
        a = audit_trained(expected, counts, staleness, cfg.scheduler.staleness)
        return {"groups_expected": a.groups_total, "groups_trained": a.groups_trained,
                "groups_lost": len(a.groups_lost), "trained_twice": len(a.trained_twice),
                "max_staleness": a.max_staleness, "mean_staleness": round(a.mean_staleness, 4),
                "staleness_ok": not a.staleness_violations, "ok": a.ok}

    def _summary(self, wall: float, rt, intervals, upto: int | None = None) -> dict:
        """``RunResult``'s names (what ``bidirl simulate`` writes), plus what training adds.

        A run stopped early is audited over the steps it applied (``upto``)."""
        from bidirl.obs.accounting import idle_ratios

        audit = self.audit(upto)
        rewards = [self.rewards_by_step[k] for k in sorted(self.rewards_by_step)]
        result = run_result(self.cfg, wall, rt, intervals, audit).to_json() if rt else {
            "steps": self.cfg.run.steps, "wall_s": 0.0, "throughput_tokens_per_s": 0.0, "borrows": {}}
        return {
            **result, "wall_s": round(wall, 2),
            "reward_first": rewards[0] if rewards else None,
            "reward_last": statistics.mean(rewards[-3:]) if rewards else None,
            "rewards": rewards,
            "groups_trained": audit["groups_trained"], "audit": audit, "audit_ok": audit["ok"],
            "idle_ratio": idle_ratios(intervals) if intervals else {},
            "switches": rt.switches if rt else [],
            "reclaim_waits": rt.reclaim_waits if rt else [],
            "lost_devices": rt.lost_devices if rt else [],
            "admission": _admission_summary(rt.controller.state.admissions) if rt else {},
        }

    # -- checkpoints ----------------------------------------------------------------------
    def checkpoint(self, next_step: int, rt) -> Path:
        """Snapshot trainer, cursor, buffered and in-flight groups at a step boundary.

        Whatever stops it (a refused save: ``NonFiniteWeightsError``) removes the partial
        ``step_<k>/``, so only whole checkpoints are ever on disk under that name.
        """
        out = self.ckpt_root / f"step_{next_step}"
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        try:
            self._write_checkpoint(out, next_step, rt)
        except BaseException:
            shutil.rmtree(out, ignore_errors=True)
            raise
        self.checkpointed = next_step
        for old in complete_checkpoints(self.ckpt_root)[:-2]:  # keep the newest two complete ones
            shutil.rmtree(old, ignore_errors=True)
        return out

    def _write_checkpoint(self, out: Path, next_step: int, rt) -> None:
        rt.call_now(rt.layout.train_devices[0], "call", "train", "save", str(out / "trainer"))
        partials = []
        for u in rt.rollout.serving():
            partials += rt.call_now(rt.unit_device(u), "call", "rollout", "snapshot")
        store = self._store
        offset = next_step * self.cfg.rollout.prompts_per_step
        state = store.state_dict()
        state["groups"] = [g for g in state["groups"] if g["group_id"] >= offset]
        by_gid = {g["group_id"]: g for g in state["groups"]}
        from dataclasses import asdict

        for p in partials:
            g = by_gid.get(p.group_id)
            if g is not None and all(r["index"] != p.index for r in g["done"]):
                g["partial"] = [r for r in g["partial"] if r["index"] != p.index] + [asdict(p)]
        payload = {"next_step": next_step, "cursor": self._cursor.state_dict(), "store": state,
                   "rewards_by_step": {k: v for k, v in self.rewards_by_step.items() if k < next_step}}
        (out / "state.json").write_text(json.dumps(payload))
        (out / "COMPLETE").write_text(time.strftime("%Y-%m-%dT%H:%M:%S"))


def run_result(cfg: TrainConfig, wall: float, rt, intervals, audit: dict):
    """A real run as a ``frame.result.RunResult``: the simulator's names and meanings.

    ``ideal_tokens_per_s`` packs the run's measured busy device-seconds onto every device
    with no bubble and no switch (busy work / devices = ideal wall time).
    """
    from bidirl.frame.result import RunResult, admission_counts, decision_figures, pool_figures
    pools = pool_figures(rt.clock.tally)
    steps = [rt.steps[k] for k in sorted(rt.steps)]
    tokens = sum(r.total_tokens for r in steps)
    busy = sum(v["busy"] for v in pools["pool_seconds"].values())
    devices = len(rt.layout.pools)
    ideal = tokens / (busy / devices) if busy > 0 else 0.0
    throughput = tokens / wall if wall > 0 else 0.0
    ends = [0.0] + [r.finished_s for r in steps]
    lends = rt.hosting.lends
    return RunResult(
        policy=cfg.scheduler.policy, scenario="train", steps=len(steps), wall_s=wall, tokens_trained=tokens,
        throughput_tokens_per_s=round(throughput, 1), mean_step_time_s=wall / max(1, len(steps)),
        pool_busy_fraction=pools["pool_busy_fraction"], switch_time_s=pools["switch_time_s"],
        borrows={"roll_on_train": lends["roll_on_train"], "train_on_roll": lends["train_on_roll"]},
        ideal_tokens_per_s=ideal, efficiency=throughput / ideal if ideal else 0.0,
        staleness={"mean": audit["mean_staleness"], "max": float(audit["max_staleness"])},
        groups_trained=audit["groups_trained"], groups_lost=audit["groups_lost"] + audit["trained_twice"],
        trace_sha256=rt.clock.stream_sha256(), devices=devices, seed=cfg.run.seed,
        step_times_s=[b - a for a, b in zip(ends, ends[1:])],
        stage_model_median_error=rt.controller.state.est.median_errors(),
        admission=admission_counts(rt.controller.state.admissions),
        extra={**decision_figures(rt.controller), "pool_seconds": pools["pool_seconds"],
               "colocated_switches": lends["colocated"], "ledger_ok": audit["ok"]})
