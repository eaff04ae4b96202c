"""Reference rollout engines on HF transformers: simple, exact, slow.

Why keep one: it is the ground truth that vLLM's sampled-token log-probs are checked against,
and :class:`AsyncHFEngine` is a real (not mocked) streaming engine that starts in a second,
so runtime tests can exercise abort / resume / weight updates without a vLLM subprocess.

Decoding is one request at a time with a KV cache. Sampling uses a per-request
``torch.Generator`` seeded by :func:`~bidirl.engines.base.resume_seed`; log-probs are of the
untempered distribution (``log_softmax(logits)``), matching vLLM's ``raw_logprobs`` mode, while
the token is drawn from ``softmax(logits / temperature)`` (top-p filtered).

When weights change mid-request (async engine) the KV cache is dropped and the context is
re-encoded with the new weights, so every token after the update is computed by the new
version only.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from bidirl.engines.base import (
    GenerationRequest,
    GenerationResult,
    already_done,
    gather_streams,
    resume_seed,
    start_result,
)
from bidirl.engines.trainer_torch import set_torch_threads


def sample_token(
    logits_V: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator
) -> tuple[int, float]:
    """Draw one token; return it with its untempered log-prob."""
    logits_V = logits_V.float()
    logprobs_V = torch.log_softmax(logits_V, dim=-1)
    if temperature == 0:
        token = int(torch.argmax(logits_V))
        return token, float(logprobs_V[token])
    probs_V = torch.softmax(logits_V / temperature, dim=-1)
    if top_p < 1.0:
        sorted_V, order_V = torch.sort(probs_V, descending=True)
        keep_V = torch.cumsum(sorted_V, 0) - sorted_V < top_p  # always keeps the top token
        probs_V = torch.zeros_like(probs_V).scatter(0, order_V[keep_V], sorted_V[keep_V])
    token = int(torch.multinomial(probs_V, 1, generator=generator))
    return token, float(logprobs_V[token])


class HFEngine:
    """Synchronous :class:`~bidirl.engines.base.RolloutEngine` on an HF causal LM."""

    def __init__(self, model_dir: str | Path, seed: int = 0, num_threads: int | None = 1, device: str = "cpu"):
        from transformers import AutoModelForCausalLM

        if num_threads is not None:
            set_torch_threads(num_threads)
        self.model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
        self.model.to(device).eval()
        self.device = device
        self.seed = seed
        self.eos_token_id = int(self.model.config.eos_token_id)
        self.version = 0

    def stop_ids(self, request: GenerationRequest) -> tuple[int, ...]:
        return tuple(request.stop_token_ids) if request.stop_token_ids is not None else (self.eos_token_id,)

    @torch.no_grad()
    def decode(self, request: GenerationRequest, state: GenerationResult) -> Iterator[None]:
        """Extend ``state`` one token per iteration until stop or budget (sets finish fields)."""
        from transformers import DynamicCache

        gen = torch.Generator().manual_seed(resume_seed(request, self.seed))
        stop = self.stop_ids(request)
        context = list(request.prompt_token_ids) + list(state.token_ids)
        cache, cache_version = None, None
        for _ in range(request.max_new_tokens):
            if cache is None or cache_version != self.version:
                cache, cache_version = DynamicCache(), self.version
                ids = torch.tensor([context], device=self.device)
            else:
                ids = torch.tensor([[context[-1]]], device=self.device)
            logits_V = self.model(input_ids=ids, past_key_values=cache, use_cache=True).logits[0, -1]
            token, logprob = sample_token(logits_V, request.temperature, request.top_p, gen)
            context.append(token)
            state.token_ids.append(token)
            state.logprobs.append(logprob)
            state.versions.append(self.version)
            if token in stop:
                state.finished, state.finish_reason = True, "stop"
                return
            yield
        state.finished, state.finish_reason = True, "length"

    def generate_one(self, request: GenerationRequest) -> GenerationResult:
        done = already_done(request, self.stop_ids(request))
        if done is not None:
            return done
        state = start_result(request)
        for _ in self.decode(request, state):
            pass
        return state

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        return [self.generate_one(r) for r in requests]

    @torch.no_grad()
    def update_weights(self, weights: Mapping[str, np.ndarray], version: int) -> None:
        params = dict(self.model.named_parameters())
        unknown = set(weights) - set(params)
        if unknown:
            raise KeyError(f"unknown parameter names: {sorted(unknown)[:5]}")
        for name, array in weights.items():
            params[name].copy_(torch.from_numpy(np.asarray(array)).view_as(params[name]))
        self.version = int(version)

    def close(self) -> None:
        pass


def _snapshot(state: GenerationResult) -> GenerationResult:
    return replace(state, token_ids=list(state.token_ids), logprobs=list(state.logprobs), versions=list(state.versions))


class AsyncHFEngine:
    """:class:`~bidirl.engines.base.StreamingRolloutEngine` over :class:`HFEngine`.

    Requests interleave token by token on the event loop (``await asyncio.sleep(0)`` after each
    token), so aborts and weight updates land between tokens.
    """

    def __init__(self, model_dir: str | Path, seed: int = 0, num_threads: int | None = 1, device: str = "cpu"):
        self.engine = HFEngine(model_dir, seed=seed, num_threads=num_threads, device=device)
        self._live: dict[str, GenerationResult] = {}
        self._aborted: set[str] = set()

    @property
    def version(self) -> int:
        return self.engine.version

    async def stream(self, request: GenerationRequest) -> AsyncIterator[GenerationResult]:
        done = already_done(request, self.engine.stop_ids(request))
        if done is not None:
            yield done
            return
        if request.request_id in self._live:
            raise ValueError(f"request {request.request_id} is already running")
        state = start_result(request)
        self._live[request.request_id] = state
        try:
            for _ in self.engine.decode(request, state):
                yield _snapshot(state)
                await asyncio.sleep(0)
                if request.request_id in self._aborted:
                    state.finish_reason = "abort"
                    yield _snapshot(state)
                    return
            yield _snapshot(state)
        finally:
            self._live.pop(request.request_id, None)
            self._aborted.discard(request.request_id)

    async def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        return await gather_streams(self, requests)

    async def abort(self, request_ids: Sequence[str]) -> list[GenerationResult]:
        out = []
        for rid in request_ids:
            state = self._live.get(rid)
            if state is None or state.finished:
                continue
            self._aborted.add(rid)
            partial = _snapshot(state)
            partial.finish_reason = "abort"
            out.append(partial)
        return out

    async def update_weights(self, weights: Mapping[str, np.ndarray], version: int) -> None:
        self.engine.update_weights(weights, version)

    async def close(self) -> None:
        await self.abort(list(self._live))
