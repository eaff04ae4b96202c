"""Multi-turn trajectories in the simulator (``workload.turns``, ``perf/scenario_turns.py``).

A response is a trajectory of model turns.  Each turn is admitted to its replica's engine
(``sim/engine.py``) as a one-response group of its own, id ``gid * group_size + i``, with
the trajectory's context so far as its prefix: it prefills that context (prompt, earlier
turns, environment replies; no prefix cache) and decodes its length.  When a turn ends the
trajectory waits ``tool_latency_s`` on its environment holding no slot (the replica serves
the others meanwhile); after every turn but the last it gains ``env_tokens`` of context
and its next turn is admitted to whichever replica holds its group then; after the last
(the environment's final step, which ends it) it has ended.  A group handed back (reclaim)
keeps every trajectory's state, a mid-turn one its tokens so far.  The group completes when
all its trajectories have ended (on the replica holding it, or at its next assignment); its
lengths are each trajectory's tokens after the prompt, model and environment (what the
trainer trains over).

``TurnDraws``: turn counts and per-turn lengths, which depend only on ``(seed, group,
response, turn)``: counts per batch from a generator seeded ``(seed, batch, COUNT_STREAM)``,
turn 0's length the single-turn draw (``ResponseLengths.lengths``), turn ``j``'s the
batch's draw of stream ``j`` (file/empirical lengths in replay or cycle order: the
response's listed length for every turn).  ``TrajectoryBook``: the trajectories' state.
"""

from __future__ import annotations

import numpy as np

from bidirl.perf.scenario_turns import Turns
from bidirl.sim.workload import ResponseLengths

COUNT_STREAM = 1_000_003  # above any turn index: turn counts never share a generator with lengths
READY, RUNNING, TOOL, FINAL, ENDED = 0, 1, 2, 3, 4  # FINAL: on the environment's last step


class TurnDraws:
    """How many model turns each trajectory has, and how long each turn is."""

    def __init__(self, turns: Turns, lengths: ResponseLengths, seed: int) -> None:
        self.turns, self.lengths, self.seed = turns, lengths, seed
        self.g, self.n = lengths.g, lengths.n
        self._counts: dict[int, list[list[int]]] = {}
        self._lens: dict[tuple[int, int], list[list[int]]] = {}
        d = lengths.dist
        self._listed = d.dist in ("file", "empirical") and d.order != "sample"

    def count_batch(self, batch: int) -> np.ndarray:
        t, shape = self.turns, (self.g, self.n)
        if t.dist == "constant":
            return np.full(shape, t.count, dtype=np.int64)
        rng = np.random.default_rng([self.seed, batch, COUNT_STREAM])
        if t.dist == "uniform":
            return rng.integers(t.min, t.max + 1, size=shape)
        values = np.asarray(t.values, dtype=np.int64)
        return values[rng.integers(0, len(values), size=shape)]

    def counts(self, gid: int) -> list[int]:
        b, r = divmod(gid, self.g)
        rows = self._counts.get(b)
        if rows is None:
            rows = self._counts[b] = self.count_batch(b).tolist()
            self._counts.pop(b - 64, None)
        return rows[r]

    def length(self, gid: int, i: int, turn: int) -> int:
        """Model tokens of turn ``turn`` of response ``i`` of group ``gid``."""
        if turn == 0 or self._listed:
            return self.lengths.lengths(gid)[i]
        b, r = divmod(gid, self.g)
        rows = self._lens.get((b, turn))
        if rows is None:
            rows = self._lens[(b, turn)] = self.lengths.draw_batch(b, turn).tolist()
            self._lens.pop((b - 64, turn), None)
        return rows[r][i]

    def trajectory(self, gid: int, i: int) -> list[int]:
        """Every model turn's length of one trajectory."""
        return [self.length(gid, i, j) for j in range(self.counts(gid)[i])]


class _Group:
    __slots__ = ("counts", "turn", "ctx", "gen", "state", "left", "unit")

    def __init__(self, counts: list[int]) -> None:
        n = len(counts)
        self.counts = counts
        self.turn = [0] * n  # the turn under way (or next)
        self.ctx = [0] * n  # tokens after the prompt before that turn (model + environment)
        self.gen = [0] * n  # tokens of that turn generated before a reclaim
        self.state = [READY] * n
        self.left = n  # trajectories not ended
        self.unit: int | None = None  # the replica holding the group


