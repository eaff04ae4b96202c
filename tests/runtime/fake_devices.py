"""An in-process fake of the device workers, on a deterministic virtual clock.

``FakeBackend`` implements ``bidirl.runtime.backend.Backend``: every submitted call runs at
once on a fake worker (calls to one device in submission order, as a Ray actor runs
them), costs virtual seconds from a small linear model, and completes at
``max(now, device free, arguments ready) + cost``; ``wait`` advances the clock to the next
completion.  The same ``DeviceExecutor`` that drives Ray actors drives these, so every
policy's real-runtime logic runs in the fast suite, reproducibly, in milliseconds.

Fake roles keep the contracts the executor relies on:

* ``FakeRollout``: response ``(group, index)`` is a fixed token sequence of a fixed length
  (independent of weights and seeds), so a response resumed from a partial prefix must
  come out equal to the uninterrupted one; every token is tagged with the version the
  engine held when it was produced.
* ``FakeTrainer``: fp32 numpy weights; a micro-batch's gradient depends on the weights,
  the version is checked at merge (the primary refuses gradients of another version) and
  chunks are summed in the order given, so the update is bitwise reproducible.  Data
  parallel ranks share a ``DPGroup`` (an all-reduce in rank order).
"""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bidirl.runtime.backend import DeviceLost
from bidirl.runtime.messages import ResponseRequest, ResponseResult

DIM = 16
VOCAB = 50


def response_length(group: int, index: int, max_new: int) -> int:
    """A long-tailed but fixed length per response."""
    r = random.Random(group * 1009 + index)
    return max(1, min(max_new, int(max_new * r.random() ** 2.5) + 1))


def token_at(group: int, index: int, pos: int) -> int:
    return 3 + (group * 31 + index * 7 + pos * 13) % VOCAB


@dataclass
class Costs:
    """Virtual seconds of every call (a linear model per stage)."""

    decode_s: float = 0.002  # per decode step ...
    decode_per_seq_s: float = 0.0001  # ... + per running sequence
    decode_per_ctx_s: float = 2e-7  # ... + per context token
    prefill_per_token_s: float = 1e-5
    train_per_token_s: float = 2e-4
    apply_s: float = 0.01
    c_in_s: float = 0.05
    c_out_s: float = 0.02
    weights_s: float = 0.001
    sync_s: float = 0.005
    c_grad_s: float = 0.003


@dataclass(eq=False)
class FakeHandle:
    device: int
    done_at: float
    value: Any = None
    lost: bool = False


