"""One simulated rollout replica: continuous batching, advanced analytically.

A replica runs up to ``cap`` responses at once.  Each decode step produces one token for
every running response and takes ``a + c*b + k*S`` seconds (``perf.stage_models``:
``b`` running responses, ``S`` the sum of their contexts).  Between two events the
running set is constant, so ``m`` steps take the closed form

    T(m) = m (a + c b + k S0) + k b m (m - 1) / 2          (contexts grow by 1 per step)

and the engine jumps from one response completion to the next instead of stepping
token by token.  Responses are kept sorted by the step index at which they finish; the
sum of contexts is an aggregate (``S = base_sum + b * k`` with ``base = context at
admission - step at admission``), so advancing costs O(1) per finished response.

Responses beyond ``cap`` wait (in admission order) and start, one per finished response,
at the step where a slot frees, as vLLM's scheduler does with ``max_num_seqs`` (a group
larger than the replica's cap runs in waves).  While anything waits, looking ahead merges
those starts into the sorted finishes (``_lookahead``); otherwise the fast path holds.

The step counter ``k`` is real-valued: an external event (a new group, a weight-sync
pause, a reclaim) can cut a step, and the closed form is exactly additive across such
cuts.  A reclaim keeps only whole steps (the step in flight is lost, as with an abort).
The runtime is told only when a whole *group* completes; ``next_event_time`` looks ahead
through the sorted finish steps without changing state.
"""

from __future__ import annotations

import heapq
import math
from bisect import insort
from collections import deque

_EPS = 1e-9