class TrajectoryBook:
    """Every unfinished trajectory's state, by group (see the module docstring)."""

    def __init__(self, draws: TurnDraws, group_size: int, prompt_tokens: int) -> None:
        self.draws, self.n, self.prompt = draws, group_size, prompt_tokens
        self.latency, self.env_tokens = draws.turns.tool_latency_s, draws.turns.env_tokens
        self.groups: dict[int, _Group] = {}
        self.by_unit: dict[int, set[int]] = {}

    def holds(self, u: int) -> bool:
        return bool(self.by_unit.get(u))

    def place(self, gid: int, u: int) -> list[int]:
        """Group ``gid`` is now on replica ``u``: the trajectories whose turn can start now."""
        g = self.groups.get(gid)
        if g is None:
            g = self.groups[gid] = _Group(self.draws.counts(gid))
        g.unit = u
        self.by_unit.setdefault(u, set()).add(gid)
        return [i for i, s in enumerate(g.state) if s == READY]

    def admit(self, eng, gid: int, i: int) -> int:
        """Start trajectory ``(gid, i)``'s turn on ``eng``; returns the context it prefills."""
        g = self.groups[gid]
        ctx = g.ctx[i]
        eng.admit(gid * self.n + i, (ctx + self.draws.length(gid, i, g.turn[i]),), {0: ctx + g.gen[i]})
        g.state[i] = RUNNING
        return self.prompt + ctx + g.gen[i]

    def turn_done(self, sid: int) -> tuple[int, int]:
        """A turn ended: its trajectory ``(group, response)`` is on its environment now."""
        gid, i = divmod(sid, self.n)
        g = self.groups[gid]
        g.ctx[i] += self.draws.length(gid, i, g.turn[i])
        g.gen[i] = 0
        g.turn[i] += 1
        if g.turn[i] >= g.counts[i]:
            g.state[i] = FINAL
        else:
            g.ctx[i] += self.env_tokens
            g.state[i] = TOOL
        return gid, i

    def complete(self, gid: int) -> bool:
        return self.groups[gid].left == 0

    def finish(self, gid: int) -> tuple[int, ...]:
        """A completed group's lengths (tokens after the prompt per trajectory); forgotten."""
        g = self.groups.pop(gid)
        if g.unit is not None:
            self.by_unit[g.unit].discard(gid)
        return tuple(g.ctx)

    def tool_back(self, gid: int, i: int) -> tuple[int | None, bool]:
        """Trajectory ``(gid, i)``'s environment answered: ``(the replica holding its group or
        None, ended)``; not ended: its next turn is ready."""
        g = self.groups[gid]
        if g.state[i] == FINAL:
            g.state[i] = ENDED
            g.left -= 1
            return g.unit, True
        g.state[i] = READY
        return g.unit, False

    def evict(self, u: int, parts: list) -> list[tuple[int, int, list[int]]]:
        """Replica ``u`` was reclaimed (``parts``: its engine's ``interrupt``): every group it
        held is handed back as ``(group, tokens so far, unended trajectories)``."""
        for sid, _tokens, prefixes in parts:
            gid, i = divmod(sid, self.n)
            g = self.groups[gid]
            g.gen[i] = prefixes[0] - g.ctx[i]
            g.state[i] = READY
        out = []
        for gid in sorted(self.by_unit.pop(u, ())):
            g = self.groups[gid]
            g.unit = None
            left = [i for i, s in enumerate(g.state) if s != ENDED]
            out.append((gid, sum(g.ctx) + sum(g.gen), left))
        return out


def ideal_rollout_s(draws: TurnDraws, gids, theta, cap: int, prompt: int, prefill_s, env_tokens: int) -> float:
    """Device-seconds of these groups' trajectories at the best per-token decode cost
    (``sim/run.py``), each later turn's context prefill and one prompt prefill per group."""
    a, c, k = theta
    fixed = a / cap + c
    total = prefill_s(prompt) * len(gids)
    for gid in gids:
        for i in range(draws.n):
            ctx = prompt
            for j, n in enumerate(draws.trajectory(gid, i)):
                if j:
                    total += prefill_s(ctx)
                total += n * (fixed + k * ctx) + k * n * (n - 1) / 2
                ctx += n + env_tokens
    return total


def longest_trajectory_s(draws: TurnDraws, batch: int, theta, prompt: int, prefill_s, latency: float,
                         env_tokens: int) -> float:
    """Seconds the batch's slowest trajectory takes alone on a replica: every turn's prefill
    and decode at batch 1, and the tool wait after each."""
    a, c, k = theta
    longest = 0.0
    for gid in range(batch * draws.g, (batch + 1) * draws.g):
        for i in range(draws.n):
            ctx, s = prompt, 0.0
            for n in draws.trajectory(gid, i):
                s += prefill_s(ctx) + n * (a + c + k * ctx) + k * n * (n - 1) / 2 + latency
                ctx += n + env_tokens
            longest = max(longest, s)
    return longest