# -- roles ------------------------------------------------------------------------------
class FakeRollout:
    def __init__(self, costs: Costs, version: int = 0, **_ignored) -> None:
        self.costs, self.version = costs, version
        self.live: dict[str, tuple[ResponseRequest, ResponseResult]] = {}
        self._prefill_tokens = 0

    def submit(self, requests: list[ResponseRequest]):
        for r in requests:
            if r.max_new_tokens - len(r.prefix_ids) <= 0:
                raise ValueError(f"{r.request_id}: nothing left to generate")
            res = ResponseResult(r.group_id, r.index, r.prompt_ids, list(r.prefix_ids), list(r.prefix_logprobs),
                                 list(r.prefix_versions), False, None, r.max_new_tokens, r.temperature, r.seed)
            self.live[r.request_id] = (r, res)
            self._prefill_tokens += len(r.prompt_ids) + len(r.prefix_ids)
        return None, 0.0

    def run(self, budget_s: float, stop_on_finish: bool = True):
        c, elapsed = self.costs, 0.0
        finished, measurements, prefills = [], [], []
        while self.live:
            batch = len(self.live)
            ctx = sum(len(q.prompt_ids) + len(s.token_ids) for q, s in self.live.values())
            took = c.decode_s + c.decode_per_seq_s * batch + c.decode_per_ctx_s * ctx
            if self._prefill_tokens:  # as ``RolloutRole.poll``: the burst's whole step and its decode work
                took += c.prefill_per_token_s * self._prefill_tokens
                prefills.append((self._prefill_tokens, 1, batch, ctx, took, took))
                self._prefill_tokens = 0
            else:
                measurements.append((batch, ctx, took))
            elapsed += took
            for rid, (req, res) in list(self.live.items()):
                pos = len(res.token_ids)
                tok = token_at(req.group_id, req.index, pos)
                res.token_ids.append(tok)
                res.logprobs.append(-0.1 * (1 + tok % 7))
                res.versions.append(self.version)
                if pos + 1 >= response_length(req.group_id, req.index, req.max_new_tokens):
                    res.finished, res.finish_reason = True, "stop"
                    del self.live[rid]
                    finished.append(res)
            if (finished and stop_on_finish) or elapsed >= budget_s:
                break
        return {"finished": finished, "measurements": measurements, "prefills": prefills,
                "running": len(self.live)}, elapsed

    def validate(self, prompts: list[list[int]], max_new_tokens: int, temperature: float = 0.0, seed: int = 0,
                 images=None):
        """One fixed response per prompt (``group`` -1 - prompt index), tagged with nothing: the
        live training responses are not touched, as ``RolloutRole.validate`` sets them aside."""
        responses = [[token_at(-1 - i, 0, pos) for pos in range(response_length(-1 - i, 0, max_new_tokens))]
                     for i in range(len(prompts))]
        cost = self.costs.decode_s * max((len(r) for r in responses), default=0)
        return {"version": self.version, "responses": responses, "seconds": cost,
                "finish_reasons": ["length" if len(r) >= max_new_tokens else "stop" for r in responses]}, cost

    def snapshot(self):
        """Copies of every live response's progress, without interrupting it (checkpoints)."""
        return [copy.deepcopy(res) for _, res in self.live.values()], 0.0

    def abort_all(self):
        out = [res for _, res in self.live.values()]
        self.live.clear()
        return out

    def update_weights(self, weights, version: int):
        """Returns the load's own seconds, as ``RolloutRole.update_weights`` does."""
        self.version = version
        return self.costs.sync_s, self.costs.sync_s

    set_weights = update_weights


@dataclass
class FakeChunk:
    grads: list[np.ndarray]
    micro_batches: list
    version: int


class DPGroup:
    """The primary's data-parallel ranks: each applies its partial sum; the last to arrive
    all-reduces them in rank order and every rank steps with the same total."""

    def __init__(self, world: int) -> None:
        self.world, self.parts = world, {}

    def reduce(self, rank: int, grad: np.ndarray, members: list) -> None:
        self.parts[rank] = grad
        if len(self.parts) < self.world:
            return
        total = np.zeros(DIM, np.float32)
        for r in range(self.world):
            total += self.parts[r]
        self.parts = {}
        for m in members:
            m.step_with(total)


FAKE_KL_PER_TOKEN = 0.02


