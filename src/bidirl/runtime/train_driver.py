"""The executor's training side: one ``StartTrainStep`` -> chunks on executors -> ordered merge.

The batch's samples are laid out in group-id order and cut into the controller's
micro-batches; each chunk goes to its executor (the primary's data-parallel ranks, or an
auxiliary trainer, one micro-batch per call so a reclaim waits for at most one).  An
auxiliary whose chunk is computed is reported (``ChunkComputed``) so that it can go home
before the merge: its gradients stay in the object store for the primary.  When
every chunk is computed, each rank merges its own and rank 0 also the auxiliary chunks,
in chunk order: the update does not depend on who computed what, or when.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bidirl.controller.actions import PRIMARY, StartTrainStep
from bidirl.controller.events import ChunkComputed, StageMeasured, TrainStepFinished
from bidirl.core.staleness import staleness_at_training


@dataclass
class StepRecord:
    """What the driver saw of one training step (for metrics and audits)."""

    step: int
    group_ids: tuple[int, ...]
    rewards: list[float]
    staleness: list[int]
    response_tokens: int
    total_tokens: int
    started_s: float
    finished_s: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict)
    chunks: list[tuple[str, int]] = field(default_factory=list)  # (executor, micro-batches)
    c_grad_s: list[float] = field(default_factory=list)


@dataclass
class _Job:
    """One chunk's share on one device: ``role`` is train, aux_train or aux_redo."""

    device: int
    role: str
    micro_batches: list
    handle: object = None
    unit: int | None = None  # an auxiliary's unit


