"""The executor's rollout side: groups onto replicas, engine runs, completions, hand-backs.

A replica generates on its own (``RolloutRole``'s thread); the driver keeps one ``poll``
in flight per replica while it has responses outstanding.  A poll returns as soon as a
response finished, with the decode/prefill measurements since the last one; they become
``GroupsCompleted`` and ``StageMeasured`` events.  Requests, weights and reclaims reach the
replica beside the poll, so a reclaim waits for at most the decode step in progress.

With DAPO's dynamic sampling (``algorithm.filter_groups.enable``) a group is scored the
moment it completes and judged (``algo/dynamic_sampling.zero_spread`` on its training
rewards): the verdict goes to the controller in ``GroupsCompleted.filtered``, and a filtered
group stays in the store, marked, until its step is recorded (``runtime/boundary.py``).

Multi-turn (``job.hub``, ``runtime/trajectories.py``): a response is a trajectory; what a
replica generates is one model turn of it at a time.  A finished turn goes back to its
episode (``turn_done``), not to the store; the episode's next turn comes out of the hub
(``pump_trajectories``, every pass of the executor's loop) and goes to the replica that holds
its group now, or waits (``parked``) while the group has none, after a reclaim; a finished
trajectory goes to the store as a finished response.  A reclaimed replica's partial turns
resume elsewhere with their prefix (or, in reproducible mode, from the turn's start), as
single-turn partials do; a lost device's turns restart from their start.
"""

from __future__ import annotations

from bidirl.algo.dynamic_sampling import zero_spread
from bidirl.controller.actions import AssignGroups
from bidirl.controller.events import GroupsCompleted, GroupsInterrupted, StageMeasured
from bidirl.controller.state import Phase
from bidirl.core.ledger import Role
from bidirl.runtime.messages import PrefillBurst

POLL_TIMEOUT_S = 2.0  # a poll returns earlier when anything finished; this only bounds a quiet wait
# Decode steps are summed into one measurement of at least this long: the stage model
# predicts seconds of decoding, not one step, and a sum over many steps is what the
# simulator reports too.  The model is linear, so summing loses nothing, and a replica that
# ran dry (or was lent) carries its few steps over to the next sum rather than report them
# alone: one step on a shared CPU scatters several-fold (8 ms to 41 ms for the same batch
# in one run), and such remainders were a tenth of a run's decode measurements.
DECODE_SAMPLE_S = 0.25
# A profile record (no model learns it) of the decode steps a replica ran after its last
# ``DECODE_SAMPLE_S`` sum, when the run ends: the run's calibrated scenario fits decode on
# the sums and these, so a short run's last few hundred milliseconds are not lost (a run with
# under one sum of decoding per replica would have no decode fit at all).
DECODE_REMAINDER = "decode_remainder"


