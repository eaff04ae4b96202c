"""What crosses the worker boundary between the driver and a rollout replica.

A replica is built from :func:`rollout_wire`'s arguments (the train config's fields it
reads, as plain data: ``trainer_wire`` in ``engines/trainer_config.py`` is the trainer's
counterpart).  The driver's group store sends requests (:class:`ResponseRequest`: fresh, or resuming a
partial response), the replica (``runtime/rollout_role.py``) hands back results
(:class:`ResponseResult`: finished, or partial after a reclaim) and, per ``poll``, a
:class:`PrefillBurst` per prefill it timed.  Plain data with no vLLM or torch behind it,
so driver-side code (the group store, the rollout driver, the tests' fake devices) imports
them without the engine's module.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from bidirl.runtime.config import TrainConfig


def rollout_wire(cfg: TrainConfig, model_dir: str, max_model_len: int, max_images: int = 0) -> dict[str, Any]:
    """``RolloutRole``'s keyword arguments for a run: what a device worker is sent to host a
    replica (``host("rollout", **wire)``); ``max_model_len`` is measured from the prompts (image
    tokens counted), ``max_images`` is the most images a prompt holds (vLLM's
    ``limit_mm_per_prompt``; 0: a text run, no limit sent)."""
    wire = dict(model_dir=model_dir, max_num_seqs=cfg.rollout.max_num_seqs, max_model_len=max_model_len,
                dtype=cfg.model.dtype, kv_cache_bytes=cfg.rollout.kv_cache_mb << 20,
                top_p=cfg.rollout.top_p, top_k=cfg.rollout.top_k, min_tokens=cfg.rollout.min_new_tokens,
                reproducible=cfg.scheduler.reproducible)
    if max_images:
        wire["max_images"] = max_images
    if cfg.rollout.tensor_parallel_size > 1:
        wire["tensor_parallel_size"] = cfg.rollout.tensor_parallel_size
    if cfg.model.lora_rank:  # the replica merges each adapter it is sent (engines/lora.py)
        wire["lora_scale"] = cfg.model.lora_alpha / cfg.model.lora_rank
    return wire


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
    images: tuple[bytes, ...] = ()
    """The prompt's images, encoded (PNG, JPEG...): one per placeholder token in ``prompt_ids``."""
    image_tokens: int = 0
    """Tokens the images add to the prompt once vLLM expands their placeholders."""

    @property
    def request_id(self) -> str:
        return f"g{self.group_id}.r{self.index}.p{len(self.prefix_ids)}"


@dataclass
class ResponseResult:
    """A response as far as it got: every token with its log-prob and the policy version
    that produced it; ``finished`` once the engine ended it (``finish_reason``)."""

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
    images: tuple[bytes, ...] = ()
    """The prompt's images (``ResponseRequest.images``): a partial resumes with them elsewhere."""
    image_tokens: int = 0
    # A multi-turn trajectory (``runtime/trajectories.py``): the response's tokens hold every
    # turn after the prompt, the environment's masked out of the loss; None on a single turn.
    loss_mask: list[int] | None = None
    """1 on the model's tokens, 0 on the environment's (trajectories only)."""
    env_reward: float | None = None
    """The episode's return: its training reward in place of the reward function's."""
    outcome: str | None = None
    """How the episode ended (``algo/episode.OUTCOMES``)."""
    turns: int = 0
    """The model's turns in it."""
    env_seconds: float = 0.0
    """Wall time in the environment's calls."""

    @classmethod
    def start(cls, r: ResponseRequest) -> ResponseResult:
        """``r``'s response before the engine added a token: its prefix, if it resumes one."""
        return cls(r.group_id, r.index, r.prompt_ids, list(r.prefix_ids), list(r.prefix_logprobs),
                   list(r.prefix_versions), False, None, r.max_new_tokens, r.temperature, r.seed,
                   r.images, r.image_tokens)

    def as_request(self) -> ResponseRequest:
        """Resume this partial response from where it stopped (with its prompt's images)."""
        return ResponseRequest(self.group_id, self.index, self.prompt_ids,
                               self.max_new_tokens, self.temperature, self.seed + 7919,
                               list(self.token_ids), list(self.logprobs), list(self.versions),
                               self.images, self.image_tokens)


class PrefillBurst(NamedTuple):
    """One prefill burst as ``RolloutRole.poll`` reports it (``prefills``): consecutive engine
    steps that prefilled (``runtime/rollout_timing.py``)."""

    tokens: int  # prompt tokens prefilled
    steps: int  # engine steps in the burst
    batch: int  # requests past their prefill that its steps decoded, summed over its steps
    context: int  # their context tokens, summed over its steps
    seconds: float  # its steps' whole time
    beyond_median_s: float  # its steps' time beyond the recent decode steps' median: the measurement
