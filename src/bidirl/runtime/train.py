"""``bidirl train``: a real GRPO run, driven by the same controller as the simulator.

This is the command's entry: the config and the run directory (``run_dir.py``: new, or
``--resume``'s with its rules), then the session (``session.py``), which prepares the data
and the model (``prepare.py``), starts Ray and the device workers (``launch.py``), runs the
controller until the last step and writes the outputs.  Everything lands in the run
directory (``runs/<time>`` by default)::

    config.yaml  metrics.jsonl  events.out.tfevents.*  trace.json  timeline.png
    trained_groups.jsonl (ledger audit)  summary.json  admissions.jsonl  checkpoints/step_<k>/
    resume_changes.jsonl (what each --resume changed, if anything)
"""

from __future__ import annotations

import json
import sys

import yaml

from bidirl.runtime.config import ConfigError, load_config
from bidirl.runtime.exits import note_run_dir
from bidirl.runtime.run_dir import (
    check_data_unchanged,
    check_saved_config,
    record_data,
    record_resume_changes,
    remove_unstarted,
    resolve_run_dir,
    resume_changes,
    write_config,
)
from bidirl.runtime.session import TrainSession


def main(args, wrap_backend=None) -> int:
    """``bidirl train``; ``wrap_backend`` is the tests' fault-injection seam (see TrainSession).

    Exit status: 0 (the run finished and audits clean, or ``--resume`` found it finished),
    1 (it finished but the audit failed), 128 + the signal's number when SIGINT (130) or
    SIGTERM (143) stopped it at a step boundary, 2 for a user error or a non-finite step
    under ``trainer.on_nonfinite=stop`` (raised to the CLI, which prints one line).
    """
    overrides = list(args.overrides or [])
    if getattr(args, "print_config", False):
        path = str(resolve_run_dir(None, args.resume, None) / "config.yaml") if args.resume else args.config
        cfg = load_config(path, overrides)
        if args.resume:
            resume_changes(load_config(path, []), cfg)  # a refused override is an error here too
        print(yaml.safe_dump(cfg.to_dict(), sort_keys=False), end="")
        return 0
    if args.resume:
        given = [f for f, v in (("--config", args.config), ("--run-dir", args.run_dir)) if v]
        if given:
            raise ConfigError(f"{' and '.join(given)} cannot be given with --resume: a resumed run keeps its "
                              f"directory and its config.yaml (change safe fields with key=value)")
        run_dir = resolve_run_dir(None, args.resume, None)
        saved = load_config(str(run_dir / "config.yaml"), [])
        check_saved_config(run_dir / "config.yaml")
        cfg = load_config(str(run_dir / "config.yaml"), overrides)
        changes = resume_changes(saved, cfg)
        check_data_unchanged(run_dir, cfg, getattr(args, "allow_data_change", False))
        session = TrainSession(cfg, run_dir, resume=True, wrap_backend=wrap_backend, ray_address=args.ray_address)
        session.prepare_resume()  # the checkpoint, checked against run.steps; ledger and metrics cut back
        if changes:  # the run directory's config is the one the run continues with
            record_resume_changes(run_dir, session.start_step, changes)
            write_config(run_dir, cfg)
    else:
        cfg = load_config(args.config, overrides)
        run_dir = resolve_run_dir(cfg, None, args.run_dir)
        write_config(run_dir, cfg)
        try:
            record_data(run_dir, cfg)
        except BaseException:
            remove_unstarted(run_dir)
            raise
        session = TrainSession(cfg, run_dir, resume=False, wrap_backend=wrap_backend, ray_address=args.ray_address)
    note_run_dir(run_dir)  # messages raised deep in the run name it (runtime/exits.py)
    try:
        summary = session.run()
    except BaseException:
        if not args.resume:
            remove_unstarted(run_dir)
        raise
    print(json.dumps({k: summary.get(k) for k in ("steps", "wall_s", "reward_first_50", "reward_last_50", "val_score",
                                                  "throughput_tokens_per_s", "groups_trained", "audit_ok")},
                     indent=1))
    print(f"[bidirl] run directory: {run_dir}", file=sys.stderr)
    stopped = summary.get("stopped")
    if stopped:
        how = "" if not stopped["abandoned"] else f" (step {stopped['at_step']} abandoned)"
        at = stopped["resume_step"]
        print(f"[bidirl] stopped at step {at} by {stopped['by']}{how}; resume with: bidirl train --resume {run_dir}",
              file=sys.stderr)
        return stopped["exit_status"]
    return 0 if summary["audit_ok"] else 1
