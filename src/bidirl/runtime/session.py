"""One real training run: workers, controller, runtime, metrics, checkpoints, outputs.

Resuming: a checkpoint is taken at a step boundary and holds the primary trainer
(weights as safetensors, optimizer, version), the prompt cursor, and every group that was
created but not yet trained — complete ones with their responses, in-flight ones with
their partial prefixes (snapshotted from the replicas without aborting them).  A resumed
run starts a fresh controller whose group ids and versions are offset by the checkpoint's
step, so the scheduling state needs no serialisation, and the ledger of trained groups is
cut back to the checkpoint: no group is lost, none is trained twice.
"""

from __future__ import annotations

import json
import shutil
import statistics
import sys
import time
from pathlib import Path

from bidirl.runtime.config import TrainConfig


def _admission_summary(decisions: list) -> dict:
    """Counts of admitted / rejected borrows per direction, and the latest decisions."""
    from bidirl.frame.result import admission_counts

    return {"latest": [{"direction": d.direction, "t": round(d.t, 3), "units": d.units,
                        "benefit_s": round(d.benefit_s, 4), "cost_s": round(d.cost_s, 4), "admit": d.admit}
                       for d in decisions[-20:]], **admission_counts(decisions)}


class TrainSession:
    def __init__(self, cfg: TrainConfig, run_dir: Path, resume: bool = False, wrap_backend=None) -> None:
        """``wrap_backend(backend, spec) -> backend`` lets tests inject faults around the
        device backend; production runs leave it None."""
        self.cfg, self.run_dir, self.resume = cfg, Path(run_dir), resume
        self.wrap_backend = wrap_backend
        self.ckpt_root = self.run_dir / "checkpoints"
        self.start_step = 0
        self.rewards_by_step: dict[int, float] = {}

    # -- set-up ---------------------------------------------------------------------------
    def _latest_checkpoint(self) -> Path | None:
        if not self.ckpt_root.is_dir():
            return None
        done = sorted((p for p in self.ckpt_root.glob("step_*") if (p / "COMPLETE").is_file()),
                      key=lambda p: int(p.name.split("_")[1]))
        return done[-1] if done else None

    def run(self) -> dict:
        from bidirl.algo.data import PromptCursor
        from bidirl.algo.tiny_model import encode_prompt, load_tokenizer
        from bidirl.runtime.cluster import ray_session
        from bidirl.runtime.group_store import GroupStore
        from bidirl.runtime.train import fit_prompts, prepare_data, prepare_model

        cfg = self.cfg
        rows, reward_fn = prepare_data(cfg)  # bad data fails before any slow set-up
        model_dir = prepare_model(cfg)
        tok = load_tokenizer(model_dir)
        rows, self.prompt_lengths = fit_prompts(cfg, rows, tok, model_dir)  # before Ray and any worker
        cursor = PromptCursor(rows, seed=cfg.data.seed)
        store = GroupStore(cfg.rollout.group_size, cfg.rollout.max_new_tokens, cfg.rollout.temperature,
                           cfg.run.seed)
        ckpt = self._latest_checkpoint() if self.resume else None
        if ckpt is not None:
            state = json.loads((ckpt / "state.json").read_text())
            cursor.load_state_dict(state["cursor"])
            store.load_state_dict(state["store"])
            self.start_step = state["next_step"]
            self.rewards_by_step = {int(k): v for k, v in state.get("rewards_by_step", {}).items()}
            self._truncate_ledger(self.start_step)
            print(f"[bidirl] resuming from {ckpt} at step {self.start_step} "
                  f"({len(store.groups)} buffered or in-flight groups)", file=sys.stderr)
        elif self.resume:
            print("[bidirl] no complete checkpoint yet: starting from step 0", file=sys.stderr)
            self._truncate_ledger(0)
        remaining = cfg.run.steps - self.start_step
        if remaining <= 0:
            print(f"[bidirl] this run is finished ({cfg.run.steps} steps); nothing to train", file=sys.stderr)
            return self._summary(0.0, None, [])
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
            return self._run_cluster(model_dir, ckpt, remaining, store, new_group, reward_fn, decode)

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
        from bidirl.engines.trainer_config import trainer_wire

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
        try:
            rt.run()
        finally:
            wall = rt.now()
            intervals = rt.finish()
            reporter.close()
        summary = self._summary(wall, rt, intervals)
        reporter.finish(summary, intervals)
        del ray
        return summary

    # -- ledger and summary ---------------------------------------------------------------
    @property
    def ledger_path(self) -> Path:
        return self.run_dir / "trained_groups.jsonl"

    def _truncate_ledger(self, next_step: int) -> None:
        if not self.ledger_path.is_file():
            return
        keep = [ln for ln in self.ledger_path.read_text().splitlines()
                if ln.strip() and json.loads(ln)["step"] < next_step]
        self.ledger_path.write_text("".join(k + "\n" for k in keep))

    def audit(self) -> dict:
        """Every group of every step trained exactly once; staleness within the bound.

        Read from ``trained_groups.jsonl``, which spans resumes, and checked by the one
        ledger audit (``core.ledger.audit_trained``) the controller's ledger uses too.
        """
        from collections import Counter

        from bidirl.core.ledger import audit_trained

        cfg = self.cfg
        counts, staleness = Counter(), {}
        if self.ledger_path.is_file():
            for ln in self.ledger_path.read_text().splitlines():
                rec = json.loads(ln)
                counts[rec["group"]] += 1
                staleness[rec["group"]] = max(staleness.get(rec["group"], 0), rec["staleness"])
        expected = range(cfg.run.steps * cfg.rollout.prompts_per_step)
        a = audit_trained(expected, counts, staleness, cfg.scheduler.staleness)
        return {"groups_expected": a.groups_total, "groups_trained": a.groups_trained,
                "groups_lost": len(a.groups_lost), "trained_twice": len(a.trained_twice),
                "max_staleness": a.max_staleness, "mean_staleness": round(a.mean_staleness, 4),
                "staleness_ok": not a.staleness_violations, "ok": a.ok}

    def _summary(self, wall: float, rt, intervals) -> dict:
        """``RunResult``'s names (what ``bidirl simulate`` writes), plus what training adds."""
        from bidirl.obs.accounting import idle_ratios

        audit = self.audit()
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
        """Snapshot trainer, cursor, buffered and in-flight groups at a step boundary."""
        out = self.ckpt_root / f"step_{next_step}"
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
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
                   "rewards_by_step": self.rewards_by_step}
        (out / "state.json").write_text(json.dumps(payload))
        (out / "COMPLETE").write_text(time.strftime("%Y-%m-%dT%H:%M:%S"))
        done = sorted((p for p in self.ckpt_root.glob("step_*") if (p / "COMPLETE").is_file()),
                      key=lambda p: int(p.name.split("_")[1]))
        for old in done[:-2]:  # keep the newest two complete ones
            shutil.rmtree(old, ignore_errors=True)
        return out


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
