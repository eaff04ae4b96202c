"""Run the real runtime's executor on the fake device backend: one call, one ``FakeRun``."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from types import SimpleNamespace

from fake_devices import Costs, FakeBackend, KillFirstAuxTrainer

from bidirl.algo.algorithm_config import AlgorithmConfig, FilterGroups
from bidirl.controller.cluster import ClusterSpec, device_layout
from bidirl.controller.loop import Controller
from bidirl.policy import make_policy
from bidirl.runtime.checkpoints import _boundary_state
from bidirl.runtime.executor import DeviceExecutor, Job, Layout
from bidirl.runtime.group_ids import GroupIds
from bidirl.runtime.group_store import GroupStore


@dataclass
class FakeRun:
    executor: DeviceExecutor
    backend: FakeBackend
    spec: ClusterSpec
    intervals: list
    trained: Counter = field(default_factory=Counter)  # group -> times trained
    staleness: dict = field(default_factory=dict)  # group -> version gap at training
    responses: dict = field(default_factory=dict)  # (group, index) -> ResponseResult trained
    filtered: Counter = field(default_factory=Counter)  # group -> times recorded as filtered
    filtered_at: dict = field(default_factory=dict)  # group -> the step it was recorded with
    state: dict | None = None  # what a checkpoint at ``stop_after`` holds


def spec_for(rollout: int, train: int, *, steps: int, prompts: int, group_size: int, max_new: int,
             staleness: int, cap: int = 16, prompt_tokens: int = 6) -> ClusterSpec:
    """The spec ``runtime/run_spec.build_spec`` builds for this cluster (one device a unit)."""
    return ClusterSpec(
        hardware="cpu-core", model="tiny-qwen2", devices=rollout + train,
        **device_layout(rollout, train, 1, rollout + train),
        train_dp=train, train_tp=1, replica_cap=cap,
        groups_per_step=prompts, group_size=group_size, prompt_tokens=prompt_tokens,
        staleness=staleness, steps=steps, micro_batch_tokens=2 * (prompt_tokens + max_new // 2),
        max_response_tokens=max_new, prior_scale=1.0)


def reward(data_source, solution_str, ground_truth, extra_info=None) -> float:
    """Partial credit by length; a "flat" prompt scores 0 whatever the response (a group
    with no spread, which dynamic sampling filters)."""
    return 0.0 if ground_truth == "flat" else (len(solution_str) % 5) / 4.0


def run_fake(policy: str, rollout: int = 2, train: int = 1, *, steps: int = 6, prompts: int = 4,
             group_size: int = 4, max_new: int = 48, staleness: int = 1, costs: Costs | None = None,
             kill_aux_at_step: int | None = None,
             setup: Callable[[DeviceExecutor], Callable | None] | None = None,
             flat_every: int | None = None, max_gen_batches: int = 0, stop_after: int | None = None,
             resume: dict | None = None, algorithm: AlgorithmConfig | None = None,
             hub: Callable[[], object] | None = None, strategy: str = "ddp") -> FakeRun:
    """``setup(executor)`` runs before the loop (e.g. to attach a validator) and may return a
    per-step hook (e.g. a ``StepBoundary``'s ``after_step``), called before the groups are retired;
    a validator attached to the executor gets its final validation after the loop.

    ``flat_every``: dynamic sampling on (``algorithm.filter_groups``), and every group whose id
    is a multiple of it gets a prompt whose rewards are all 0 (filtered); ``max_gen_batches``
    its cap.  ``algorithm``: the run's algorithm section instead (filtering as it says).

    ``stop_after``: stop at that step boundary, keeping what a checkpoint there holds
    (``FakeRun.state``, ``checkpoints._boundary_state``); ``resume``: such a state, to go on
    from as ``--resume`` does (a controller counting from 0, the checkpoint's groups first).
    ``hub``: makes a multi-turn run's ``TrajectoryHub`` (each group's row: one user message ``p<g>``).
    ``strategy``: ``trainer.strategy`` (``fsdp2``: micro-batch i merged by rank i % ranks)."""
    start = resume["next_step"] if resume else 0
    spec = spec_for(rollout, train, steps=steps - start, prompts=prompts, group_size=group_size,
                    max_new=max_new, staleness=staleness)
    if flat_every is not None:
        spec = replace(spec, filter_groups=True, max_gen_batches=max_gen_batches)
    backend = FakeBackend(list(range(spec.devices)), costs)
    wrapped = backend if kill_aux_at_step is None else KillFirstAuxTrainer(backend, rollout, kill_aux_at_step)
    for d in spec.train_devices:
        backend.submit(d, "host", "train", dp_rank=d - rollout, dp_world=train, version=start)
    for d in range(rollout):
        backend.submit(d, "host", "rollout", version=start)
    store = GroupStore(group_size, max_new, 1.0, seed=0)
    ids = GroupIds()
    if resume:
        store.load_state_dict(resume["store"])
        ids = GroupIds.resumed({g: r.batch for g, r in store.groups.items()}, resume["next_group"], prompts)

    def new_group(g: int) -> None:
        flat = flat_every is not None and g % flat_every == 0
        row = {"prompt": [{"role": "user", "content": f"p{g}"}], "data_source": "fake",
               "reward_model": {"ground_truth": "x"}, "extra_info": {"group": g}} if hub is not None else None
        store.add(g, f"p{g}", [1, 2, 3, 4, 5, 6], "fake", "flat" if flat else "x", row=row)

    controller = Controller(spec, make_policy(policy))
    algorithm = algorithm or AlgorithmConfig(filter_groups=FilterGroups(enable=flat_every is not None))
    job = Job(store, new_group, reward, lambda tokens: " ".join(map(str, tokens)), rollout_kwargs={},
              trainer_kwargs={"model_dir": "fake", "config": {"config": {"strategy": strategy}}},
              algorithm=algorithm, ids=ids, version_offset=start,
              hub=hub() if hub is not None else None)
    ex = DeviceExecutor(controller, wrapped, job, Layout(lambda u: spec.unit_devices(u)[0],
                                                         list(spec.train_devices)))
    controller.bind(ex)
    out = FakeRun(ex, backend, spec, [])

    extra = setup(ex) if setup is not None else None

    def on_step(rec) -> None:  # what the step boundary does: the ledger, then the store lets go
        for g, st in zip(rec.group_ids, rec.staleness):
            out.trained[g] += 1
            out.staleness[g] = st
            for i, r in store.groups[g].done.items():
                out.responses[(g, i)] = r
        filtered = ex.rollout.filtered_of(rec.step)
        for g in filtered:  # recorded with their step, as the step boundary does
            out.filtered[g] += 1
            out.filtered_at[g] = rec.step
        if extra is not None:
            extra(rec)
        for g in (*rec.group_ids, *filtered):
            store.groups.pop(g, None)
        if stop_after is not None and rec.step + 1 == stop_after:
            out.state = _boundary_state(stop_after, ex, store, SimpleNamespace(state_dict=dict), {}, prompts)

    ex.on_step = on_step
    ex.run(should_stop=lambda: out.state is not None)
    if ex.validator is not None:
        ex.validator.final(steps)
    out.intervals = ex.finish()
    if job.hub is not None:
        job.hub.close()
    return out
