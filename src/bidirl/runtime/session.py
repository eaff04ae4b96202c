"""One real training run: workers, controller, runtime, metrics, checkpoints, outputs.

Resuming: a checkpoint is taken at a step boundary and holds the primary trainer (its
weights as a Hugging Face model directory ``model/``, its optimizer and version in
``trainer/``), the prompt cursor, and every group that was
created but not yet trained — complete ones with their responses, in-flight ones with
their partial prefixes (snapshotted from the replicas without aborting them).  A resumed
run starts a fresh controller whose group ids and versions are offset by the checkpoint's
step, so the scheduling state needs no serialisation, and the ledger of trained groups
and ``metrics.jsonl`` are cut back to the checkpoint: no group is lost, none is trained
twice, no step is reported twice.

The run's weights: when the run ends (finished or stopped), ``RUN_DIR/model/`` is the
newest checkpoint's model directory (hard links: no second copy); ``bidirl export RUN_DIR
[--step N] OUT`` copies any complete checkpoint's out.

Which checkpoint: the newest *usable* complete one (``run.keep_checkpoints`` are kept).
Usable means its ``state.json`` parses and names its own step, its model and trainer files
are whole (``config.json`` parses, the safetensors header matches the file's size,
``optimizer.pt`` is a whole zip) and the
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
import shutil
import statistics
import sys
import time
from pathlib import Path

from bidirl.controller.events import StageMeasured
from bidirl.obs.accounting import clip_intervals
from bidirl.runtime.checkpoint_integrity import checkpoint_writer
from bidirl.runtime.checkpoints import (  # noqa: F401  (re-exported for the tests)
    ResumeError,
    checkpoint_problem,
    complete_checkpoints,
    ledger_problem,
    read_jsonl,
    rewrite_jsonl,
    safetensors_problem,
    select_checkpoint,
)
from bidirl.runtime.config import TrainConfig
from bidirl.runtime.stops import StopSignals, nonfinite_step_error  # noqa: F401


def _decision_record(d) -> dict:
    """One borrow decision as JSON: when, which direction, how many units, the predicted
    benefit and cost, the doubt (margin) and the verdict."""
    return {"t": round(d.t, 4), "direction": d.direction, "units": d.units,
            "benefit_s": round(d.benefit_s, 5), "cost_s": round(d.cost_s, 5),
            "margin_s": round(d.margin_s, 5), "admit": d.admit, "guided": d.guided}


def _admission_summary(decisions: list) -> dict:
    """Counts of admitted / rejected borrows per direction, and the latest decisions."""
    from bidirl.frame.result import admission_counts

    return {"latest": [_decision_record(d) for d in decisions[-20:]], **admission_counts(decisions)}


def write_admissions(path: Path, decisions: list) -> None:
    """Every borrow decision of the run, one JSON line each, in decision order.
    ``summary.json`` keeps only the counts and the last 20; this is what answers "why did
    it not borrow here?" after the fact."""
    with path.open("w") as f:
        for d in decisions:
            f.write(json.dumps(_decision_record(d)) + "\n")


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
        self.placement = None  # runtime/placement.Placement: the node of each device, once placed
        self.train_devices: tuple[int, ...] = ()

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
            from bidirl.obs.samples_log import truncate_samples

            self._truncate_ledger(self.start_step)
            truncate_samples(self.run_dir, self.start_step)
            dropped = truncate_metrics(self.run_dir, self.start_step)
            if dropped:
                print(f"[bidirl] metrics.jsonl: dropped {dropped} record(s) of steps from {self.start_step} on "
                      "(they are trained again)", file=sys.stderr)
        self._chosen = ckpt, state
        return ckpt, state

    def run(self) -> dict:
        from bidirl.algo.data import PromptCursor
        from bidirl.algo.tiny_model import encode_prompt, load_tokenizer
        from bidirl.runtime.cluster import ray_session_started
        from bidirl.runtime.group_store import GroupStore
        from bidirl.runtime.placement import check_machine_fits
        from bidirl.runtime.train import (
            check_model_shape,
            fit_prompts,
            prepare_data,
            prepare_model,
            prepare_val_rows,
            response_cap,
        )

        check_machine_fits(self.cfg)  # before any data, model or Ray set-up
        check_model_shape(self.cfg)
        cfg = self.cfg
        ckpt, state = self.prepare_resume() if self.resume else (None, None)
        if self.resume and self.start_step >= cfg.run.steps:
            print(f"[bidirl] this run is finished ({cfg.run.steps} steps, checkpoint {ckpt}); nothing to train",
                  file=sys.stderr)
            return {**self._summary(0.0, None, []), "finished": True}
        rows, reward_fn = prepare_data(cfg)  # bad data fails before any slow set-up
        val_rows = prepare_val_rows(cfg)
        model_dir = prepare_model(cfg)
        # Ray starts while the tokenizer loads and the prompts are measured (RayStart); the
        # device workers start only once the data has passed (fit_prompts), as before.
        with ray_session_started(cfg.cluster.ray_address,
                                 num_cpus=cfg.cluster.rollout_devices + cfg.cluster.train_devices,
                                 log_level=cfg.run.worker_log_level) as ray_start:
            tok = load_tokenizer(model_dir)
            rows, self.prompt_lengths = fit_prompts(cfg, rows, tok, model_dir, val_rows)  # before any worker
            self.val_set = None
            if self.prompt_lengths.val_rows:
                from bidirl.runtime.validation import ValSet

                kept = list(self.prompt_lengths.val_rows)
                self.val_set = ValSet(kept, [encode_prompt(tok, r.messages) for r in kept],
                                      cfg.rollout.max_new_tokens, cfg.rollout.val_temperature, cfg.run.seed)
            cursor = PromptCursor(rows, seed=cfg.data.seed)
            store = GroupStore(cfg.rollout.group_size, cfg.rollout.max_new_tokens, cfg.rollout.temperature,
                               cfg.run.seed, cap_for=response_cap(cfg), reproducible=cfg.scheduler.reproducible)
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

            self._decode_prompt = lambda ids: tok.decode(ids, skip_special_tokens=False)

            self._cursor, self._store = cursor, store
            ray_start.ready()
            self.stop.install()  # once Ray is up, as before (ray.init on the main thread sets its own handler)
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
        from bidirl.runtime.placement import PREWARM_SYNC, WARM_UP, build_spec, place, start_workers

        cfg = self.cfg
        mean_prompt = self.prompt_lengths.mean  # measured over every row (train.fit_prompts)
        placement = place(cfg)  # which node each device lives on (one node: all of them)
        spec = build_spec(cfg, remaining, mean_prompt, placement.per_node)
        if cfg.scheduler.reproducible:
            import dataclasses

            spec = dataclasses.replace(spec, reproducible=True)
        rollout_kwargs = dict(model_dir=model_dir, max_num_seqs=cfg.rollout.max_num_seqs,
                              max_model_len=self.prompt_lengths.max_model_len,
                              dtype=cfg.model.dtype, kv_cache_bytes=cfg.rollout.kv_cache_mb << 20,
                              top_p=cfg.rollout.top_p, top_k=cfg.rollout.top_k,
                              min_tokens=cfg.rollout.min_new_tokens, reproducible=cfg.scheduler.reproducible)
        from bidirl.engines.trainer_config import NonFiniteStepError, trainer_wire

        trainer_config = trainer_wire(cfg.trainer, device=cfg.cluster.device, seed=cfg.run.seed,
                                      steps=cfg.run.steps)
        t_boot = time.perf_counter()
        workers, unit_device, train_devices, switch_measurements, new_worker = start_workers(
            cfg, spec, rollout_kwargs, model_dir, trainer_config, ckpt, placement)
        where = "" if not placement.spans_nodes else f" on {len(set(placement.device_node))} nodes " + ", ".join(
            f"{x.ip}: devices {placement.devices_on(x.index)}"
            for x in placement.nodes if x.index in placement.device_node)
        warm_up = [s for kind, s, _ in switch_measurements if kind == WARM_UP]
        warmed = f"; trainers warmed up in {max(warm_up):.1f} s" if warm_up else ""
        print(f"[bidirl] {len(workers)} device workers up in {time.perf_counter() - t_boot:.1f} s{where} "
              f"(policy {cfg.scheduler.policy}, staleness {cfg.scheduler.staleness}{warmed})", file=sys.stderr)
        controller = Controller(spec, make_policy(cfg.scheduler.policy))
        self.placement = placement
        self.train_devices = tuple(train_devices)  # the primary trainer's: a lost node names them
        unit_of = {unit_device(u): u for u in range(spec.n_units)}
        sync_warm = [s for kind, s, _ in switch_measurements if kind == PREWARM_SYNC]
        switch_measurements = [m for m in switch_measurements if m[0] not in (PREWARM_SYNC, WARM_UP)]
        controller.state.est.learn_start_up([(k, unit_of[d], s) for k, s, d in switch_measurements], sync_warm)
        backend = RayBackend(workers, new_worker)
        if self.wrap_backend is not None:
            backend = self.wrap_backend(backend, spec)
        job = Job(store, new_group, reward_fn, decode, rollout_kwargs,
                  trainer_kwargs={"model_dir": model_dir, "config": trainer_config},
                  group_offset=self.start_step * cfg.rollout.prompts_per_step, version_offset=self.start_step)
        rt = DeviceExecutor(controller, backend, job, Layout(unit_device, train_devices))
        rt.switches.extend((f"prewarm.{k}", v) for k, v, _ in switch_measurements)
        # The weight load timed on the replicas at start-up (learned above, unscored) is kept
        # in the profile: the sync model's first measurement.
        rt.profile.extend((0.0, StageMeasured("weight_sync", (1.0,), s)) for s in sync_warm)
        controller.bind(rt)
        from bidirl.runtime.reporting import StepReporter

        reporter = StepReporter(self, rt, cfg)
        reporter.decode_prompt = self._decode_prompt
        rt.on_step = reporter.on_step
        if cfg.scheduler.reproducible:  # keep each version's weights for replicas that missed a sync
            rt.on_step = rt.rollout.remembering(rt.on_step)
        if self.val_set is not None:
            from bidirl.runtime.validation import Validator, score_validation

            vs = self.val_set
            rt.validator = Validator(rt, vs, lambda out: score_validation(vs, out, reward_fn, decode,
                                                                          self._decode_prompt, cfg.run.val_samples),
                                     reporter.on_validation)
            every = cfg.run.val_every
            if cfg.run.val_before_train or (self.start_step and every and self.start_step % every == 0):
                rt.validator.request(self.start_step)  # the initial (or the checkpoint's) weights
        if self.stop.requested:  # a signal during the start-up: stop at the first boundary, this one
            self.stopped_at = self.start_step
        failed = None
        loop = None  # (time, per-pool tally) when the training loop ended: what the figures count
        try:
            rt.run(should_stop=lambda: self.stopped_at is not None or self.stop.abandon)
            loop_end = rt.now()
            loop = (loop_end, rt.clock.tally_at(loop_end))  # one instant for the wall and the tally
            if rt.validator is not None and controller.finished and cfg.run.val_every:
                rt.validator.final(cfg.run.steps)  # the final weights, before the outputs are written
        except Exception as e:
            failed = nonfinite_step_error(e)
            if failed is None:
                lost = self._node_lost(e)
                if lost is not None:
                    raise lost from None
                raise
        finally:
            wall = rt.now()
            intervals = rt.finish()
            reporter.close()
        finished = controller.finished
        if failed is not None:  # the weights are the last good ones; the step's groups are in the store
            self.checkpoint_boundary(rt)
        # The final validation runs after the last step: it is not training, so throughput,
        # idle ratios and the packing bound are the loop's; its seconds are reported apart.
        loop_wall, loop_tally = loop if loop is not None else (wall, None)
        summary = self._summary(loop_wall, rt, clip_intervals(intervals, loop_wall),
                                upto=None if finished else self.boundary, tally=loop_tally)
        summary["final_validation_s"] = round(wall - loop_wall, 3)
        summary["model_dir"] = self.publish_model()
        if not finished:
            summary["stopped"] = self._stop_record(failed)
        reporter.finish(summary, intervals, final_step=cfg.run.steps if finished else self.boundary)
        write_admissions(self.run_dir / "admissions.jsonl", controller.state.admissions)
        from bidirl.runtime import calibrated_scenario  # RUN_DIR/scenario.yaml: this run, for the simulator

        calibrated_scenario.write(self.run_dir, cfg, rt, intervals, wall=loop_wall)
        del ray
        if failed is not None:
            what = " ".join(str(failed).split()).split(": no weight")[0]
            raise NonFiniteStepError(f"{what}: no weight was changed; checkpoint of step {self.boundary} written; "
                                     f"resume with: bidirl train --resume {self.run_dir} trainer.on_nonfinite=skip "
                                     "(or without the override, to stop at such a step again)")
        return summary

    def _node_lost(self, e: Exception):
        """A ``NodeLost`` saying which node went, what died with it and where to resume, if
        ``e`` came from a node of the run's cluster that is gone (None otherwise)."""
        from bidirl.runtime.placement import NodeLost

        p = self.placement
        if isinstance(e, NodeLost):
            return e
        if p is None or not p.spans_nodes:
            return None
        import ray

        alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
        gone = [x for x in p.nodes if x.index in p.device_node and (x.node_id not in alive or not x.answers())]
        if not gone:
            return None
        done = complete_checkpoints(self.ckpt_root)
        where = f"checkpoint {done[-1].name}" if done else "step 0 (no checkpoint yet)"
        nodes = ", ".join(f"{x.ip} (devices {p.devices_on(x.index)})" for x in gone)
        return NodeLost(f"node {nodes} is gone, {self._lost_with(gone)} ({' '.join(str(e).split())}); resume "
                        f"from {where} with: bidirl train --resume {self.run_dir} (on the nodes left; without "
                        "--ray-address: this machine)")

    def _lost_with(self, gone) -> str:
        """What went with the ``gone`` nodes, by role: the exception that surfaced first may
        be any call's (e.g. a replica's whose input lived there), not the trainer's own."""
        lost = sorted(d for x in gone for d in self.placement.devices_on(x.index))
        trainer = [d for d in lost if d in self.train_devices]
        rollout = [d for d in lost if d not in self.train_devices]
        parts = ([f"the primary trainer's devices {trainer}"] if trainer else []) + (
            [f"rollout devices {rollout}"] if rollout else [])
        return "and with it " + " and ".join(parts)

    def publish_model(self) -> str | None:
        """``RUN_DIR/model/``: the newest checkpoint's Hugging Face model directory."""
        from bidirl.runtime.checkpoints import publish_model

        src = publish_model(self.run_dir)
        if src is None:
            return None
        print(f"[bidirl] model directory: {self.run_dir / 'model'} (checkpoint {src.parent.name}); "
              "load it with AutoModelForCausalLM.from_pretrained or vllm.LLM", file=sys.stderr)
        return str(self.run_dir / "model")

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

    def _summary(self, wall: float, rt, intervals, upto: int | None = None, tally=None) -> dict:
        """``RunResult``'s names (what ``bidirl simulate`` writes), plus what training adds.

        A run stopped early is audited over the steps it applied (``upto``)."""
        from bidirl.obs.accounting import idle_ratios

        audit = self.audit(upto)
        rewards = [self.rewards_by_step[k] for k in sorted(self.rewards_by_step)]
        result = run_result(self.cfg, wall, rt, intervals, audit, tally).to_json() if rt else {
            "steps": self.cfg.run.steps, "wall_s": 0.0, "throughput_tokens_per_s": 0.0, "borrows": {}}
        return {
            **result, "wall_s": round(wall, 2),
            "reward_first": rewards[0] if rewards else None,
            "reward_last": statistics.mean(rewards[-3:]) if rewards else None,
            "reward_first_50": statistics.mean(rewards[:50]) if rewards else None,
            "reward_last_50": statistics.mean(rewards[-50:]) if rewards else None,
            "rewards": rewards,
            "groups_trained": audit["groups_trained"], "audit": audit, "audit_ok": audit["ok"],
            "idle_ratio": idle_ratios(intervals) if intervals else {},
            "switches": rt.switches if rt else [],
            "reclaim_waits": rt.reclaim_waits if rt else [],
            "lost_devices": rt.lost_devices if rt else [],
            "admission": _admission_summary(rt.controller.state.admissions) if rt else {},
            **(self._nodes_summary(rt) if rt else {}),
        }

    def _nodes_summary(self, rt) -> dict:
        """Where the devices were (node address per device) and the measured switch costs
        per node pair (``<kind>/n<src>-n<dst>``: the weights' node to the lent device's)."""
        p = self.placement
        nodes = {"devices_per_node": rt.spec.devices_per_node}
        if p is not None:
            nodes["device_nodes"] = [p.node_ip(d) for d in range(len(p.device_node))]
        return {"nodes": nodes, "switch_by_node_pair": rt.controller.state.est.switch.pair_medians()}

    # -- checkpoints ----------------------------------------------------------------------
    def checkpoint(self, next_step: int, rt) -> Path:
        """Snapshot trainer, cursor, buffered and in-flight groups at a step boundary.

        It is written to ``.step_<k>.partial/`` and renamed into place once whole, so a
        crash or a refused save (``NonFiniteWeightsError``) never leaves a ``step_<k>/``
        behind; the newest ``run.keep_checkpoints`` complete ones are kept.
        """
        with checkpoint_writer(self.ckpt_root, next_step) as tmp:  # manifest last, then renamed into place
            self._write_checkpoint(tmp, next_step, rt)
        out = self.ckpt_root / f"step_{next_step}"
        self.checkpointed = next_step
        for old in complete_checkpoints(self.ckpt_root)[:-self.cfg.run.keep_checkpoints]:
            shutil.rmtree(old, ignore_errors=True)
        return out

    def _write_checkpoint(self, out: Path, next_step: int, rt) -> None:
        rt.call_now(rt.layout.train_devices[0], "call", "train", "save", str(out))
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


def run_result(cfg: TrainConfig, wall: float, rt, intervals, audit: dict, tally=None):
    """A real run as a ``frame.result.RunResult``: the simulator's names and meanings.

    ``ideal_tokens_per_s`` packs the run's measured busy device-seconds onto every device
    with no bubble and no switch (busy work / devices = ideal wall time).
    """
    from bidirl.frame.result import RunResult, admission_counts, decision_figures, pool_figures
    pools = pool_figures(rt.clock.tally if tally is None else tally)
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