class FakeTrainer:
    def __init__(self, costs: Costs, lr: float = 0.05, version: int = 0, dp: DPGroup | None = None,
                 rank: int = 0, members: list | None = None, **_ignored) -> None:
        self.costs, self.lr, self.version = costs, lr, version
        self.w = np.linspace(-1, 1, DIM, dtype=np.float32)
        self.dp, self.rank, self.members = dp, rank, members
        self.applied: list[list] = []  # per step: the micro-batches merged, in merge order
        self.kl_calls = 0  # reference_kl calls (KL in the reward: one per step, on rank 0)

    def grad(self, mb: list[dict], total: int) -> np.ndarray:
        g = np.zeros(DIM, np.float32)
        for s in mb:
            feat = np.zeros(DIM, np.float32)
            for j, t in enumerate(s["response_ids"]):
                feat[(t + j) % DIM] += np.float32(1.0 / (1 + t % 5))
            g += np.float32(s["advantage"]) * (feat - np.tanh(self.w)) / np.float32(max(1, total))
        return g

    def compute_chunk_ref(self, micro_batches: list, totals):
        grads, timings, cost = [], [], 0.0
        for mb in micro_batches:
            tokens = sum(len(s["prompt_ids"]) + len(s["response_ids"]) for s in mb)
            took = self.costs.train_per_token_s * tokens
            grads.append(self.grad(mb, totals.tokens))
            timings.append((tokens, tokens / max(1, len(mb)), took))
            cost += took
        return (FakeChunk(grads, list(micro_batches), self.version), timings), cost

    def reference_kl(self, micro_batches: list, kind: str):
        """A made-up but fixed KL per sample (KL in the reward): a function of its tokens."""
        self.kl_calls += 1
        out = [FAKE_KL_PER_TOKEN * len(s["response_ids"]) + 1e-3 * (s["response_ids"][0] % 7)
               for mb in micro_batches for s in mb]
        return out, self.costs.train_per_token_s * sum(len(s["response_ids"]) for mb in micro_batches for s in mb)

    def apply_refs(self, nested: list, n_own: int, groups: list[int] | None = None):
        chunks = nested[0]
        total = np.zeros(DIM, np.float32)
        for c in chunks:
            if c.version != self.version:
                raise RuntimeError(f"gradients of version {c.version}, trainer holds {self.version}")
            for g in c.grads:
                total += g
        self.applied.append([mb for c in chunks for mb in c.micro_batches])
        c_grad = [self.costs.c_grad_s] * (len(groups) if groups is not None else len(chunks) - n_own)
        if self.dp is not None:
            self.dp.reduce(self.rank, total, self.members)
        else:
            self.step_with(total)
        return ({"loss": float(total.sum())}, c_grad), self.costs.apply_s + sum(c_grad)

    def step_with(self, total: np.ndarray) -> None:
        self.w = self.w - np.float32(self.lr) * total
        self.version += 1

    def weights(self):
        return {"w": self.w.copy()}, self.costs.weights_s

    def set_weights(self, weights: dict, version: int):
        self.w, self.version = weights["w"].copy(), version
        return None, self.costs.weights_s


# -- workers and the backend ----------------------------------------------------------------
class FakeWorker:
    """``runtime/worker.py``'s ``DeviceWorker`` contract: host / release / call, roles parked."""

    def __init__(self, device: int, costs: Costs, backend) -> None:
        self.device, self.costs, self.backend = device, costs, backend
        self.roles: dict[str, Any] = {}
        self.alive = True

    def host(self, role: str, weights=None, version: int = 0, dp_rank: int = 0, dp_world: int = 1, **_kw):
        if role in self.roles:
            raise RuntimeError(f"device {self.device} already hosts {role}")
        if isinstance(weights, list):
            weights = weights[0]
        if role == "rollout":
            r = FakeRollout(self.costs, version)
        elif role in ("train", "aux_train"):
            dp = members = None
            if dp_world > 1:
                dp, members = self.backend.dp_group(dp_world)
            r = FakeTrainer(self.costs, version=version, dp=dp, rank=dp_rank, members=members)
            if members is not None:
                members.append(r)
            if weights is not None:
                r.set_weights(weights, version)
        else:
            raise ValueError(f"unknown role {role!r}")
        self.roles[role] = r
        return self.costs.c_in_s, self.costs.c_in_s

    def release(self, role: str, park: bool = True):
        r = self.roles.pop(role)
        handed = r.abort_all() if role == "rollout" else None
        return (self.costs.c_out_s, handed), self.costs.c_out_s

    def poll(self, timeout_s: float):
        """One decode step per poll: on the virtual clock a poll's round trip is free, so this
        is a replica generating on its own while a reclaim still waits <= one step."""
        r = self.roles.get("rollout")
        if r is None:
            return {"finished": [], "measurements": [], "prefills": [], "running": 0}, 0.0
        return r.run(0.0)

    def call(self, role: str, method: str, *args, **kwargs):
        r = self.roles.get(role)
        if r is None:
            raise RuntimeError(f"device {self.device} does not host {role} (hosts {sorted(self.roles)})")
        return getattr(r, method)(*args, **kwargs)


