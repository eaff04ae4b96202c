"""A rollout replica as a role a device worker hosts: vLLM generating on its own thread.

The replica generates continuously: a thread of the worker steps vLLM's in-process
``LLMEngine`` (``step()`` is one continuous-batching iteration) while requests are live,
and finished responses collect in an outbox that the driver drains with ``poll``, a call
that blocks until something finished.  No driver round trip sits between two decode
steps.  Everything else the driver sends (new requests, new weights, a reclaim's
``abort_all``, a checkpoint's ``snapshot``) arrives out of band, on another thread of the
actor, and takes the engine between two steps: the stepping thread yields after each
step to a waiting control call, so a reclaim takes effect within one decode step.
Each step is timed for the stage models (decode steps, prefill bursts:
``runtime/rollout_timing.py``); the live requests are kept in a book
(``runtime/rollout_requests.py``); what crosses to the driver is in ``runtime/messages.py``.

Every generated token is tagged with the policy version the engine held when the token
was produced; a resumed response keeps its prefix's tokens, log-probs and versions, so
staleness is counted from its oldest token wherever it finishes.  This is the project's
one rollout engine; ``tests/runtime/test_rollout_role.py`` checks it against the HF model.
"""

from __future__ import annotations

import copy
import gc
import threading
import time
from contextlib import contextmanager

from bidirl.runtime.messages import ResponseRequest, ResponseResult
from bidirl.runtime.rollout_requests import RequestBook, TrainingSampling, engine_prompt
from bidirl.runtime.rollout_timing import StepTiming
from bidirl.runtime.vllm_env import apply_vllm_env


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


def image_placeholder_ids(hf_config) -> tuple[int, ...]:
    """The ids a vision-language model's processor puts in an image's (or a video's) place."""
    names = ("image_token_id", "image_token_index", "video_token_id")
    return tuple(sorted({v for n in names if isinstance(v := getattr(hf_config, n, None), int) and v >= 0}))


