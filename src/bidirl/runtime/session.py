"""One real training run's lifecycle: resume, start, run, stop.

What the session does, in order: pick the checkpoint to resume from (``prepare_resume``) ->
check the model and the data, build the model (``prepare.py``) -> start Ray while the
tokenizer loads and the prompts are measured -> start the device workers and the executor
(``launch.py``) -> run the controller until the last step, each step's end handled by the
step boundary (``boundary.py``: ledger, metrics, validation, checkpoints, a stop) -> the
outputs (``reporting.py``, ``run_summary.py``: summary, trace, timeline, admissions; the
calibrated scenario; ``RUN_DIR/model/``).

Resuming: a checkpoint is taken at a step boundary and holds the primary trainer (its
weights as a Hugging Face model directory ``model/``, its optimizer and version in
``trainer/``), the prompt cursor, and every group that was
created but not yet trained — complete ones with their responses, in-flight ones with
their partial prefixes (snapshotted from the replicas without aborting them).  A resumed
run starts a fresh controller whose group ids and versions are offset by the checkpoint's
step (group ids: the checkpoint's groups first, then its next group id on,
``group_ids.GroupIds``), so the scheduling state needs no serialisation, and the ledger of trained groups
and ``metrics.jsonl`` are cut back to the checkpoint: no group is lost, none is trained
twice, no step is reported twice.

The run's weights: when the run ends (finished or stopped), ``RUN_DIR/model/`` is the
newest checkpoint's model directory (hard links: no second copy); ``bidirl export RUN_DIR
[--step N] OUT`` copies any complete checkpoint's out.

Which checkpoint (``checkpoints.select_checkpoint``): the newest *usable* complete one
(``run.keep_checkpoints`` are kept).  Usable means its ``state.json`` parses and names its
own step, its model and trainer files are whole (``config.json`` parses, the safetensors
header matches the file's size, ``optimizer.pt`` is a whole zip), every file matches the
size and sha256 its ``MANIFEST.json`` records, every weight is finite
(``checkpoint_integrity.py``) and the ledger holds every group of every step before it
exactly once (a torn last line, what a crash mid-write leaves, is dropped).  An unusable
one is reported, its ``COMPLETE`` marker replaced by ``DAMAGED`` (holding the reason) and
the next older one is tried; complete checkpoints none of which is usable are a one-line
:class:`ResumeError`.

Stopping: SIGINT and SIGTERM once Ray is up (``stops.StopSignals``, in the driver only) ask
the run to stop at the next step boundary: the step in progress finishes, a checkpoint of
that boundary is written, then the summary, the trace and the timeline, and ``bidirl train``
exits with status 128 + the signal's number (130 for SIGINT, 143 for SIGTERM), the shell's
convention for "ended by this signal".  A second signal abandons the step in progress (the
loop returns within a wait of at most 5 s; no new checkpoint, ``--resume`` continues from
the last one); a third meets the driver's start-up handler again (``exits.DriverSignals``):
the run unwinds at once through the Ray session, which stops Ray and removes its temporary
files, with one line and the resume command.  A signal before Ray is up (data, model,
tokenizer, Ray starting) unwinds the same way; one while the workers start stops the run at
its first boundary, before any step.

A step whose loss or gradient norm is not finite under ``trainer.on_nonfinite=stop``
(``NonFiniteStepError``, maybe wrapped by Ray) ends the loop with the primary trainer's
weights and optimizer untouched and the failed step's groups still in the store, so the
same boundary checkpoint is written before the error is reported (exit status 2).  A step
that needs more groups than ``algorithm.filter_groups.max_num_gen_batches`` allows
(``GenerationCapError``, from the controller) stops the same way, with one line naming the
option and the keep rate seen.
"""

from __future__ import annotations

import sys
from pathlib import Path

from bidirl.algo.data import PromptCursor
from bidirl.controller.queue import GenerationCapError
from bidirl.engines.hf_io import is_vision_language
from bidirl.engines.trainer_config import NonFiniteStepError
from bidirl.obs.accounting import clip_intervals
from bidirl.obs.metrics import truncate_metrics
from bidirl.obs.samples_log import truncate_samples
from bidirl.policy import make_policy
from bidirl.runtime import calibrated_scenario
from bidirl.runtime.boundary import StepBoundary
from bidirl.runtime.checkpoints import ResumeError, complete_checkpoints, publish_model, select_checkpoint
from bidirl.runtime.cluster import ray_session_started
from bidirl.runtime.config import TrainConfig
from bidirl.runtime.executor import Job
from bidirl.runtime.group_ids import GroupIds
from bidirl.runtime.group_store import GroupStore
from bidirl.runtime.launch import node_lost, start_executor, worker_settings
from bidirl.runtime.model_check import check_lora_targets
from bidirl.runtime.placement import check_machine_fits, place
from bidirl.runtime.prepare import (
    PromptLengths,
    check_model_shape,
    fit_prompts,
    prepare_data,
    prepare_model,
    prepare_val_rows,
    response_cap,
)
from bidirl.runtime.prompt_stream import PromptStream, load_prompt_encoder, val_set
from bidirl.runtime.reporting import StepReporter
from bidirl.runtime.run_dir import LEDGER, truncate_ledger
from bidirl.runtime.run_spec import build_spec, check_trainer_memory
from bidirl.runtime.run_summary import run_summary, write_admissions
from bidirl.runtime.stops import StopSignals, clean_stop_error
from bidirl.runtime.trajectories import hub_for, is_multi_turn
from bidirl.runtime.validation import Validator, ValSet, score_validation
from bidirl.runtime.validation_episodes import EpisodeValidator