class FakeBackend:
    """``Backend`` over ``FakeWorker``s on a virtual clock (see the module docstring)."""

    def __init__(self, devices: list[int], costs: Costs | None = None) -> None:
        self.costs = costs or Costs()
        self.t = 0.0
        self.workers = {d: FakeWorker(d, self.costs, self) for d in devices}
        self.free_at = dict.fromkeys(devices, 0.0)
        self.open: dict[int, list[FakeHandle]] = {d: [] for d in devices}
        self._dp: tuple[DPGroup, list] | None = None

    def dp_group(self, world: int):
        if self._dp is None:
            self._dp = (DPGroup(world), [])
        return self._dp

    def now(self) -> float:
        return self.t

    def submit(self, device: int, method: str, *args, returns: int = 1, **kwargs):
        ready = [self.t, self.free_at[device]]
        args, kwargs = self._resolve(args, ready), self._resolve(kwargs, ready)
        start = max(ready)
        w = self.workers[device]
        if method == "kill":
            self.kill(device)
            return FakeHandle(device, start, None, lost=True)
        if not w.alive:
            handles = [FakeHandle(device, start, lost=True) for _ in range(returns)]
        else:
            value, cost = getattr(w, method)(*args, **kwargs)
            done = start + cost
            self.free_at[device] = done
            values = list(value) if returns > 1 else [value]
            handles = [FakeHandle(device, done, v) for v in values]
        self.open[device] += handles
        return handles if returns > 1 else handles[0]

    def _resolve(self, obj, ready: list):
        if isinstance(obj, FakeHandle):
            ready.append(obj.done_at)
            if obj.lost:
                raise DeviceLost(f"argument from dead device {obj.device}")
            return obj.value
        if isinstance(obj, list):
            return [self._resolve(x, ready) for x in obj]
        if isinstance(obj, tuple):
            items = [self._resolve(x, ready) for x in obj]
            return type(obj)(*items) if hasattr(obj, "_fields") else tuple(items)  # a NamedTuple stays one
        if isinstance(obj, dict):
            return {k: self._resolve(v, ready) for k, v in obj.items()}
        return obj

    def wait(self, handles: list, timeout_s: float) -> set:
        if not handles:
            return set()
        self.t = max(self.t, min(h.done_at for h in handles))
        return {h for h in handles if h.done_at <= self.t}

    def get(self, handle: FakeHandle):
        self.t = max(self.t, handle.done_at)
        if handle.lost:
            raise DeviceLost(f"device {handle.device} died")
        return handle.value

    def kill(self, device: int) -> None:
        """The device's worker dies now: calls not yet complete are lost."""
        self.workers[device].alive = False
        for h in self.open[device]:
            if h.done_at > self.t:  # they fail now, all at once, as a dead actor's calls do
                h.lost, h.done_at = True, self.t
        self.free_at[device] = self.t

    def restart(self, device: int) -> None:
        self.workers[device] = FakeWorker(device, self.costs, self)
        self.free_at[device] = self.t
        self.open[device] = []


@dataclass
class KillFirstAuxTrainer:
    """Test-only fault: from step ``at_step`` on, the first auxiliary trainer given a chunk
    dies as it starts computing it.  Wraps any backend (fake or Ray)."""

    inner: Any
    first_train_device: int
    at_step: int
    steps_seen: int = 0
    killed: list = field(default_factory=list)

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def submit(self, device: int, method: str, *args, returns: int = 1, **kwargs):
        out = self.inner.submit(device, method, *args, returns=returns, **kwargs)
        if method == "call" and args[:2] == ("train", "apply_refs") and device == self.first_train_device:
            self.steps_seen += 1
        if (method == "call" and args[:2] == ("aux_train", "compute_chunk_ref") and not self.killed
                and self.steps_seen >= self.at_step):
            self.killed.append(device)
            self.inner.submit(device, "kill")
        return out