class RolloutRole:
    """A vLLM engine in this process, with version-tagged, abortable, resumable requests."""

    def __init__(self, model_dir: str, *, max_num_seqs: int = 128, max_model_len: int = 512,
                 dtype: str = "float32", seed: int = 0, device: str = "cpu",
                 kv_cache_bytes: int = 256 << 20, top_p: float = 1.0, top_k: int = -1,
                 min_tokens: int = 0, reproducible: bool = False, max_images: int = 0,
                 lora_scale: float | None = None, tensor_parallel_size: int = 1) -> None:
        """``reproducible`` (``scheduler.reproducible``): a response whose engine request is
        restarted (a weight update, a validation) starts again from its first token with its
        own seed, instead of continuing from its tokens so far on a new random stream.
        ``min_tokens`` (``rollout.min_new_tokens``): EOS is masked until a training response
        has that many tokens (capped at its ``max_new_tokens``); validation is not forced.
        ``max_images``: the most images one prompt holds (vLLM's ``limit_mm_per_prompt``; 0:
        the model's own default).  ``lora_scale`` (``model.lora_alpha / lora_rank``): weights
        arrive as LoRA adapters, merged into the base weights kept here (``engines/lora.py``).
        ``tensor_parallel_size`` > 1: the engine's shards run in vLLM's own processes (its
        ``mp`` executor), which this role starts and stops (``runtime/placement.py``)."""
        apply_vllm_env()
        import torch  # lazy, as vLLM: both load after apply_vllm_env (thread counts, compile flags)
        from vllm import LLM

        self.version = 0
        self.model_dir = model_dir
        self._lora = None
        if lora_scale is not None:
            from bidirl.engines.lora import AdapterMerge  # lazy: torch, which loads after apply_vllm_env

            self._lora = AdapterMerge(model_dir, lora_scale)
        self._llm = LLM(model=model_dir, dtype=dtype, tensor_parallel_size=tensor_parallel_size,
                        distributed_executor_backend="uni" if tensor_parallel_size == 1 else "mp",
                        max_model_len=max_model_len, max_num_seqs=max_num_seqs,
                        enforce_eager=True, seed=seed, enable_prefix_caching=False,
                        use_tqdm_on_load=False,
                        # Explicit: otherwise vLLM sizes the KV cache from (shared) host memory.
                        kv_cache_memory_bytes=kv_cache_bytes, **engine_batching(),
                        **({"limit_mm_per_prompt": {"image": max_images}} if max_images else {}),
                        # a parked replica on a GPU frees its KV cache (sleep level 1): vLLM needs it asked for
                        **({"enable_sleep_mode": True} if torch.cuda.is_available() else {}))
        self._engine = self._llm.llm_engine
        hf = self._engine.vllm_config.model_config.hf_config
        self._tied_cpu_head = vllm_on_cpu() and bool(getattr(hf.get_text_config(), "tie_word_embeddings", False))
        self.sampling = TrainingSampling(top_p, top_k, min_tokens, reproducible,  # may change between requests
                                         image_placeholder_ids(hf))
        self._requests = RequestBook(self._engine, max_num_seqs, self.sampling)
        # The outbox poll drains, and what guards it and the engine (see the module doc).
        self._finished: list[ResponseResult] = []
        self._timing = StepTiming()
        self._cv = threading.Condition()
        self._gate = threading.Lock()
        self._waiting = 0  # control calls waiting for the engine: the stepper yields to them
        self._interrupt = False  # a control call arrived: a poll in flight returns now
        self._paused = False
        self._stepping = False  # the engine is in step(), outside the lock
        self._closed = False
        self._error: BaseException | None = None
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
                self._requests.add(r.request_id, r, ResponseResult.start(r))

    @property
    def running(self) -> int:
        return len(self._requests.live)

    def poll(self, timeout_s: float) -> dict:
        """Drain the outbox; wait up to ``timeout_s`` for a response to finish first.

        Returns at once when something finished, when nothing is live, or when a control
        call arrived (so the driver's calls queued behind this one are not held up).
        ``measurements`` holds ``(batch, context_tokens, seconds)`` per decode step since
        the last poll, ``prefills`` a :class:`PrefillBurst` per prefill burst.
        """
        deadline = time.perf_counter() + timeout_s
        with self._cv:
            while not (self._finished or self._interrupt or self._error or not self._requests.live or self._paused):
                left = deadline - time.perf_counter()
                if left <= 0:
                    break
                self._cv.wait(left)
            self._interrupt = False
            if self._error is not None:
                raise RuntimeError(f"the rollout engine failed: {self._error!r}") from self._error
            measurements, prefills = self._timing.take()
            out = {"finished": self._finished, "measurements": measurements, "prefills": prefills,
                   "running": len(self._requests.live)}
            self._finished = []
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
            # Finished responses not yet polled are handed back with the partials.
            out, self._finished = self._finished + [res for _, res in self._requests.set_aside()], []
            self._timing.cut_burst()
            return out

    def snapshot(self) -> list[ResponseResult]:
        """Copies of every live response's progress, without interrupting it (checkpoints)."""
        with self._control(interrupt=False):
            return [copy.deepcopy(self._requests.partial[i]) for i in self._requests.live]

    def update_weights(self, named_arrays: dict, version: int) -> float:
        """Load new weights in place; requests in flight continue with them.

        ``named_arrays`` are the trainer's parameters, by their Hugging Face names; a tied
        model's holds the embedding alone (the head is the same parameter).  With LoRA they
        are its adapters, merged here, before the engine is taken, into every weight loaded.

        Every token is computed by exactly one version: the KV cache of a live response was
        computed by the old weights, so each one is re-submitted as ``prompt + tokens so far``
        with the rest of its budget (one re-prefill each), and its later tokens and log-probs
        are those of the new weights alone.

        Returns the seconds the load took here, from the end of the decode step in progress
        (a wait, not part of the sync) to the engine holding the new weights: the weight-sync
        model's measurement (``WeightsSynced.load_s``).
        """
        import torch  # lazy: see __init__ (loaded there already)
        if self._lora is not None:
            tensors = iter(self._lora.merged(named_arrays).items())
        else:  # tensors: a collective's buckets on CUDA; arrays from Ray's store may be read-only
            tensors = ((k, v if isinstance(v, torch.Tensor) else torch.from_numpy(v if v.flags.writeable else v.copy()))
                       for k, v in named_arrays.items())
        tensors = list(tensors) if self._tp > 1 else tensors  # to each shard's process: a generator won't pickle
        with self._control():
            t0 = time.perf_counter()  # the load alone: not the wait for the step in progress
            self._llm.collective_rpc("reload_weights", kwargs={"weights_iterator": tensors,
                                                               "is_checkpoint_format": True})
            if self._tied_cpu_head:
                self._llm.collective_rpc(repack_tied_lm_head)
            self._llm.reset_prefix_cache()
            self.version = version
            # no KV cache from the old weights: every live response is prefilled again, and no
            # image features from the old vision tower: their images are encoded again
            aside = self._requests.set_aside()
            self._engine.reset_encoder_cache()
            self._requests.resume(aside)
        return time.perf_counter() - t0

    set_weights = update_weights  # the name every role's weight refresh has (worker.host)

    def validate(self, prompts: list[list[int]], max_new_tokens: int, temperature: float = 0.0,
                 seed: int = 0, images: list[tuple[bytes, ...]] | None = None) -> dict:
        """One response per prompt with the current weights, outside the training requests.

        The training requests in flight are set aside (aborted, their progress kept) while the
        validation requests run to completion, then re-submitted as after a weight update, so
        their tokens and versions are unaffected.  Greedy at ``temperature=0``.  ``images``:
        each prompt's images (one placeholder token per image in its ids), if any.
        """
        from vllm import SamplingParams  # lazy: loaded in __init__, after apply_vllm_env

        with self._control():  # the generating thread waits while validation has the engine
            t0 = time.perf_counter()
            aside = self._requests.set_aside()
            tag = self._requests.tag()
            ids = [f"val{tag}.{i}" for i in range(len(prompts))]
            for i, (rid, prompt) in enumerate(zip(ids, prompts, strict=True)):
                sp = SamplingParams(max_tokens=max_new_tokens, temperature=temperature,
                                    seed=None if temperature == 0 else seed + i)
                self._engine.add_request(rid, engine_prompt(list(prompt), images[i] if images else ()), sp)
            out: dict[str, list[int]] = {}
            reasons: dict[str, str | None] = {}
            while len(out) < len(ids):
                for o in self._engine.step():
                    if o.finished and o.request_id.startswith("val"):
                        out[o.request_id] = list(o.outputs[0].token_ids)
                        reasons[o.request_id] = o.outputs[0].finish_reason
            self._requests.resume(aside)
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

    _tp = property(lambda self: self._engine.vllm_config.parallel_config.tensor_parallel_size)

    @staticmethod
    def _on_cuda() -> bool:
        import torch  # lazy: see __init__ (loaded there already)

        return torch.cuda.is_available()

    def release(self) -> None:
        """Drop the engine and its memory (the role's C_out)."""
        self.abort_all()
        with self._control():
            self._closed = True
        self._thread.join()
        if self._tp > 1:  # the shards' processes: stopped now, not whenever the engine is collected
            self._engine.engine_core.shutdown()
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
        # lazy: pulls in torch, which loads after apply_vllm_env (see __init__)
        from bidirl.engines.torch_setup import set_torch_threads

        set_torch_threads(self._threads)
        while True:
            with self._cv:
                while not self._closed and (self._waiting or self._paused or not self._requests.live
                                            or self._error is not None):
                    self._cv.wait(0.05 if self._waiting else None)
                if self._closed:
                    return
                self._stepping = True
                # vLLM runs at most max_num_seqs requests; the others wait for a slot.  A step
                # prefills only when a request without its first token has a slot: one that
                # waits is neither prefilled nor decoded, so it counts in neither model.
                decoding = self._requests.decoding  # requests past their prefill: the batch
                prefilling = bool(self._requests.unprefilled) and not self._requests.slots_full
                ctx = self._requests.decoding_context()
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
                        self._after_step(outputs, took, prefilling, decoding, ctx)
                    except Exception as e:  # a bookkeeping bug must surface, not kill the thread
                        error = e
                if error is not None:
                    self._error = error
                self._cv.notify_all()

    def _after_step(self, outputs, took: float, prefilling: bool, decoding: int, ctx: int) -> None:
        """Absorb one engine step's outputs and time it (under the condition's lock)."""
        book = self._requests
        left = dict(book.unprefilled)
        for out in outputs:
            res = book.absorb(out, self.version)
            if res is not None:
                self._finished.append(res)
        if not prefilling:
            self._timing.decode_step(decoding, ctx, took)
            return
        tokens = sum(n for rid, n in left.items() if rid not in book.unprefilled)
        self._timing.prefill_step(tokens, took, decoding, ctx,
                                  burst_over=not book.unprefilled or book.slots_full)