class TrainSession:
    """One run, resumed or new: ``prepare_resume`` (resume only), then ``run`` (start, run,
    stop; the summary it returns is ``summary.json``'s)."""

    def __init__(self, cfg: TrainConfig, run_dir: Path, resume: bool = False, wrap_backend=None,
                 ray_address: str | None = None) -> None:
        """``wrap_backend(backend, spec) -> backend`` lets tests inject faults around the
        device backend; production runs leave it None.  ``ray_address`` (``--ray-address``)
        is the cluster to join over ``cluster.ray_address``; the config is left as written."""
        self.cfg, self.run_dir, self.resume = cfg, Path(run_dir), resume
        self.wrap_backend = wrap_backend
        self.ray_address = ray_address or cfg.cluster.ray_address
        self.ckpt_root = self.run_dir / "checkpoints"
        self.start_step = 0
        self.rewards_by_step: dict[int, float] = {}  # the checkpoint's; the step boundary adds each step's
        self.stop = StopSignals()
        self.boundary: StepBoundary | None = None  # once the executor runs
        self._chosen: tuple[Path | None, dict | None] | None = None  # prepare_resume's answer
        self.placement = None  # runtime/placement.Placement: the node of each device, once placed
        self.group_ids = GroupIds()  # the controller's ids to the run's (runtime/group_ids.py), on resume
        self.train_devices: tuple[int, ...] = ()

    @property
    def ledger_path(self) -> Path:
        return self.run_dir / LEDGER

    # -- resume ---------------------------------------------------------------------------
    def prepare_resume(self) -> tuple[Path | None, dict | None]:
        """Resume: the checkpoint to continue from; the ledger and metrics cut back to it.

        Called once (by ``run`` if not before).  A finished run (its checkpoint at
        ``run.steps``) is left as it is; ``run.steps`` below the checkpoint's step is a
        ``ResumeError``.
        """
        if self._chosen is not None:
            return self._chosen
        ckpt, state = select_checkpoint(self.ckpt_root, self.ledger_path, self.cfg.rollout.prompts_per_step)
        self.start_step = state["next_step"] if state else 0
        self.rewards_by_step = {int(k): v for k, v in (state or {}).get("rewards_by_step", {}).items()
                                if int(k) < self.start_step}
        steps = self.cfg.run.steps
        if self.start_step > steps:
            raise ResumeError(f"--resume: run.steps={steps} is below the checkpoint's step {self.start_step}; "
                              f"give run.steps={self.start_step} or more")
        if self.start_step < steps:
            truncate_ledger(self.ledger_path, self.start_step)
            truncate_samples(self.run_dir, self.start_step)
            dropped = truncate_metrics(self.run_dir, self.start_step)
            if dropped:
                print(f"[bidirl] metrics.jsonl: dropped {dropped} record(s) of steps from {self.start_step} on "
                      "(they are trained again)", file=sys.stderr)
        self._chosen = ckpt, state
        return ckpt, state

    # -- start ----------------------------------------------------------------------------
    def run(self) -> dict:
        cfg = self.cfg
        check_machine_fits(cfg, ray_address=self.ray_address)  # before any data, model or Ray set-up
        check_model_shape(cfg)  # model.path's whole directory (model_check), or the tiny model's heads
        ckpt, state = self.prepare_resume() if self.resume else (None, None)
        if self.resume and self.start_step >= cfg.run.steps:
            print(f"[bidirl] this run is finished ({cfg.run.steps} steps, checkpoint {ckpt}); nothing to train",
                  file=sys.stderr)
            return {**run_summary(cfg, self.ledger_path, self.rewards_by_step, 0.0, None, []), "finished": True}
        rows, reward_fn = prepare_data(cfg)  # bad data fails before any slow set-up
        val_rows = prepare_val_rows(cfg)
        model_dir = prepare_model(cfg)
        check_lora_targets(cfg, model_dir)
        check_trainer_memory(cfg, model_dir)  # the trainer's state against cluster.device_memory_gib
        # Ray starts while the tokenizer loads and the prompts are measured (RayStart); the
        # device workers start only once the data has passed (fit_prompts), as before.
        with ray_session_started(self.ray_address, num_cpus=cfg.cluster.rollout_devices + cfg.cluster.train_devices,
                                 log_level=cfg.run.worker_log_level) as ray_start:
            tok = load_prompt_encoder(model_dir, [*rows, *val_rows])  # the processor where rows hold images
            rows, fit = fit_prompts(cfg, rows, tok, model_dir, val_rows)  # before any worker
            vs = val_set(cfg, fit, tok)
            cursor = PromptCursor(rows, seed=cfg.data.seed)
            store = GroupStore(cfg.rollout.group_size, cfg.rollout.max_new_tokens, cfg.rollout.temperature,
                               cfg.run.seed, cap_for=response_cap(cfg), reproducible=cfg.scheduler.reproducible,
                               overlong=cfg.algorithm.overlong_buffer)
            if state is not None:
                cursor.load_state_dict(state["cursor"])
                store.load_state_dict(state["store"])
                pps = cfg.rollout.prompts_per_step  # a checkpoint without next_group: ids were steps x pps
                first_new = state.get("next_group", max([self.start_step * pps] + [g + 1 for g in store.groups]))
                self.group_ids = GroupIds.resumed({g: r.batch for g, r in store.groups.items()}, first_new, pps)
                print(f"[bidirl] resuming from {ckpt} at step {self.start_step} "
                      f"({len(store.groups)} buffered or in-flight groups)", file=sys.stderr)
            elif self.resume:
                print("[bidirl] no complete checkpoint yet: starting from step 0", file=sys.stderr)
            stream = PromptStream(cursor, store, tok, keep_rows=is_multi_turn(cfg))
            ray_start.ready()
            self.stop.install()  # the loop's handlers; exits.DriverSignals' before and after
            try:
                return self._run_cluster(model_dir, ckpt, fit, vs, stream, reward_fn)
            finally:
                self.stop.restore()

    def _run_cluster(self, model_dir: str, ckpt: Path | None, fit: PromptLengths, vs: ValSet | None,
                     stream: PromptStream, reward_fn) -> dict:
        cfg = self.cfg
        policy = make_policy(cfg.scheduler.policy)  # the one policy: what is prewarmed, and what schedules
        placement = place(cfg)  # which node each device lives on (one node: all of them)
        spec = build_spec(cfg, cfg.run.steps - self.start_step, fit.mean, placement.per_node)
        rollout_kwargs, trainer_config = worker_settings(cfg, model_dir, fit.max_model_len, fit.max_images)
        job = Job(stream.store, stream.new_group, reward_fn, stream.decode, rollout_kwargs,
                  trainer_kwargs={"model_dir": model_dir, "config": trainer_config},
                  ids=self.group_ids, version_offset=self.start_step,
                  algorithm=cfg.algorithm, hub=hub_for(cfg, stream.tok, fit.max_model_len))

        ex, self.train_devices = start_executor(cfg, policy, spec, placement, job, ckpt, self.wrap_backend)
        self.placement = placement
        reporter = StepReporter(cfg, self.run_dir, self.start_step, ex, wandb_config=self._config_record())
        reporter.decode_prompt = stream.decode_prompt
        boundary = self.boundary = StepBoundary(cfg, self.run_dir, self.start_step, self.rewards_by_step, self.stop,
                                                ex, stream.cursor, reporter, self.ledger_path)
        ex.on_step = boundary.after_step
        if cfg.scheduler.reproducible:  # keep each version's weights for replicas that missed a sync
            ex.on_step = ex.rollout.remembering(ex.on_step)
        if vs is not None and job.hub is not None:  # episodes, turn by turn (runtime/validation_episodes.py)
            ex.validator = EpisodeValidator(ex, vs, lambda t: hub_for(cfg, stream.tok, fit.max_model_len, t),
                                            reporter.on_validation, stream.decode, stream.decode_prompt,
                                            cfg.run.val_samples)
        elif vs is not None:
            ex.validator = Validator(ex, vs, lambda out: score_validation(vs, out, reward_fn, stream.decode,
                                                                          stream.decode_prompt, cfg.run.val_samples),
                                     reporter.on_validation)
        every = cfg.run.val_every
        if ex.validator is not None and (cfg.run.val_before_train
                                         or (self.start_step and every and self.start_step % every == 0)):
            ex.validator.request(self.start_step)  # the initial (or the checkpoint's) weights
        if self.stop.requested:  # a signal during the start-up: stop at the first boundary, this one
            boundary.stopped_at = self.start_step
        failed = None
        loop = None  # (time, per-pool tally) when the training loop ended: what the figures count
        try:
            ex.run(should_stop=lambda: boundary.stopping)
            loop_end = ex.now()
            loop = (loop_end, ex.clock.tally_at(loop_end))  # one instant for the wall and the tally
            if ex.validator is not None and ex.controller.finished and cfg.run.val_every:
                ex.validator.final(cfg.run.steps)  # the final weights, before the outputs are written
        except Exception as e:
            failed = clean_stop_error(e)
            if failed is None:
                lost = node_lost(e, self.placement, self.train_devices, self.run_dir)
                if lost is not None:
                    raise lost from None
                raise
        finally:
            wall = ex.now()
            intervals = ex.finish()
            if job.hub is not None:
                job.hub.close()
            reporter.close()
            boundary.close()
        return self._outputs(ex, reporter, failed, wall, intervals, loop)

    # -- stop: the outputs ----------------------------------------------------------------
    def _outputs(self, ex, reporter: StepReporter, failed, wall: float, intervals, loop) -> dict:
        """Summary, final metrics, trace, timeline, admissions, the calibrated scenario and
        ``RUN_DIR/model/``; a non-finite step is raised once they are written."""
        cfg, boundary = self.cfg, self.boundary
        finished = ex.controller.finished
        if failed is not None:  # the weights are the last good ones; the step's groups are in the store
            boundary.checkpoint_boundary()
        # The final validation runs after the last step: it is not training, so throughput,
        # idle ratios and the packing bound are the loop's; its seconds are reported apart.
        loop_wall, loop_tally = loop if loop is not None else (wall, None)
        summary = run_summary(cfg, self.ledger_path, self.rewards_by_step, loop_wall, ex,
                              clip_intervals(intervals, loop_wall), self.placement,
                              upto=None if finished else boundary.next_step, tally=loop_tally)
        summary["final_validation_s"] = round(wall - loop_wall, 3)
        summary["model_dir"] = self.publish_model()
        if not finished:
            summary["stopped"] = self._stop_record(failed)
        reporter.finish(summary, intervals, final_step=cfg.run.steps if finished else boundary.next_step)
        write_admissions(self.run_dir / "admissions.jsonl", ex.controller.state.admissions)
        calibrated_scenario.write(self.run_dir, cfg, ex, intervals, wall=loop_wall)  # this run, for the simulator
        if isinstance(failed, GenerationCapError):
            option = "algorithm.filter_groups.max_num_gen_batches"
            raise failed.named(option, self.start_step, f"; checkpoint of step {boundary.next_step} written; resume "
                               f"with: bidirl train --resume {self.run_dir} {option}=N (a larger N, or 0)") from None
        if failed is not None:
            what = " ".join(str(failed).split()).split(": no weight")[0]
            raise NonFiniteStepError(f"{what}: no weight was changed; checkpoint of step {boundary.next_step} "
                                     f"written; resume with: bidirl train --resume {self.run_dir} "
                                     "trainer.on_nonfinite=skip (or without the override, to stop at such a step "
                                     "again)")
        return summary

    def _config_record(self) -> dict:
        """The run's config as the run uses it: ``cluster.ray_address`` the one it joins."""
        record = self.cfg.to_dict()
        record["cluster"]["ray_address"] = self.ray_address
        return record

    def publish_model(self) -> str | None:
        """``RUN_DIR/model/``: the newest checkpoint's Hugging Face model directory."""
        src = publish_model(self.run_dir)
        if src is None:
            return None
        auto = "AutoModelForImageTextToText" if is_vision_language(self.run_dir / "model") else "AutoModelForCausalLM"
        print(f"[bidirl] model directory: {self.run_dir / 'model'} (checkpoint {src.parent.name}); "
              f"load it with {auto}.from_pretrained or vllm.LLM", file=sys.stderr)
        return str(self.run_dir / "model")

    def _stop_record(self, failed) -> dict:
        """What ended the run early: the signal or the non-finite step, and where to resume."""
        done = complete_checkpoints(self.ckpt_root)
        resume_step = int(done[-1].name.split("_")[1]) if done else 0
        why = ("filter_groups_cap" if isinstance(failed, GenerationCapError)
               else "nonfinite_step" if failed is not None else self.stop.name)
        return {"by": why, "at_step": self.boundary.next_step, "resume_step": resume_step,
                "abandoned": failed is None and self.boundary.stopped_at is None,
                "exit_status": self.exit_status(failed)}

    def exit_status(self, failed=None) -> int:
        return 2 if failed is not None else self.stop.exit_status
