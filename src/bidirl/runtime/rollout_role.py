"""A rollout replica as a role a device worker hosts: vLLM generating on its own thread.

The replica generates continuously: a thread of the worker steps vLLM's in-process
``LLMEngine`` (``step()`` is one continuous-batching iteration) while requests are live,
and finished responses collect in an outbox that the driver drains with ``poll``, a call
that blocks until something finished.  No driver round trip sits between two decode
steps.  Everything else the driver sends (new requests, new weights, a reclaim's
``abort_all``, a checkpoint's ``snapshot``) arrives out of band, on another thread of the
actor, and takes the engine between two steps: the stepping thread yields after each
step to a waiting control call, so a reclaim takes effect within one decode step.
Each decode step is timed with the features of the decode-step model (running batch,
context tokens).  Steps that prefill (new requests, or every live one re-submitted after a
weight update, which vLLM may cut into several chunked-prefill steps) are not decode
steps: each such burst is reported as one prefill measurement: its prompt tokens, the
time it took beyond the decode step the engine would have run anyway (the median of the
last ``DECODE_REF_STEPS`` pure decode steps: one step's time scatters as much as the
prefill taken from it; older runs took the last step alone, also reported), and its whole
steps with the decode work they carried (steps, running batch, context tokens).

Every generated token is tagged with the policy version the engine held when the token
was produced; a resumed response keeps its prefix's tokens, log-probs and versions, so
staleness is counted from its oldest token wherever it finishes.  This is the project's
one rollout engine; ``tests/runtime/test_rollout_role.py`` checks it against the HF model.
"""

from __future__ import annotations

import gc
import threading
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from statistics import median
from typing import NamedTuple

from bidirl.runtime.vllm_env import apply_vllm_env

DECODE_REF_STEPS = 3  # pure decode steps whose median a prefill step's time is taken beyond


class PrefillBurst(NamedTuple):
    """One prefill burst as ``RolloutRole.poll`` reports it (``prefills``)."""

    tokens: int  # prompt tokens prefilled
    beyond_last_s: float  # its steps' time beyond the last pure decode step (the older measure)
    steps: int  # engine steps in the burst
    batch: int  # requests past their prefill that its steps decoded, summed over its steps
    context: int  # their context tokens, summed over its steps
    seconds: float  # its steps' whole time
    beyond_median_s: float  # its steps' time beyond the recent decode steps' median: the measurement


def _new_burst() -> list:
    """A prefill burst before its first step, as a list of :class:`PrefillBurst`'s fields."""
    return [0, 0.0, 0, 0, 0, 0.0, 0.0]


def engine_batching() -> dict:
    """vLLM scheduler arguments that keep every prompt in one step on a CPU.

    With chunked prefill (vLLM's default), a prompt that does not fit what is left of a
    step's token budget (4096 tokens on a CPU: e.g. 86 prompts of 48 tokens) is prefilled
    in two steps, and vLLM then rewinds the request's seeded generator by its offset, which
    a CPU ``torch.Generator`` does not have (``RuntimeError: CPU Generator does not use
    offset`` in ``_bookkeeping_sync``).  Without chunked prefill a prompt that does not fit
    waits for the next step, and vLLM sizes the budget to at least ``max_model_len``, so
    every prompt fits a step.  CUDA generators rewind: chunked prefill stays on there.
    """
    return {"enable_chunked_prefill": False} if vllm_on_cpu() else {}


def vllm_on_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def repack_tied_lm_head(worker) -> int:
    """Re-pack the output head of a tied model after a weight reload (vLLM on a CPU).

    On a CPU vLLM multiplies by the output head through a packed copy of its weight (a
    oneDNN or SGL handle made when the weights were processed).  A tied head shares the
    embedding's parameter and loads nothing of its own, so a reload refreshes the embedding
    in place while the head's packed copy keeps the old values: every token after a weight
    sync would be sampled from the old head.  Called in the engine's worker through
    ``collective_rpc``; returns how many heads were re-packed.
    """
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

    model = getattr(worker, "worker", worker).model_runner.get_model()
    heads = [m for m in model.modules() if isinstance(m, ParallelLMHead)]
    for head in heads:
        head.quant_method.process_weights_after_loading(head)
    return len(heads)