class ReplicaEngine:
    """Analytic continuous-batching state of one replica (see module docstring)."""

    __slots__ = ("theta", "cap", "prompt", "k", "t", "b", "base_sum", "fin", "groups",
                 "group_heap", "noise", "version", "decode_acc", "waiting")

    def __init__(self, theta: tuple[float, float, float], cap: int, prompt_tokens: int,
                 t: float = 0.0, version: int = 0) -> None:
        self.theta = theta
        self.cap = cap
        self.prompt = prompt_tokens
        self.k = 0.0  # decode steps done so far
        self.t = t  # time at which ``k`` holds (ahead of the clock while stalled)
        self.b = 0
        self.base_sum = 0.0
        # Running responses, sorted: (finish step, group, response index, admit step, base)
        self.fin: list[tuple[float, int, int, float, float]] = []
        # group -> [responses running, lengths, tokens of finished responses, last finish]
        self.groups: dict[int, list] = {}
        self.group_heap: list[tuple[float, int]] = []  # (last finish step, group), lazy
        self.noise = 1.0  # time multiplier for the current plan (set by the runtime)
        self.version = version
        self.decode_acc = [0.0, 0.0, 0.0, 0.0]  # summed features (m, mb, S-term) and seconds
        self.waiting: deque[tuple[int, int, int, int]] = deque()  # (group, response, length, prefix)

    @property
    def running(self) -> int:
        return self.b

    def context_tokens(self) -> float:
        """Sum of the running responses' contexts (prompt + tokens so far)."""
        return self.base_sum + self.b * self.k

    def admit(self, gid: int, lengths: tuple[int, ...], prefixes: dict[int, int] | None,
              ) -> int:
        """Add a group's responses (``prefixes``: response -> tokens already generated,
        for a resumed partial group).  Returns the prefill tokens it needs."""
        k, prompt = self.k, self.prompt
        todo = range(len(lengths)) if prefixes is None else sorted(prefixes)
        n = 0
        prefill = prompt
        last = k
        started = 0
        for i in todo:
            p = 0 if prefixes is None else prefixes[i]
            prefill += p
            n += 1
            if self.b + started >= self.cap or self.waiting:  # no free slot: it waits its turn
                self.waiting.append((gid, i, lengths[i], p))
                continue
            base = prompt + p - k
            f = k + lengths[i] - p
            insort(self.fin, (f, gid, i, k, base))
            self.base_sum += base
            started += 1
            if f > last:
                last = f
        self.b += started
        done_tokens = 0 if prefixes is None else sum(
            lengths[i] for i in range(len(lengths)) if i not in prefixes)
        self.groups[gid] = [n, lengths, done_tokens, last]
        heapq.heappush(self.group_heap, (last, gid))
        return prefill

    def stall(self, now: float, seconds: float) -> None:
        """Decode stops for ``seconds`` from ``now`` (prefill, weight update)."""
        self.t = max(self.t, now) + seconds

    def advance(self, until: float) -> list[int]:
        """Run decode steps up to time ``until``; returns the groups that completed."""
        done: list[int] = []
        t = self.t
        if until <= t:
            return done
        a, c, kk = self.theta
        fin, groups, nz, acc = self.fin, self.groups, self.noise, self.decode_acc
        limit = until + _EPS * (until if until > 1.0 else 1.0)
        k, b, bs = self.k, self.b, self.base_sum
        f0 = f1 = f2 = secs = 0.0
        i, n = 0, len(fin)
        while i < n:
            f, gid, idx, _k0, base = fin[i]
            m = f - k
            s_term = m * (bs + b * k) + b * m * (m - 1) * 0.5
            dt = nz * (m * (a + c * b) + kk * s_term)
            if t + dt > limit:
                break
            t += dt
            k = f
            f0 += m
            f1 += m * b
            f2 += s_term
            secs += dt
            i += 1
            b -= 1
            bs -= base
            g = groups[gid]
            g[0] -= 1
            g[2] += g[1][idx]
            if g[0] == 0:
                del groups[gid]
                done.append(gid)
            if self.waiting:  # the freed slot goes to the next waiting response, at step k
                wg, wi, wl, wp = self.waiting.popleft()
                wbase = self.prompt + wp - k
                wf = k + wl - wp
                insort(fin, (wf, wg, wi, k, wbase), lo=i)
                n += 1
                b += 1
                bs += wbase
                gw = groups[wg]
                if wf > gw[3]:
                    gw[3] = wf
                    heapq.heappush(self.group_heap, (wf, wg))
        del fin[:i]  # finished responses leave the front of the sorted list at once
        acc[0] += f0
        acc[1] += f1
        acc[2] += f2
        acc[3] += secs
        self.t, self.k, self.b, self.base_sum = t, k, b, bs
        if fin:
            self._partial(until, b, bs + b * k)
        else:
            self.t = until
        return done

    def _partial(self, until: float, b: int, s0: float) -> None:
        """Advance the whole and fractional steps that fit before ``until``."""
        a, c, kk = self.theta
        budget = (until - self.t) / self.noise
        lin = a + c * b + kk * (s0 - b * 0.5)
        quad = kk * b * 0.5
        m = 2 * budget / (lin + math.sqrt(lin * lin + 4 * quad * budget))
        acc = self.decode_acc
        acc[0] += m
        acc[1] += m * b
        acc[2] += m * s0 + b * m * (m - 1) * 0.5
        acc[3] += until - self.t
        self.k += m
        self.t = until

    def next_event_time(self) -> float | None:
        """When the next group completes if nothing else happens (no state change)."""
        if not self.fin:
            return None
        if self.waiting:
            return self._lookahead()
        heap, groups = self.group_heap, self.groups
        while heap[0][1] not in groups or groups[heap[0][1]][3] != heap[0][0]:
            heapq.heappop(heap)  # completed or interrupted since it was pushed
        target = heap[0][0]
        a, c, kk = self.theta
        t, k, b, bs, nz = self.t, self.k, self.b, self.base_sum, self.noise
        for f, _gid, _idx, _k0, base in self.fin:
            m = f - k
            t += nz * (m * (a + c * b) + kk * (m * (bs + b * k) + b * m * (m - 1) * 0.5))
            k = f
            b -= 1
            bs -= base
            if f >= target:
                return t
        return t

    def _lookahead(self) -> float:
        """``next_event_time`` while responses wait: finishes and the starts they free, merged
        in step order, until some group has none left."""
        a, c, kk = self.theta
        t, k, b, bs, nz = self.t, self.k, self.b, self.base_sum, self.noise
        fin, groups, waiting = self.fin, self.groups, self.waiting
        started: list[tuple[float, float, int]] = []  # (finish step, base, group) of waiting ones
        left: dict[int, int] = {}
        i = w = 0
        while i < len(fin) or started:
            if started and (i >= len(fin) or started[0][0] < fin[i][0]):
                f, base, gid = heapq.heappop(started)
            else:
                f, gid, _idx, _k0, base = fin[i]
                i += 1
            m = f - k
            t += nz * (m * (a + c * b) + kk * (m * (bs + b * k) + b * m * (m - 1) * 0.5))
            k = f
            b -= 1
            bs -= base
            n = left.get(gid, groups[gid][0]) - 1
            if n == 0:
                return t
            left[gid] = n
            if w < len(waiting):
                wg, _wi, wl, wp = waiting[w]
                w += 1
                wbase = self.prompt + wp - k
                heapq.heappush(started, (k + wl - wp, wbase, wg))
                b += 1
                bs += wbase
        return t

    def interrupt(self) -> list[tuple[int, int, dict[int, int]]]:
        """Abort everything (call ``advance`` first).  Returns, per group, the response
        tokens generated so far and the prefixes of its unfinished responses."""
        out: dict[int, dict[int, int]] = {}
        for _f, gid, i, k_admit, base in self.fin:
            length = self.groups[gid][1][i]
            p0 = int(round(base + k_admit - self.prompt))
            steps = int(math.floor(self.k - k_admit + _EPS))
            out.setdefault(gid, {})[i] = min(p0 + steps, length - 1)
        for gid, i, _length, p in self.waiting:  # never started: their prefix is what they came with
            out.setdefault(gid, {})[i] = p
        self.waiting.clear()
        result = []
        for gid in sorted(out):
            tokens = self.groups[gid][2] + sum(out[gid].values())
            result.append((gid, tokens, out[gid]))
        self.fin.clear()
        self.groups.clear()
        self.group_heap.clear()
        self.b = 0
        self.base_sum = 0.0
        return result

    def take_decode_measurement(self) -> tuple[tuple[float, float, float], float] | None:
        acc = self.decode_acc
        if acc[0] <= 0:
            return None
        out = ((acc[0], acc[1], acc[2]), acc[3])
        self.decode_acc = [0.0, 0.0, 0.0, 0.0]
        return out
