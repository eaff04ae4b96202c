"""A rollout replica's engine requests and the responses they continue.

Each training response is one engine request at a time: added fresh, or re-added (a new
request id) when a weight update or a validation restarted it.  The book keeps, per live
request, the response it continues (:class:`~bidirl.runtime.messages.ResponseResult`, its
tokens so far), its context length and whether it has been prefilled; it turns the
engine's outputs into tokens tagged with the policy version that produced them.

Not thread-safe: ``RolloutRole`` calls it while it holds the engine.
"""

from __future__ import annotations

from dataclasses import dataclass

from bidirl.runtime.messages import ResponseRequest, ResponseResult


@dataclass
class TrainingSampling:
    """How every training request samples (``rollout.top_p``, ``rollout.top_k``; EOS masked
    until ``min_tokens``, ``rollout.min_new_tokens``) and restarts (``reproducible``,
    ``scheduler.reproducible``: see ``RolloutRole``).  Validation requests use none of it."""

    top_p: float = 1.0
    top_k: int = -1
    min_tokens: int = 0
    reproducible: bool = False


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
                            min_tokens=max(0, min(s.min_tokens, r.max_new_tokens) - done))
        context = r.prompt_ids + res.token_ids
        self.engine.add_request(rid, {"prompt_token_ids": context}, sp)
        self.live[rid], self.partial[rid], self.base[rid] = r, res, done
        self.context[rid] = len(context)
        self.unprefilled[rid] = len(context)

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