class RolloutDriver:
    def __init__(self, ex) -> None:
        self.ex = ex
        n = ex.spec.n_units
        self.version = {u: ex.job.version_offset for u in range(ex.spec.n_replicas)}  # weights each holds
        self.running = [0] * n  # responses submitted to the unit's engine and not yet back
        self.run_handle: list = [None] * n  # the poll in flight
        self.groups: list[set[int]] = [set() for _ in range(n)]  # global ids of its groups
        self.assigned_at: dict[int, float] = {}  # global id -> first assignment (timing_s/gen)
        self.completed_at: dict[int, float] = {}  # global id -> completion
        self.decode_sum = [[0.0, 0.0, 0.0, 0.0] for _ in range(n)]  # steps, batch, context, seconds
        self.weights_at: dict[int, object] = {}  # reproducible mode: version -> its weights (a handle)
        self._next_new: int | None = None  # the next group id to create (``_create_through``)
        self.hub = getattr(ex.job, "hub", None)  # multi-turn: the run's TrajectoryHub
        self.parked: dict[int, list] = {}  # global id -> turn requests waiting for the group to get a replica
        self.turns_on: list[dict[tuple[int, int], object]] = [{} for _ in range(n)]  # (g, i) -> turn request
        # every ended trajectory's (model turns, environment seconds, model tokens, environment
        # tokens, seconds between its turns on the run's clock), in the order they ended: what a
        # calibrated scenario describes.  The last: from its start (reset) or a turn's end to its next
        # turn's request, and from its last turn to its end: the environment and the hub's hand-over
        self.trajectory_stats: list[tuple[int, float, int, int, float]] = []
        self._env_since: dict[tuple[int, int], float] = {}  # (g, i) -> when it went to its environment
        self._env_wait: dict[tuple[int, int], float] = {}  # (g, i) -> seconds in it so far

    def remembering(self, on_step):
        """Reproducible mode: wrap the executor's per-step hook so that each new version's
        weights are fetched the moment it exists (before the next step can change them) and
        kept for a replica that comes home having missed a sync (``catch_up``).  A weights
        call issued later would queue behind the next step's update on the trainer's device
        and return a newer version under the old one's name."""
        ex = self.ex
        keep = ex.spec.staleness + 2

        def hook(rec) -> None:
            self.weights_at[ex.weights.version] = ex.primary_weights()
            for v in [v for v in self.weights_at if v < ex.weights.version - keep]:
                del self.weights_at[v]
            if on_step is not None:
                on_step(rec)

        return hook

    def assign(self, a: AssignGroups) -> None:
        ex, u = self.ex, a.replica
        store, ids = ex.job.store, ex.job.ids
        by_id = ex.controller.state.groups.groups  # the step the controller bound each group to
        reqs = []
        now = ex.now()
        for gid in a.group_ids:
            g = ids.global_id(gid)
            self.assigned_at.setdefault(g, now)
            self._create_through(g)
            store.groups[g].batch = by_id[gid].batch + ex.job.version_offset
            self.groups[u].add(g)
            if store.groups[g].complete:  # restored from a checkpoint, or its last trajectory ended meanwhile
                ex.deliver(self._completed(u, [g]))
                continue
            reqs += self._trajectories(g) if self.hub is not None else store.requests_for(g)
        self._submit(u, reqs)

    def _submit(self, u: int, reqs: list) -> None:
        if not reqs:
            return
        ex = self.ex
        ex.calls.issue(ex.unit_device(u), lambda _: None, None, "call", "rollout", "submit", reqs)
        self.running[u] += len(reqs)
        if self.hub is not None:
            self.turns_on[u].update({(r.group_id, r.index): r for r in reqs})
        self.ensure_run(u)

    # -- multi-turn ---------------------------------------------------------------------------
    def _trajectories(self, g: int) -> list:
        """Start group ``g``'s trajectories not yet started; its turns waiting for a replica."""
        store, hub = self.ex.job.store, self.hub
        rec = store.groups[g]
        for i in range(rec.n):
            if i not in rec.done and not hub.started(g, i):
                hub.start(g, i, rec.row or {}, store._seed(g, i), rec.prompt_ids)
                self._env_since[(g, i)] = self.ex.now()
        return self.parked.pop(g, [])

    def pump_trajectories(self) -> None:
        """Hand the episodes' new turns to their groups' replicas; record ended trajectories."""
        hub = self.hub
        if hub is None:
            return
        if hub.failure is not None:
            raise RuntimeError(f"a multi-turn episode failed outside its environment: {hub.failure!r}") from hub.failure
        by_unit: dict[int, list] = {}
        now = self.ex.now()
        for r in hub.take_requests():
            t0 = self._env_since.pop((r.group_id, r.index), None)
            if t0 is not None:
                self._env_wait[(r.group_id, r.index)] = self._env_wait.get((r.group_id, r.index), 0.0) + now - t0
            u = self._unit_of(r.group_id)
            if u is None:
                self.parked.setdefault(r.group_id, []).append(r)
            else:
                by_unit.setdefault(u, []).append(r)
        for u, reqs in by_unit.items():
            self._submit(u, reqs)
        ended = hub.take_finished()
        for r in ended:
            model, key = sum(r.loss_mask), (r.group_id, r.index)
            wait = self._env_wait.pop(key, 0.0) + now - self._env_since.pop(key, now)
            self.trajectory_stats.append((r.turns, r.env_seconds, model, len(r.loss_mask) - model, wait))
        if ended:
            complete = self.ex.job.store.absorb_finished(ended)
            for g in complete:
                u = self._unit_of(g)
                if u is not None:  # else its next assignment reports it (``assign``)
                    self.ex.deliver(self._completed(u, [g]))

    def _unit_of(self, g: int) -> int | None:
        return next((u for u, gs in enumerate(self.groups) if g in gs and self.ex.hosting.serves_rollout(u)), None)

    def stall_state(self) -> str:
        """What a multi-turn run holds when the executor finds nothing in flight (for its error)."""
        if self.hub is None:
            return ""
        on = {u: sorted(t) for u, t in enumerate(self.turns_on) if t}
        return (f"; trajectories live {self.hub.live}, in their environments {self.hub.in_environment()}, "
                f"parked turns {dict((g, len(r)) for g, r in self.parked.items())}, turns on units {on}, "
                f"groups per unit {[sorted(gs) for gs in self.groups]}")

    def waiting_on_environment(self) -> bool:
        """True while an episode is in its environment: the hub will have work without a call finishing."""
        return self.hub is not None and self.hub.in_environment() > 0

    def _create_through(self, g: int) -> None:
        """Create every group up to ``g`` that does not exist yet, in id order.

        The data cursor hands out prompts in the order groups are created; creating them in id
        order makes group ``g``'s prompt a function of ``g`` alone, whichever replica asks
        first (with two replicas, ``[0, 2]`` and ``[1, 3]`` would otherwise give group 2 the
        second prompt), so every policy and replica count trains the same data order.
        """
        store = self.ex.job.store
        if self._next_new is None:  # fresh: 0; resumed: the checkpoint's next group, after what the store holds
            self._next_new = max([self.ex.job.ids.first_new] + [k + 1 for k in store.groups])
        while self._next_new <= g:
            if self._next_new not in store.groups:
                self.ex.job.new_group(self._next_new)
            self._next_new += 1
        if g not in store.groups:  # below the counter yet missing: cannot happen, but never skip one
            self.ex.job.new_group(g)

    def sync_batches(self) -> None:
        """Each stored group's step as the controller has it now: with dynamic sampling a group
        may move to another step while it generates (``controller/batches.py``); a group the
        controller has not assigned yet (restored from a checkpoint) keeps the one it had."""
        job, by_id = self.ex.job, self.ex.controller.state.groups.groups
        for g, rec in job.store.groups.items():
            local = job.ids.local_id(g)
            if local in by_id:
                rec.batch = by_id[local].batch + job.version_offset

    def filtered_of(self, step: int) -> tuple[int, ...]:
        """The stored groups filtered from ``step`` (global), in id order (its ledger records)."""
        self.sync_batches()
        return tuple(sorted(g for g, rec in self.ex.job.store.groups.items() if rec.filtered and rec.batch == step))

    def next_group_id(self) -> int:
        """The global id the next new group gets (a checkpoint's ``next_group``)."""
        if self._next_new is None:
            return max([self.ex.job.ids.first_new] + [k + 1 for k in self.ex.job.store.groups])
        return self._next_new

    def ensure_run(self, u: int) -> None:
        ex = self.ex
        if self.run_handle[u] is not None or not self.running[u] or not ex.hosting.serves_rollout(u):
            return
        self.run_handle[u] = ex.calls.issue(ex.unit_device(u), lambda out: self._on_run(u, out),
                                            ("rollout", "rollout"), "poll", POLL_TIMEOUT_S)

    def _on_run(self, u: int, out: dict) -> None:
        self.run_handle[u] = None
        self._absorb(u, out["finished"])
        self._measured(u, out)
        self.ensure_run(u)

    def _absorb(self, u: int, finished: list) -> None:
        ex = self.ex
        self.running[u] = max(0, self.running[u] - len(finished))
        if self.hub is not None:  # model turns: their episodes go on
            for r in finished:
                self.turns_on[u].pop((r.group_id, r.index), None)
                self._env_since[(r.group_id, r.index)] = ex.now()
                self.hub.turn_done(r)
            return
        done = [g for g in ex.job.store.absorb_finished(finished) if g in self.groups[u]]
        if done:
            ex.deliver(self._completed(u, done))

    def _measured(self, u: int, out: dict) -> None:
        ex = self.ex
        for raw in out.get("prefills", []):
            b = PrefillBurst(*raw)
            if b.tokens > 0:
                ex.deliver(StageMeasured("prefill", (1.0, float(b.tokens)), self.prefill_seconds(b)))
        m, acc = out["measurements"], self.decode_sum[u]
        if m:
            ex.devices.last_work_s[ex.unit_device(u)] = max(x for _, _, x in m)
            acc[0] += len(m)
            acc[1] += sum(b for b, _, _ in m)
            acc[2] += sum(c for _, c, _ in m)
            acc[3] += sum(s for _, _, s in m)
        if acc[3] >= DECODE_SAMPLE_S:
            ex.deliver(StageMeasured("decode", (acc[0], acc[1], acc[2]), acc[3]))
            self.decode_sum[u] = [0.0, 0.0, 0.0, 0.0]

    def take_remainders(self) -> list[StageMeasured]:
        """Each replica's decode steps not yet in a measurement, as ``DECODE_REMAINDER``
        records (for the profile at the run's end; the online model has finished learning);
        the sums start again from zero, so a second call adds nothing twice."""
        out = [StageMeasured(DECODE_REMAINDER, (acc[0], acc[1], acc[2]), acc[3])
               for acc in self.decode_sum if acc[0] > 0 and acc[3] > 0]
        self.decode_sum = [[0.0, 0.0, 0.0, 0.0] for _ in self.decode_sum]
        return out

    @staticmethod
    def prefill_seconds(burst: PrefillBurst) -> float:
        """A prefill burst's time beyond the decode steps the engine would have run anyway:
        beyond the recent decode steps' median (one step's time scatters as much as the
        prefill taken from it).  Taking the decode model's prediction of the burst's decode
        work off its whole steps instead was tried and measured worse (rollout-heavy async:
        median error 0.50 against 0.31 for the last step's time, same run): the steps next
        to the burst share its contention, a model fitted over the run does not.
        """
        return burst.beyond_median_s

    def _completed(self, u: int, gids: list[int]) -> GroupsCompleted:
        job, now = self.ex.job, self.ex.now()
        store = job.store
        for g in gids:
            self.groups[u].discard(g)
            self.completed_at[g] = now
        lengths = tuple(tuple(len(store.groups[g].done[i].token_ids) for i in range(store.n)) for g in gids)
        filtered: tuple[bool, ...] = ()
        if job.algorithm.filter_groups.enable:  # scored now: the verdict is the controller's to act on
            for g in gids:
                store.score(g, job.reward_fn, job.decode)
            metric = job.algorithm.filter_groups.metric
            filtered = tuple(zero_spread(store.filter_values(g, metric)) for g in gids)
            for g, f in zip(gids, filtered):
                store.groups[g].filtered = f
        return GroupsCompleted(u, tuple(job.ids.local_id(g) for g in gids), lengths, filtered)

    def gen_seconds(self, gids) -> float | None:
        """Wall seconds from the first assignment of any of these groups to the last completion
        (veRL's ``timing_s/gen`` for a batch; overlapping other work when asynchronous); their
        times are dropped."""
        starts = [self.assigned_at.pop(g) for g in gids if g in self.assigned_at]
        ends = [self.completed_at.pop(g) for g in gids if g in self.completed_at]
        return max(ends) - min(starts) if starts and ends else None

    def catch_up(self, u: int) -> None:
        """A replica home from lending: load the newest weights if it missed a sync.

        Reproducible mode: the version its peers hold (the controller's ``synced``, or the
        version being pushed while a sync is in flight, which skipped this replica), which is
        older than the trainer's while a sync waits for a batch boundary; a replica that
        missed a sync and whose version the trainer no longer holds cannot be given it, and
        stops the run rather than generate at another version.
        """
        ex = self.ex
        target, weights = ex.weights.version, None
        if ex.spec.reproducible:
            st = ex.controller.state  # a sync issued and not yet reported counts: it skipped this replica
            target = (st.version if st.phase is Phase.SYNCING else st.synced) + ex.job.version_offset
            weights = self.weights_at.get(target)
            if self.version.get(u, ex.job.version_offset) != target and weights is None:
                raise RuntimeError(f"reproducible mode: replica {u} came home missing version {target}, "
                                   "whose weights were not kept")
        if self.version.get(u, ex.job.version_offset) != target:
            dev = ex.unit_device(u)
            ex.calls.issue(dev, lambda _: None, ("rollout", "weight sync"), "call", "rollout",
                           "update_weights", weights if weights is not None else ex.primary_weights(), target)
            self.version[u] = target
            ex.replica_weights_changed()

    def reclaimed(self, u: int, partials: list) -> None:
        """A borrowed replica was released: what finished is kept, partial prefixes go back."""
        self._absorb(u, [p for p in partials if p.finished])
        if self.hub is not None:
            for p in partials:
                if not p.finished:
                    start = self.turns_on[u].pop((p.group_id, p.index), None)
                    resumable = start is not None and len(p.token_ids) > len(start.prefix_ids)
                    again = p.as_request() if resumable and not self.ex.spec.reproducible else start
                    if again is not None:
                        self.parked.setdefault(p.group_id, []).append(again)
        else:
            self.ex.job.store.absorb_partials([p for p in partials if not p.finished])
        self._hand_back(u)

    def lost(self, u: int) -> None:
        """The unit's device died: its groups resume from the last prefixes the store holds."""
        self._hand_back(u)

    def _hand_back(self, u: int) -> None:
        ex, store = self.ex, self.ex.job.store
        self.running[u], self.run_handle[u] = 0, None  # its decode steps so far stay in its sum
        for (g, _i), req in self.turns_on[u].items():  # turns that never came back (a lost device): from their start
            self.parked.setdefault(g, []).append(req)
        self.turns_on[u].clear()
        # A group whose last trajectory ended while this unit was switching (not serving
        # rollout) is complete and not yet reported: report it now, or nobody ever would.
        ended = sorted(g for g in self.groups[u] if store.groups[g].complete)
        if ended:
            ex.deliver(self._completed(u, ended))
        gids = sorted(g for g in self.groups[u] if not store.groups[g].complete)
        self.groups[u].clear()
        if gids:
            ex.deliver(GroupsInterrupted(
                u, tuple(ex.job.ids.local_id(g) for g in gids), tuple(store.versions(g)[2] for g in gids),
                tuple(store.n - len(store.groups[g].done) for g in gids)))

    def serving(self) -> list[int]:
        """Units whose role is a rollout replica now (checkpoints snapshot their engines)."""
        hosting = self.ex.hosting
        return [u for u in range(self.ex.spec.n_units) if hosting.current_role(u) is Role.ROLLOUT]