@dataclass
class ResponseRequest:
    """One response of one prompt group; ``prefix_*`` set when it resumes a partial."""

    group_id: int
    index: int
    prompt_ids: list[int]
    max_new_tokens: int
    temperature: float = 1.0
    seed: int = 0
    prefix_ids: list[int] = field(default_factory=list)
    prefix_logprobs: list[float] = field(default_factory=list)
    prefix_versions: list[int] = field(default_factory=list)

    @property
    def request_id(self) -> str:
        return f"g{self.group_id}.r{self.index}.p{len(self.prefix_ids)}"


@dataclass
class ResponseResult:
    group_id: int
    index: int
    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finished: bool
    finish_reason: str | None
    max_new_tokens: int
    temperature: float
    seed: int

    def as_request(self) -> ResponseRequest:
        """Resume this partial response from where it stopped."""
        return ResponseRequest(self.group_id, self.index, self.prompt_ids,
                               self.max_new_tokens, self.temperature, self.seed + 7919,
                               list(self.token_ids), list(self.logprobs), list(self.versions))


class RolloutRole:
    """A vLLM engine in this process, with version-tagged, abortable, resumable requests."""

    def __init__(self, model_dir: str, *, max_num_seqs: int = 128, max_model_len: int = 512,
                 dtype: str = "float32", seed: int = 0, device: str = "cpu",
                 kv_cache_bytes: int = 256 << 20, top_p: float = 1.0, top_k: int = -1,
                 min_tokens: int = 0, reproducible: bool = False) -> None:
        """``reproducible`` (``scheduler.reproducible``): a response whose engine request is
        restarted (a weight update, a validation) starts again from its first token with its
        own seed, instead of continuing from its tokens so far on a new random stream.
        ``min_tokens`` (``rollout.min_new_tokens``): EOS is masked until a training response
        has that many tokens (capped at its ``max_new_tokens``); validation is not forced."""
        apply_vllm_env()
        from vllm import LLM

        self.version = 0
        self.model_dir = model_dir
        self.top_p, self.top_k = top_p, top_k  # rollout.top_p / top_k, for every training request
        self.min_tokens = min_tokens
        self.reproducible = reproducible
        self._llm = LLM(model=model_dir, dtype=dtype, distributed_executor_backend="uni",
                        max_model_len=max_model_len, max_num_seqs=max_num_seqs,
                        enforce_eager=True, seed=seed, enable_prefix_caching=False,
                        use_tqdm_on_load=False,
                        # Explicit: otherwise vLLM sizes the KV cache from (shared) host memory.
                        kv_cache_memory_bytes=kv_cache_bytes, **engine_batching())
        self._engine = self._llm.llm_engine
        hf = self._engine.vllm_config.model_config.hf_config
        self._tied_cpu_head = vllm_on_cpu() and bool(getattr(hf.get_text_config(), "tie_word_embeddings", False))
        self._live: dict[str, ResponseRequest] = {}
        self._partial: dict[str, ResponseResult] = {}
        self._context: dict[str, int] = {}
        self._base: dict[str, int] = {}  # response tokens before the engine request started
        self._restarts = 0
        self._unprefilled: dict[str, int] = {}  # live requests without a token yet: context tokens
        self._burst = _new_burst()  # the prefill burst in progress
        self._decode_step_s = 0.0  # the last pure decode step
        self._decode_steps: deque[float] = deque(maxlen=DECODE_REF_STEPS)  # the last few
        self._max_seqs = max_num_seqs
        # The outbox poll drains, and what guards it and the engine (see the module doc).
        self._finished: list[ResponseResult] = []
        self._measurements: list[tuple[int, int, float]] = []
        self._prefills: list[tuple[int, float]] = []
        self._cv = threading.Condition()
        self._gate = threading.Lock()
        self._waiting = 0  # control calls waiting for the engine: the stepper yields to them
        self._interrupt = False  # a control call arrived: a poll in flight returns now
        self._paused = False
        self._stepping = False  # the engine is in step(), outside the lock
        self._closed = False
        self._error: BaseException | None = None
        import torch

        self._threads = torch.get_num_threads()  # what the engine was built with (vLLM sets it)
        self._thread = threading.Thread(target=self._generate, name="rollout-generate", daemon=True)
        self._thread.start()

    # -- requests ---------------------------------------------------------------------
    def submit(self, requests: list[ResponseRequest]) -> None:
        for r in requests:
            if r.max_new_tokens - len(r.prefix_ids) <= 0:
                raise ValueError(f"{r.request_id}: nothing left to generate")
        with self._control(interrupt=False):
            for r in requests:
                self._add(r.request_id, r, self._empty_result(r))

    @property
    def running(self) -> int:
        return len(self._live)

    def poll(self, timeout_s: float) -> dict:
        """Drain the outbox; wait up to ``timeout_s`` for a response to finish first.

        Returns at once when something finished, when nothing is live, or when a control
        call arrived (so the driver's calls queued behind this one are not held up).
        ``measurements`` holds ``(batch, context_tokens, seconds)`` per decode step since
        the last poll, ``prefills`` a :class:`PrefillBurst` per prefill burst.
        """
        deadline = time.perf_counter() + timeout_s
        with self._cv:
            while not (self._finished or self._interrupt or self._error or not self._live or self._paused):
                left = deadline - time.perf_counter()
                if left <= 0:
                    break
                self._cv.wait(left)
            self._interrupt = False
            if self._error is not None:
                raise RuntimeError(f"the rollout engine failed: {self._error!r}") from self._error
            out = {"finished": self._finished, "measurements": self._measurements,
                   "prefills": self._prefills, "running": len(self._live)}
            self._finished, self._measurements, self._prefills = [], [], []
            return out

    def run(self, budget_s: float, stop_on_finish: bool = True) -> dict:
        """Polls for up to ``budget_s`` (until something finished, with ``stop_on_finish``)."""
        out = {"finished": [], "measurements": [], "prefills": [], "running": 0}
        t_end = time.perf_counter() + budget_s
        while True:
            got = self.poll(max(0.0, t_end - time.perf_counter()))
            for k in ("finished", "measurements", "prefills"):
                out[k] += got[k]
            out["running"] = got["running"]
            if not got["running"] or (out["finished"] and stop_on_finish) or time.perf_counter() >= t_end:
                return out

    def pause(self) -> None:
        """Stop stepping after the step in progress (tests, and a consistent snapshot)."""
        with self._control():
            self._paused = True

    def unpause(self) -> None:
        with self._control():
            self._paused = False

    def abort_all(self) -> list[ResponseResult]:
        """Abort every live request; return their partial prefixes (possibly empty)."""
        with self._control():
            ids = list(self._live)
            if ids:
                self._engine.abort_request(ids)
            # Finished responses not yet polled are handed back with the partials.
            out, self._finished = self._finished + [self._forget(i)[1] for i in ids], []
            self._burst = _new_burst()  # a prefill burst cut short measures nothing
            return out

    def snapshot(self) -> list[ResponseResult]:
        """Copies of every live response's progress, without interrupting it (checkpoints)."""
        import copy

        with self._control(interrupt=False):
            return [copy.deepcopy(self._partial[i]) for i in self._live]

    def update_weights(self, named_arrays: dict, version: int) -> float:
        """Load new weights in place; requests in flight continue with them.

        ``named_arrays`` are the trainer's parameters, by their Hugging Face names; a tied
        model's holds the embedding alone (the head is the same parameter).

        Every token is computed by exactly one version: the KV cache of a live response was
        computed by the old weights, so each one is re-submitted as ``prompt + tokens so far``
        with the rest of its budget (one re-prefill each), and its later tokens and log-probs
        are those of the new weights alone.

        Returns the seconds the load took here, from the end of the decode step in progress
        (a wait, not part of the sync) to the engine holding the new weights: the weight-sync
        model's measurement (``WeightsSynced.load_s``).
        """
        import torch

        tensors = ((k, torch.from_numpy(v.copy() if not v.flags.writeable else v))
                   for k, v in named_arrays.items())
        with self._control():
            t0 = time.perf_counter()  # the load alone: not the wait for the step in progress
            self._llm.collective_rpc("reload_weights",
                                     kwargs={"weights_iterator": tensors, "is_checkpoint_format": True})
            if self._tied_cpu_head:
                self._llm.collective_rpc(repack_tied_lm_head)
            self._llm.reset_prefix_cache()
            self.version = version
            self._restart_live()
        return time.perf_counter() - t0

    set_weights = update_weights  # the name every role's weight refresh has (worker.host)

    def validate(self, prompts: list[list[int]], max_new_tokens: int, temperature: float = 0.0,
                 seed: int = 0) -> dict:
        """One response per prompt with the current weights, outside the training requests.

        The training requests in flight are set aside (aborted, their progress kept) while the
        validation requests run to completion, then re-submitted as after a weight update, so
        their tokens and versions are unaffected.  Greedy at ``temperature=0``.
        """
        from vllm import SamplingParams

        with self._control():  # the generating thread waits while validation has the engine
            t0 = time.perf_counter()
            held = list(self._live)
            if held:
                self._engine.abort_request(held)
            aside = [self._forget(rid) for rid in held]
            self._restarts += 1
            ids = [f"val{self._restarts}.{i}" for i in range(len(prompts))]
            for i, (rid, prompt) in enumerate(zip(ids, prompts, strict=True)):
                sp = SamplingParams(max_tokens=max_new_tokens, temperature=temperature,
                                    seed=None if temperature == 0 else seed + i)
                self._engine.add_request(rid, {"prompt_token_ids": list(prompt)}, sp)
            out: dict[str, list[int]] = {}
            reasons: dict[str, str | None] = {}
            while len(out) < len(ids):
                for o in self._engine.step():
                    if o.finished and o.request_id.startswith("val"):
                        out[o.request_id] = list(o.outputs[0].token_ids)
                        reasons[o.request_id] = o.outputs[0].finish_reason
            for r, res in aside:
                self._restarts += 1
                self._add(f"{r.request_id}.u{self._restarts}", r, self._restarted(r, res))
            return {"version": self.version, "responses": [out[i] for i in ids],
                    "finish_reasons": [reasons[i] for i in ids], "seconds": time.perf_counter() - t0}

    def sleep(self) -> None:
        """Give memory back while parked: KV cache on CUDA (vLLM sleep level 1)."""
        self.abort_all()
        if self._on_cuda():
            with self._control():
                self._llm.sleep(level=1)

    def wake(self) -> None:
        with self._control():
            if self._on_cuda():
                self._llm.wake_up()
            self._llm.reset_prefix_cache()

    @staticmethod
    def _on_cuda() -> bool:
        import torch

        return torch.cuda.is_available()

    def release(self) -> None:
        """Drop the engine and its memory (the role's C_out)."""
        self.abort_all()
        with self._control():
            self._closed = True
        self._thread.join()
        del self._engine
        del self._llm
        gc.collect()

    # -- the generating thread ---------------------------------------------------------
    @contextmanager
    def _control(self, interrupt: bool = True):
        """Hold the engine between two steps; ``interrupt`` wakes a poll in flight.

        ``_waiting`` keeps the stepper from starting another step while a control call
        waits for the one in progress, so a control call waits for at most one step.
        """
        with self._gate:
            self._waiting += 1
        self._cv.acquire()
        try:
            while self._stepping:
                self._cv.wait()
        finally:
            with self._gate:
                self._waiting -= 1
        try:
            yield
        finally:
            self._interrupt = self._interrupt or interrupt
            self._cv.notify_all()
            self._cv.release()

    def _generate(self) -> None:
        """Step the engine while requests are live; control calls go between steps.

        The engine step runs outside the condition's lock (``_stepping`` marks it), so a
        poll can drain the outbox while the next step runs.

        The thread first takes the engine's thread count: OpenMP's is per thread, a new
        thread starts with the machine's, and once any ``torch.set_num_threads`` ran in the
        process (a trainer, vLLM itself) the first parallel torch op in this thread switches
        it to that value mid-step, and vLLM's CPU attention, which planned with the other,
        fails (``Check failed: input->metadata->thread_num == thread_num (2 vs. 1)``).
        """
        from bidirl.engines.trainer_torch import set_torch_threads

        set_torch_threads(self._threads)
        while True:
            with self._cv:
                while not self._closed and (self._waiting or self._paused or not self._live
                                            or self._error is not None):
                    self._cv.wait(0.05 if self._waiting else None)
                if self._closed:
                    return
                self._stepping = True
                # vLLM runs at most max_num_seqs requests; the others wait for a slot.  A step
                # prefills only when a request without its first token has a slot: one that
                # waits is neither prefilled nor decoded, so it counts in neither model.
                decoding = len(self._live) - len(self._unprefilled)  # requests past their prefill
                prefilling = bool(self._unprefilled) and decoding < self._max_seqs
                batch = decoding
                ctx = sum(n for rid, n in self._context.items() if rid not in self._unprefilled)
            outputs, took, error = None, 0.0, None
            try:
                t0 = time.perf_counter()
                outputs = self._engine.step()
                took = time.perf_counter() - t0
            except Exception as e:  # surfaced by the next poll
                error = e
            with self._cv:
                self._stepping = False
                if error is None:
                    try:
                        self._after_step(outputs, took, prefilling, decoding, batch, ctx)
                    except Exception as e:  # a bookkeeping bug must surface, not kill the thread
                        error = e
                if error is not None:
                    self._error = error
                self._cv.notify_all()

    def _after_step(self, outputs, took: float, prefilling: bool, decoding: int, batch: int,
                    ctx: int) -> None:
        """Absorb one engine step's outputs and time it (under the condition's lock)."""
        left = dict(self._unprefilled)
        for out in outputs:
            res = self._absorb(out)
            if res is not None:
                self._finished.append(res)
        if not prefilling:
            self._measurements.append((batch, ctx, took))
            self._decode_step_s = took
            self._decode_steps.append(took)
            return
        b = self._burst  # see the module docstring: a burst, not a decode step
        b[0] += sum(n for rid, n in left.items() if rid not in self._unprefilled)
        b[1] += max(0.0, took - (self._decode_step_s if decoding else 0.0))
        b[2] += 1
        b[3] += batch
        b[4] += ctx
        b[5] += took
        ref = median(self._decode_steps) if decoding and self._decode_steps else 0.0
        b[6] += max(0.0, took - ref)
        if not self._unprefilled or len(self._live) - len(self._unprefilled) >= self._max_seqs:
            self._prefills.append(PrefillBurst(*b))
            self._burst = _new_burst()

    # -- internals --------------------------------------------------------------------
    def _add(self, rid: str, r: ResponseRequest, res: ResponseResult) -> None:
        """Start engine request ``rid`` continuing ``res`` (the response so far) of ``r``."""
        from vllm import SamplingParams

        done = len(res.token_ids)
        # A restarted response must not replay the random stream that made its prefix.
        seed = r.seed if done == len(r.prefix_ids) else (r.seed * 1_000_003 + done) & 0x7FFFFFFF
        sp = SamplingParams(max_tokens=r.max_new_tokens - done, temperature=r.temperature,
                            top_p=self.top_p, top_k=self.top_k, logprobs=0, seed=seed,
                            min_tokens=max(0, min(self.min_tokens, r.max_new_tokens) - done))
        context = r.prompt_ids + res.token_ids
        self._engine.add_request(rid, {"prompt_token_ids": context}, sp)
        self._live[rid], self._partial[rid], self._base[rid] = r, res, done
        self._context[rid] = len(context)
        self._unprefilled[rid] = len(context)

    def _forget(self, rid: str) -> tuple[ResponseRequest, ResponseResult]:
        """Drop engine request ``rid`` from the bookkeeping; returns its request and progress."""
        self._context.pop(rid)
        self._base.pop(rid)
        self._unprefilled.pop(rid, None)
        return self._live.pop(rid), self._partial.pop(rid)

    def _restart_live(self) -> None:
        """Re-prefill every live response (after a weight update: no KV from old weights)."""
        ids = list(self._live)
        if not ids:
            return
        self._engine.abort_request(ids)
        for rid in ids:
            r, res = self._forget(rid)
            self._restarts += 1
            self._add(f"{r.request_id}.u{self._restarts}", r, self._restarted(r, res))

    def _restarted(self, r: ResponseRequest, res: ResponseResult) -> ResponseResult:
        """What a restarted request continues: its progress, or nothing (reproducible mode)."""
        return self._empty_result(r) if self.reproducible else res

    def _empty_result(self, r: ResponseRequest) -> ResponseResult:
        return ResponseResult(r.group_id, r.index, r.prompt_ids, list(r.prefix_ids),
                              list(r.prefix_logprobs), list(r.prefix_versions), False, None,
                              r.max_new_tokens, r.temperature, r.seed)

    def _absorb(self, out) -> ResponseResult | None:
        rid = out.request_id
        req, res = self._live.get(rid), self._partial.get(rid)
        if req is None:
            return None
        comp = out.outputs[0]
        new_ids = list(comp.token_ids)
        have = len(res.token_ids) - self._base[rid]
        fresh = new_ids[have:]
        if fresh:
            lps = comp.logprobs or []
            for j, tok in enumerate(fresh, start=have):
                entry = lps[j] if j < len(lps) else None
                res.token_ids.append(tok)
                res.logprobs.append(float(entry[tok].logprob) if entry and tok in entry else 0.0)
                res.versions.append(self.version)
            self._context[rid] += len(fresh)
            self._unprefilled.pop(rid, None)
        if out.finished:
            res.finished = True
            res.finish_reason = comp.finish_reason
            self._forget(rid)
            return res
        return None
