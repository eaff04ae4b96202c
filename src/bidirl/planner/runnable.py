"""What the real runtime executes, so that ``bidirl plan`` picks only layouts ``bidirl train
--plan PLAN.json`` can run.

The planner's search space is the paper's (tensor-parallel trainers and replicas included):
the simulator studies all of it (``bidirl simulate --plan auto``, ``bidirl plan --what-if``).
A plan a user means to *run* must stay inside what the runtime has: a trainer that is DDP or
FSDP2 over data parallel (``trainer.strategy``), and rollout replicas of one device each,
or of several on CPU devices (``rollout.tensor_parallel_size``: a worker holds one GPU, and
a tensor-parallel engine needs its unit's GPUs in one process tree, which is not built yet).
Each limit is one line here, so lifting one is one edit.
"""

from __future__ import annotations

import json
from pathlib import Path

from bidirl.planner.envelope import Envelope

__all__ = ["RUNTIME_MAX_TRAIN_TP", "RUNTIME_MAX_ROLLOUT_TP", "RUNTIME_MAX_ROLLOUT_TP_CPU", "cpu_hardware",
           "plan_file_overrides", "plan_overrides", "unrunnable_reason"]

RUNTIME_MAX_TRAIN_TP = 1
"""No tensor-parallel trainer: a model larger than a device is sharded over dp (FSDP2)."""
RUNTIME_MAX_ROLLOUT_TP = 1
"""On GPUs a rollout replica is one device (one Ray actor, one GPU, one vLLM engine)."""
RUNTIME_MAX_ROLLOUT_TP_CPU = 8
"""On CPU devices a replica may span up to this many (``rollout.tensor_parallel_size``'s bound)."""


def cpu_hardware(name: str) -> bool:
    """Whether a hardware profile's devices are CPU cores (the catalogue's ``cpu-*`` names)."""
    return name.startswith("cpu")


def unrunnable_reason(env: Envelope, cpu: bool = False) -> str | None:
    """Why the runtime cannot run ``env`` as laid out, or None when it can; ``cpu``: the
    devices are CPU cores (:func:`cpu_hardware`)."""
    if env.train_tp > RUNTIME_MAX_TRAIN_TP:
        return (f"runtime: train_tp {env.train_tp}: the trainer runs DDP or FSDP2 over data parallel only "
                "(no tensor-parallel trainer)")
    if cpu and env.rollout_tp > RUNTIME_MAX_ROLLOUT_TP_CPU:
        return f"runtime: rollout_tp {env.rollout_tp}: a replica spans at most {RUNTIME_MAX_ROLLOUT_TP_CPU} devices"
    if not cpu and env.rollout_tp > RUNTIME_MAX_ROLLOUT_TP:
        return (f"runtime: rollout_tp {env.rollout_tp}: on GPUs a rollout replica is one device "
                "(tensor-parallel replicas run on CPU devices only, so far)")
    return None


def plan_overrides(plan: dict, source: str = "the plan") -> list[str]:
    """The ``bidirl train`` overrides that run ``plan`` (``bidirl plan --json``) as laid out.

    Its split becomes ``cluster.rollout_devices`` / ``cluster.train_devices``, its replicas'
    width ``rollout.tensor_parallel_size``, a sharded trainer ``trainer.strategy=fsdp2`` (DDP
    otherwise), its policy ``scheduler.policy``.  Its ``hardware`` says whether its devices are
    CPU cores (a plan without one is judged as GPUs: the stricter limits).  A layout the
    runtime cannot run, or a file that is no plan, is a ``ValueError`` in one line.
    """
    try:
        e = plan["envelope"]
        env = Envelope(int(e["rollout_devices"]), int(e["train_devices"]), int(e["rollout_tp"]),
                       int(e["train_layout"]["dp"]), int(e["train_layout"]["tp"]),
                       train_sharded=bool(e["train_layout"]["sharded"]))
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{source} is not a plan written by `bidirl plan --json` (no envelope field {err})") from None
    why = unrunnable_reason(env, cpu_hardware(str(plan.get("hardware") or "")))
    if why is not None:
        raise ValueError(f"{source} lays out {env.label()}, which bidirl train cannot run: {why}; "
                         "plan again without --what-if")
    out = [f"cluster.rollout_devices={env.rollout_devices}", f"cluster.train_devices={env.train_devices}",
           f"trainer.strategy={'fsdp2' if env.train_sharded else 'ddp'}"]
    if env.rollout_tp > 1:
        out.append(f"rollout.tensor_parallel_size={env.rollout_tp}")
    if plan.get("policy"):
        out.append(f"scheduler.policy={plan['policy']}")
    return out


def plan_file_overrides(path: str) -> list[str]:
    """``plan_overrides`` of the JSON file at ``path`` (``bidirl train --plan``); one-line errors."""
    where = f"--plan {path}"
    try:
        plan = json.loads(Path(path).read_text())
    except OSError as e:
        raise ValueError(f"{where}: cannot read it ({e.strerror})") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not JSON ({e.msg}, line {e.lineno})") from None
    if not isinstance(plan, dict):
        raise ValueError(f"{where} is not a plan written by `bidirl plan --json` (not a JSON object)")
    return plan_overrides(plan, where)
