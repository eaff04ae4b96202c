"""The executor's training side: one ``StartTrainStep`` -> micro-batch calls -> ordered merge.

The batch's samples are laid out in group-id order and cut into the controller's
micro-batches.  Every call computes one micro-batch, so that work can move while the
step runs:

* each primary data-parallel rank gets its micro-batches (dealt round-robin) one call at
  a time, keeping ``PRIMARY_DEPTH`` calls on its device (``policy.split``; at 1, the
  default, it claims the next when the current one returns, which leaves a joiner the
  tail; at 2, one computing and one queued behind it, so the device never waits for a
  round trip to the driver);
* an auxiliary trainer in the plan computes its chunk the same way (``PRIMARY_DEPTH``
  calls on its device), so a reclaim waits for at most the micro-batch in progress (and
  the one queued, at depth 2); what it had not started goes to the primary (or a joiner);
* an auxiliary that joins the step in progress (``JoinStep``) takes the highest
  micro-batch no rank has claimed yet, each time its previous one returns: the primary
  eats its list from the head, the auxiliary from the tail, and they meet
  (``policy.split.steal_schedule`` is the same rule on paper).

An auxiliary with nothing left is reported (``ChunkComputed``) so that it can go home
before the merge: its gradients stay in the object store for the primary.  When every
micro-batch is computed, each rank merges *its own* micro-batches (whoever computed
them) in order and rank 0 also the plan's auxiliary chunks: the update does not depend on
who computed what, or when.  A sharded primary (``trainer.strategy=fsdp2``) merges
micro-batch ``i`` on rank ``i % ranks`` instead, the plan's auxiliary chunks included, so
that its update does not depend on the plan either (``merges_by_index``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from bidirl.controller.actions import PRIMARY, JoinStep, StartTrainStep
from bidirl.controller.events import ChunkComputed, StageMeasured, TrainStepFinished
from bidirl.engines.trainer_config import merges_by_index
from bidirl.frame.hosting import LENDING, LENT
from bidirl.policy.split import PRIMARY_DEPTH  # calls a primary rank keeps on its device
from bidirl.runtime.step_layout import Layout, StepRecord, lay_out, set_advantages


@dataclass
class _Step:
    """A step in flight: who holds which micro-batch, and what is still to come."""

    a: StartTrainStep
    rec: StepRecord
    mbs: list[list[dict]]  # samples of each micro-batch
    totals: object  # the step's StepTotals: every micro-batch's loss is divided by them
    rank_items: list[list[int]]  # per primary rank: its micro-batches, in merge order
    todo: list[deque]  # per primary rank: the ones nobody has claimed yet
    inflight: list[int]  # per primary rank: its calls on its device
    static: list[int] = field(default_factory=list)  # the plan's auxiliary micro-batches, merge order
    static_todo: dict[int, deque] = field(default_factory=dict)  # unit -> its chunk's unissued ones
    refs: dict[int, object] = field(default_factory=dict)  # micro-batch -> its gradient's handle
    computed_on: dict[int, int] = field(default_factory=dict)  # micro-batch -> device
    aux_calls: dict[int, int] = field(default_factory=dict)  # unit -> its calls not returned
    joined: dict[int, list[int]] = field(default_factory=dict)  # unit -> micro-batches it took
    calls_left: int = 0
    merging: bool = False


class TrainDriver:
    def __init__(self, ex) -> None:
        self.ex = ex
        self.records: dict[int, StepRecord] = {}
        self.current: _Step | None = None
        self.laying_out: int | None = None  # a step waiting for its reference KL (not yet current)
        self.waiting_joins: dict[int, list[JoinStep]] = {}  # step -> auxiliaries that joined meanwhile

    # -- start --------------------------------------------------------------------------
    def start(self, a: StartTrainStep) -> None:
        """Lay the step out; with KL in the reward, first ask rank 0 for the responses' KL to
        the reference (the advantages need it), then compute as usual.  Auxiliaries that join
        while the reference is computed wait for the step's micro-batches (``join``)."""
        ex = self.ex
        lay = lay_out(ex, a)
        self.records[lay.rec.step] = lay.rec
        if ex.spec.aux_trainers and ex.spec.n_replicas:
            # The weights an auxiliary of this step loads, asked for before the step's calls:
            # asked for later (a lend once the step runs), the request queues behind every
            # micro-batch on rank 0 and the wait is measured as C_in (2.5 s instead of 3 ms
            # for the first lend of a run, whose version 0 no weight sync had fetched).
            ex.primary_weights()
        alg = ex.job.algorithm
        if not (alg.use_kl_in_reward and alg.kl_ctrl.kl_coef > 0):
            set_advantages(ex.job.algorithm, lay, None)
            self._begin(a, lay)
            return

        def penalties(kl: list[float]) -> None:
            set_advantages(ex.job.algorithm, lay, kl)
            self._begin(a, lay)
            for join in self.waiting_joins.pop(a.step, []):
                self.join(join)

        self.laying_out = a.step
        ex.calls.issue(ex.layout.train_devices[0], penalties, ("train", f"reference KL {lay.rec.step}"),
                       "call", "train", "reference_kl", lay.mbs, alg.kl_penalty)

    def _begin(self, a: StartTrainStep, lay: Layout) -> None:
        ex = self.ex
        rec, mbs, totals = lay.rec, lay.mbs, lay.totals
        devs = ex.layout.train_devices
        self.laying_out = None
        own = [i for c in a.chunks if c.executor == PRIMARY for i in c.micro_batches]
        ranks = [own[r::len(devs)] for r in range(len(devs))]
        st = _Step(a, rec, mbs, totals, ranks, [deque(x) for x in ranks], [0] * len(devs))
        self.current = st
        rec.chunks.append((PRIMARY, len(own)))
        for c in a.chunks:
            if c.executor == PRIMARY:
                continue
            rec.chunks.append((str(c.executor), len(c.micro_batches)))
            st.static += c.micro_batches
            st.static_todo[c.executor] = deque(c.micro_batches)
            self._feed_static(st, c.executor)
        for r in range(len(devs)):
            self._feed_rank(st, r)
        self._check_done(st)

    def _weights_for(self, dev: int) -> None:
        """An auxiliary on ``dev`` computes on the primary's weights of this step."""
        ex = self.ex
        if ex.weights.aux.get(dev) != ex.weights.version:
            ex.calls.issue(dev, lambda _: None, ("aux_train", "load weights"), "call",
                           "aux_train", "set_weights", ex.primary_weights(), ex.weights.version)
            ex.weights.aux[dev] = ex.weights.version

    # -- calls ---------------------------------------------------------------------------
    def _compute(self, st: _Step, dev: int, role: str, i: int, on_done, on_lost=None) -> None:
        """One call: the gradient of micro-batch ``i`` on ``dev``; its handle is kept for the merge."""
        st.calls_left += 1
        handles = self.ex.calls.issue(dev, on_done, (role, f"train step {st.rec.step}"), "call", role,
                                      "compute_chunk_ref", [st.mbs[i]], st.totals,
                                      returns=2, on_lost=on_lost)
        st.refs[i], st.computed_on[i] = handles[0], dev

    def _feed_rank(self, st: _Step, r: int) -> None:
        """Keep ``PRIMARY_DEPTH`` calls on rank ``r``'s device while it has unclaimed work."""
        dev = self.ex.layout.train_devices[r]
        while st.inflight[r] < PRIMARY_DEPTH and st.todo[r]:
            st.inflight[r] += 1
            self._compute(st, dev, "train", st.todo[r].popleft(),
                          lambda res, r=r: self._rank_done(st, r, res))

    def _rank_done(self, st: _Step, r: int, res) -> None:
        st.inflight[r] -= 1
        st.calls_left -= 1
        self._measured("train_micro", res)
        self._feed_rank(st, r)
        self._check_done(st)

    def _feed_static(self, st: _Step, unit: int) -> None:
        """Keep ``PRIMARY_DEPTH`` calls of ``unit``'s chunk on its device while it is lent (or
        being lent); once it is on its way home, the rest goes to rank 0, which merges it."""
        ex, q = self.ex, st.static_todo[unit]
        if ex.hosting.status[unit] not in (LENDING, LENT):
            if q:
                st.todo[0].extend(q)  # higher indices than rank 0's own: its queue stays in order
                q.clear()
                self._feed_rank(st, 0)
            return
        dev = ex.unit_device(unit)
        if q:
            self._weights_for(dev)
        while st.aux_calls.get(unit, 0) < PRIMARY_DEPTH and q:
            i = q.popleft()
            st.aux_calls[unit] = st.aux_calls.get(unit, 0) + 1

            def lost(i=i):  # the auxiliary died: rank 0 computes the rest of its chunk
                st.calls_left -= 1  # the lost call never returns
                st.aux_calls[unit] -= 1
                st.todo[0].extend(sorted([i, *st.static_todo[unit]]))
                st.static_todo[unit].clear()
                self._feed_rank(st, 0)

            self._compute(st, dev, "aux_train", i, lambda res: self._aux_done(st, unit, res), on_lost=lost)

    def _aux_done(self, st: _Step, unit: int, res) -> None:
        self._measured("aux_micro", res)
        st.aux_calls[unit] -= 1
        st.calls_left -= 1
        if unit in st.static_todo:
            self._feed_static(st, unit)
        if unit in st.joined:
            self._steal(st, unit)
        if not st.aux_calls[unit]:  # its last one: it may go home before the merge
            self.ex.deliver(ChunkComputed(unit, st.a.step))
        self._check_done(st)

    # -- joining a step in progress --------------------------------------------------------
    def join(self, a: JoinStep) -> None:
        st, ex = self.current, self.ex
        if st is None and self.laying_out == a.step:  # its micro-batches wait for the reference KL
            self.waiting_joins.setdefault(a.step, []).append(a)
            return
        if st is None or st.a.step != a.step or st.merging:
            ex.deliver(ChunkComputed(a.unit, a.step))
            return
        st.joined.setdefault(a.unit, [])
        st.aux_calls.setdefault(a.unit, 0)
        self._weights_for(ex.unit_device(a.unit))
        self._steal(st, a.unit)
        if not st.aux_calls[a.unit]:
            ex.deliver(ChunkComputed(a.unit, a.step))

    def _steal(self, st: _Step, unit: int) -> None:
        """``unit`` takes the highest micro-batch that no rank has claimed, if it is still lent."""
        ex = self.ex
        if ex.hosting.status[unit] is not LENT:
            return
        tails = [(q[-1], r) for r, q in enumerate(st.todo) if q]
        if not tails:
            return
        r = max(tails)[1]
        i = st.todo[r].pop()
        st.joined[unit].append(i)
        st.aux_calls[unit] += 1

        def lost(r=r, i=i):  # the joiner died: the micro-batch goes back to its rank's tail
            st.calls_left -= 1
            st.aux_calls[unit] -= 1
            st.joined[unit].remove(i)
            st.todo[r].append(i)
            self._feed_rank(st, r)

        self._compute(st, ex.unit_device(unit), "aux_train", i, lambda res: self._aux_done(st, unit, res),
                      on_lost=lost)

    # -- merge -----------------------------------------------------------------------------
    def _measured(self, stage: str, res) -> None:
        _, timings = res
        if timings:
            # One measurement per call: what a chunk plan predicts, and what the simulator
            # reports (the model is linear: sums are exact).
            self.ex.deliver(StageMeasured(stage, (float(len(timings)), float(sum(t for t, _, _ in timings)),
                                                  float(sum(t * q for t, q, _ in timings))),
                                          sum(x for _, _, x in timings)))

    def _check_done(self, st: _Step) -> None:
        if st.merging or st.calls_left or any(st.todo) or any(st.static_todo.values()):
            return
        st.merging = True
        for unit, items in st.joined.items():
            if items:
                st.rec.chunks.append((f"{unit} (joined)", len(items)))
        self._merge(st)

    def _merge(self, st: _Step) -> None:
        """Every micro-batch is computed: each rank merges its own, rank 0 also the plan's
        auxiliary chunks, in order.  Gradients computed elsewhere are fetched in groups (one
        per run of micro-batches from the same device); each group's fetch is a ``C_grad``."""
        ex, a, rec = self.ex, st.a, st.rec
        devs = ex.layout.train_devices
        pending = {"n": len(devs)}

        def applied(out, rank: int) -> None:
            metrics, c_grad = out
            if rank == 0:
                rec.metrics, rec.c_grad_s = {**metrics, **rec.extra_metrics}, c_grad
                for s in c_grad:
                    ex.deliver(StageMeasured("train_on_roll.c_grad", (), s))
            pending["n"] -= 1
            if pending["n"] == 0:
                rec.finished_s = ex.now()
                ex.weights.version = a.step + 1 + ex.job.version_offset
                self.current = None
                ex.deliver(TrainStepFinished(a.step, a.step + 1, rec.finished_s - rec.started_s))
                if ex.on_step:
                    ex.on_step(rec)

        by_index = merges_by_index(ex.job.trainer_kwargs.get("config"), len(devs))
        every = sorted([*st.static, *(i for r in st.rank_items for i in r)])
        for rank, dev in enumerate(devs):
            items = ([i for i in every if i % len(devs) == rank] if by_index
                     else list(st.rank_items[rank]) + (st.static if rank == 0 else []))
            where = [st.computed_on[i] for i in items]
            n_own = 0
            while n_own < len(where) and where[n_own] == dev:
                n_own += 1
            groups: list[int] = []
            for k in range(n_own, len(where)):
                if k > n_own and where[k] == where[k - 1]:
                    groups[-1] += 1
                else:
                    groups.append(1)
            nested = [[st.refs[i] for i in items]]
            ex.calls.issue(dev, lambda out, rank=rank: applied(out, rank), ("train", f"train step {rec.step}"),
                           "call", "train", "apply_refs", nested, n_own, groups)