class TrainDriver:
    def __init__(self, ex) -> None:
        self.ex = ex
        self.records: dict[int, StepRecord] = {}

    def start(self, a: StartTrainStep) -> None:
        ex = self.ex
        rec, mbs = self._layout(a)
        jobs: list[_Job] = []  # in merge order
        for c in a.chunks:
            chunk_mbs = [mbs[i] for i in c.micro_batches]
            rec.chunks.append((str(c.executor), len(chunk_mbs)))
            if c.executor == PRIMARY:
                devs = ex.layout.train_devices
                jobs += [_Job(d, "train", chunk_mbs[r::len(devs)]) for r, d in enumerate(devs)]
            else:  # one call per micro-batch, so a reclaim waits for at most one
                jobs += [_Job(ex.unit_device(c.executor), "aux_train", [mb], unit=c.executor) for mb in chunk_mbs]
        aux_left: dict[int, int] = {}
        for job in jobs:
            if job.unit is not None:
                aux_left[job.unit] = aux_left.get(job.unit, 0) + 1
        state = {"left": len(jobs), "jobs": jobs, "total": rec.response_tokens, "aux_left": aux_left}
        w = None
        for job in jobs:
            if job.role == "aux_train" and ex.aux_version.get(job.device) != ex.version:
                w = w or ex.primary_weights()
                ex.calls.issue(job.device, lambda _: None, ("aux_train", "load weights"), "call",
                               "aux_train", "set_weights", w, ex.version)
                ex.aux_version[job.device] = ex.version
            self._issue(a, rec, state, job)

    def _layout(self, a: StartTrainStep) -> tuple[StepRecord, list[list[dict]]]:
        """Score the batch, compute advantages, cut the samples into the micro-batches."""
        from bidirl.algo.grpo import group_advantages_lists

        ex = self.ex
        job, goff, voff = ex.job, ex.job.group_offset, ex.job.version_offset
        gids = [g + goff for g in a.group_ids]
        rewards = [job.store.score(g, job.reward_fn, job.decode) for g in gids]
        samples, stale = [], []
        step = a.step + voff
        for g, adv in zip(gids, group_advantages_lists(rewards)):
            rec = job.store.groups[g]
            v_first = job.store.versions(g)[0]
            stale.append(staleness_at_training(step, v_first if v_first is not None else step))
            for i in range(rec.n):
                r = rec.done[i]
                samples.append({"prompt_ids": rec.prompt_ids, "response_ids": r.token_ids,
                                "behaviour_logprobs": r.logprobs, "advantage": float(adv[i])})
        sizes = [mb.samples for mb in a.micro_batches]
        if sum(sizes) != len(samples):
            raise RuntimeError(f"step {a.step}: micro-batches cover {sum(sizes)} samples, batch has {len(samples)}")
        mbs, k = [], 0
        for n in sizes:
            mbs.append(samples[k:k + n])
            k += n
        total = sum(len(s["response_ids"]) for s in samples)
        rec = StepRecord(step, tuple(gids), [x for r in rewards for x in r], stale, total,
                         sum(len(s["response_ids"]) + len(s["prompt_ids"]) for s in samples), ex.now())
        self.records[rec.step] = rec
        return rec, mbs

    def _issue(self, a, rec: StepRecord, state: dict, job: _Job) -> None:
        ex = self.ex

        def lost():  # the auxiliary died: the primary recomputes this chunk; merge order is kept
            job.device, job.role = ex.layout.train_devices[0], "aux_redo"
            self._issue(a, rec, state, job)

        role = "train" if job.role == "aux_redo" else job.role
        job.handle = ex.calls.issue(job.device, lambda res: self._computed(a, rec, state, job, res),
                                    (role, f"train step {rec.step}"), "call", role, "compute_chunk_ref",
                                    job.micro_batches, state["total"], returns=2,
                                    on_lost=lost if job.role == "aux_train" else None)[0]

    def _computed(self, a, rec: StepRecord, state: dict, job: _Job, res) -> None:
        ex = self.ex
        _, timings = res
        stage = "aux_micro" if job.role == "aux_train" else "train_micro"
        if timings:
            ex.last_work_s[job.device] = max(x for _, _, x in timings)
            # One measurement per call, the sum of its micro-batches: what a chunk plan
            # predicts, and what the simulator reports (the model is linear: sums are exact).
            ex.deliver(StageMeasured(stage, (float(len(timings)), float(sum(t for t, _, _ in timings)),
                                             float(sum(t * q for t, q, _ in timings))),
                                     sum(x for _, _, x in timings)))
        state["left"] -= 1
        if job.role == "aux_train":  # its last micro-batch: the unit may go home before the merge
            state["aux_left"][job.unit] -= 1
            if not state["aux_left"][job.unit]:
                ex.deliver(ChunkComputed(job.unit, a.step))
        if not state["left"]:
            self._merge(a, rec, state["jobs"])

    def _merge(self, a, rec: StepRecord, jobs: list[_Job]) -> None:
        """Every chunk is computed: each DP rank merges, rank 0 also the auxiliary chunks, in order."""
        ex = self.ex
        devs = ex.layout.train_devices
        aux = [j.handle for j in jobs if j.role in ("aux_train", "aux_redo")]
        pending = {"n": len(devs)}

        def applied(out, rank: int) -> None:
            metrics, c_grad = out
            if rank == 0:
                rec.metrics, rec.c_grad_s = metrics, c_grad
                for s in c_grad:
                    ex.deliver(StageMeasured("train_on_roll.c_grad", (), s))
            pending["n"] -= 1
            if pending["n"] == 0:
                rec.finished_s = ex.now()
                ex.version = a.step + 1 + ex.job.version_offset
                ex.deliver(TrainStepFinished(a.step, a.step + 1, rec.finished_s - rec.started_s))
                if ex.on_step:
                    ex.on_step(rec)

        for rank, dev in enumerate(devs):
            own = [j.handle for j in jobs if j.role == "train" and j.device == dev]
            nested = [own + (aux if rank == 0 else [])]
            ex.calls.issue(dev, lambda out, rank=rank: applied(out, rank), ("train", f"train step {rec.step}"),
                           "call", "train", "apply_refs", nested, len(own))
