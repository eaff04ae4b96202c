"""A rollout replica's engine requests and the responses they continue.

Each training response is one engine request at a time: added fresh, or re-added (a new
request id) when a weight update or a validation restarted it.  The book keeps, per live
request, the response it continues (:class:`~bidirl.runtime.messages.ResponseResult`, its
tokens so far), its context length and whether it has been prefilled; it turns the
engine's outputs into tokens tagged with the policy version that produced them.

A prompt with images goes to the engine as its token ids with one placeholder per image
plus the decoded images (``multi_modal_data``): vLLM expands the placeholders itself, on a
fresh request, a resumed partial and a restart after a weight update alike (the restart
prefills the image again).  The images are decoded once per prompt (:func:`engine_prompt`'s
cache: every response of a group shares one tuple), and a request's context counts the
tokens they add (``image_tokens``), as the engine's KV cache and step times do.

Not thread-safe: ``RolloutRole`` calls it while it holds the engine.
"""

from __future__ import annotations

import functools
import io
from dataclasses import dataclass

from bidirl.runtime.messages import ResponseRequest, ResponseResult


@functools.lru_cache(maxsize=64)  # a replica's groups in flight; decoded images can be MBs each
def decoded_images(images: tuple[bytes, ...]) -> tuple:
    """A prompt's encoded images as RGB PIL images (cached: a group's requests share them)."""
    from PIL import Image  # lazy: only runs with images need it

    return tuple(Image.open(io.BytesIO(b)).convert("RGB") for b in images)


def engine_prompt(token_ids: list[int], images: tuple[bytes, ...] = ()) -> dict:
    """vLLM's prompt for ``token_ids`` (one placeholder per image) and the prompt's images."""
    if not images:
        return {"prompt_token_ids": token_ids}
    return {"prompt_token_ids": token_ids, "multi_modal_data": {"image": list(decoded_images(tuple(images)))}}


@dataclass
class TrainingSampling:
    """How every training request samples (``rollout.top_p``, ``rollout.top_k``; EOS masked
    until ``min_tokens``, ``rollout.min_new_tokens``) and restarts (``reproducible``,
    ``scheduler.reproducible``: see ``RolloutRole``).  Validation requests use none of it."""

    top_p: float = 1.0
    top_k: int = -1
    min_tokens: int = 0
    reproducible: bool = False
    image_tokens: tuple[int, ...] = ()
    """A vision-language model's image placeholder ids (``image_token_id``...), never sampled:
    the trainer's forward would take one in a response for an image's place and find no
    image for it.  Banned by a logit bias, after the behaviour log-probs are taken (vLLM's
    raw log-probs), as ``top_p``/``top_k`` are."""


class RequestBook:
    """The live engine requests of one vLLM engine."""

    def __init__(self, engine, max_num_seqs: int, sampling: TrainingSampling) -> None:
        self.engine = engine
        self.max_num_seqs = max_num_seqs
        self.sampling = sampling
        self.live: dict[str, ResponseRequest] = {}
        self.partial: dict[str, ResponseResult] = {}
        self.context: dict[str, int] = {}  # context tokens (prompt and tokens so far)
        self.base: dict[str, int] = {}  # response tokens before the engine request started
        self.unprefilled: dict[str, int] = {}  # live requests without a token yet: context tokens
        self.restarts = 0

    # -- counts the step timing needs --------------------------------------------------
    @property
    def decoding(self) -> int:
        """Live requests past their prefill."""
        return len(self.live) - len(self.unprefilled)

    def decoding_context(self) -> int:
        """Context tokens of the requests past their prefill."""
        return sum(n for rid, n in self.context.items() if rid not in self.unprefilled)

    @property
    def slots_full(self) -> bool:
        """vLLM runs at most ``max_num_seqs`` requests; no request waiting for one is prefilled."""
        return self.decoding >= self.max_num_seqs

    def tag(self) -> int:
        """A number no engine request id of this book has used."""
        self.restarts += 1
        return self.restarts

    # -- adding and dropping -------------------------------------------------------------
    def add(self, rid: str, r: ResponseRequest, res: ResponseResult) -> None:
        """Start engine request ``rid`` continuing ``res`` (the response so far) of ``r``."""
        from vllm import SamplingParams  # lazy: vLLM loads in the replica's process only

        done = len(res.token_ids)
        # A restarted response must not replay the random stream that made its prefix.
        seed = r.seed if done == len(r.prefix_ids) else (r.seed * 1_000_003 + done) & 0x7FFFFFFF
        s = self.sampling
        sp = SamplingParams(max_tokens=r.max_new_tokens - done, temperature=r.temperature,
                            top_p=s.top_p, top_k=s.top_k, logprobs=0, seed=seed,
                            min_tokens=max(0, min(s.min_tokens, r.max_new_tokens) - done),
                            logit_bias={t: -100.0 for t in s.image_tokens} or None)
        context = r.prompt_ids + res.token_ids
        self.engine.add_request(rid, engine_prompt(context, r.images), sp)
        self.live[rid], self.partial[rid], self.base[rid] = r, res, done
        self.context[rid] = len(context) + r.image_tokens
        self.unprefilled[rid] = len(context) + r.image_tokens

    def forget(self, rid: str) -> tuple[ResponseRequest, ResponseResult]:
        """Drop engine request ``rid`` from the book; returns its request and progress."""
        self.context.pop(rid)
        self.base.pop(rid)
        self.unprefilled.pop(rid, None)
        return self.live.pop(rid), self.partial.pop(rid)

    def set_aside(self) -> list[tuple[ResponseRequest, ResponseResult]]:
        """Abort every live request; each one's request and progress, in order."""
        ids = list(self.live)
        if ids:
            self.engine.abort_request(ids)
        return [self.forget(rid) for rid in ids]

    def resume(self, aside: list[tuple[ResponseRequest, ResponseResult]]) -> None:
        """Re-submit what :meth:`set_aside` returned, each as a new engine request: its
        progress so far, or (reproducible mode) nothing."""
        for r, res in aside:
            self.add(f"{r.request_id}.u{self.tag()}", r, ResponseResult.start(r) if self.sampling.reproducible else res)

    # -- the engine's outputs ----------------------------------------------------------
    def absorb(self, out, version: int) -> ResponseResult | None:
        """Append a step's new tokens of ``out`` (tagged ``version``); the response if it finished."""
        rid = out.request_id
        req, res = self.live.get(rid), self.partial.get(rid)
        if req is None:
            return None
        comp = out.outputs[0]
        new_ids = list(comp.token_ids)
        have = len(res.token_ids) - self.base[rid]
        fresh = new_ids[have:]
        if fresh:
            lps = comp.logprobs or []
            for j, tok in enumerate(fresh, start=have):
                entry = lps[j] if j < len(lps) else None
                res.token_ids.append(tok)
                res.logprobs.append(float(entry[tok].logprob) if entry and tok in entry else 0.0)
                res.versions.append(version)
            self.context[rid] += len(fresh)
            self.unprefilled.pop(rid, None)
        if out.finished:
            res.finished = True
            res.finish_reason = comp.finish_reason
            self.forget(rid)
            return res
        return None
