"""Laying a training step out: score its groups, cut its samples into the controller's
micro-batches, then set each sample's advantage (``algorithm.adv_estimator`` over the whole
step; with ``algorithm.use_kl_in_reward``, once the reference KL of every response is known).

Split from ``train_driver.py``, which issues the step's calls: here is what one step trains
on, and the record of it (``StepRecord``) that metrics, audits and the calibrated scenario read.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass, field

from bidirl.algo.reward_shaping import kl_penalised
from bidirl.controller.actions import StartTrainStep
from bidirl.core.staleness import staleness_at_training


@dataclass
class StepRecord:
    """What the driver saw of one training step (for metrics and audits)."""

    step: int
    group_ids: tuple[int, ...]
    rewards: list[float]
    staleness: list[int]
    response_tokens: int
    total_tokens: int
    started_s: float
    finished_s: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict)
    chunks: list[tuple[str, int]] = field(default_factory=list)  # (executor, micro-batches)
    c_grad_s: list[float] = field(default_factory=list)
    # dynamic sampling: the step's filtered groups (set by the step boundary); None: filtering is off
    filtered: tuple[int, ...] | None = None
    extra_metrics: dict[str, float] = field(default_factory=dict)  # the driver's own (KL in the reward)
    # images in the step's prompts, one count per group (all its responses share them): how
    # many, their encoded bytes and pixels (what a calibrated scenario describes)
    images: int = 0
    image_bytes: int = 0
    image_pixels: int = 0


@dataclass
class Layout:
    """A step laid out before its advantages: the samples (dicts, in group-id order, shared
    with ``mbs``), their micro-batches, the loss normalisers and the groups' training rewards."""

    rec: StepRecord
    mbs: list[list[dict]]
    totals: object
    rewards: list[list[float]]
    samples: list[dict]


def _pixels(data: bytes) -> int:
    """An encoded image's pixels, from its header (PIL opens lazily: nothing is decoded)."""
    from PIL import Image  # lazy: only steps with images need it

    with Image.open(io.BytesIO(data)) as im:
        return im.size[0] * im.size[1]


def _ragged(flat: list, sizes: list[int]) -> list[list]:
    out, k = [], 0
    for n in sizes:
        out.append(flat[k:k + n])
        k += n
    return out


def lay_out(ex, a: StartTrainStep) -> Layout:  # ex: the DeviceExecutor
    """Score the batch and cut its samples, in group-id order, into the micro-batches; the
    step's loss normalisers.  The advantages come after (``set_advantages``)."""
    from bidirl.algo.aggregation import StepTotals  # lazy: pulls in torch, which the executor's module
    # does not need until a step is laid out

    job, voff = ex.job, ex.job.version_offset
    gids = [job.ids.global_id(g) for g in a.group_ids]
    rewards = job.store.score_step(gids, job.reward_fn, job.decode)
    samples, stale = [], []
    step = a.step + voff
    groups = [job.store.groups[g] for g in gids]
    for g, rec in zip(gids, groups):
        v_first = job.store.versions(g)[0]
        stale.append(staleness_at_training(step, v_first if v_first is not None else step))
        for i in range(rec.n):
            r = rec.done[i]
            sample = {"prompt_ids": rec.trained_prompt_ids, "response_ids": r.token_ids,
                      "behaviour_logprobs": r.logprobs, "advantage": 0.0}
            if r.loss_mask is not None:  # a trajectory: its own prompt (reset's), the environment masked
                sample["prompt_ids"], sample["loss_mask"] = r.prompt_ids, r.loss_mask
            if rec.images:  # the trainer runs the model's image processor on them
                sample["images"] = rec.images
            samples.append(sample)
    sizes = [mb.samples for mb in a.micro_batches]
    if sum(sizes) != len(samples):
        raise RuntimeError(f"step {a.step}: micro-batches cover {sum(sizes)} samples, batch has {len(samples)}")
    mbs, k = [], 0
    for n in sizes:
        mbs.append(samples[k:k + n])
        k += n
    total = sum(trained_tokens(s) for s in samples)
    rec = StepRecord(step, tuple(gids), [x for r in rewards for x in r], stale, total,
                     sum(len(s["response_ids"]) + len(s["prompt_ids"]) for s in samples), ex.now())
    for g in groups:
        for data in g.images:
            rec.images += 1
            rec.image_bytes += len(data)
            rec.image_pixels += _pixels(data)
    return Layout(rec, mbs, StepTotals.of(trained_tokens(s) for s in samples), rewards, samples)


def trained_tokens(sample: dict) -> int:
    """The response tokens a sample trains on: all of them, or a trajectory's model tokens."""
    mask = sample.get("loss_mask")
    return len(sample["response_ids"]) if mask is None else sum(mask)


def set_advantages(alg, lay: Layout, kl_sums: list[float] | None) -> None:
    """Each sample's advantage (``algorithm.adv_estimator``, over the whole step), from its
    training reward, less the KL penalty when ``kl_sums`` (one per sample, in order) are given."""
    from bidirl.algo.advantages import step_advantages  # lazy: torch, as in lay_out

    sizes = [len(g) for g in lay.rewards]
    lengths = _ragged([trained_tokens(s) for s in lay.samples], sizes)
    rewards = lay.rewards
    if kl_sums is not None:
        if len(kl_sums) != len(lay.samples) or not all(math.isfinite(k) for k in kl_sums):
            raise RuntimeError(f"step {lay.rec.step}: the reference KL is not a finite number per sample "
                               f"({len(kl_sums)} for {len(lay.samples)} samples; algorithm.kl_penalty="
                               f"{alg.kl_penalty}: a clamped estimator, low_var_kl, cannot overflow)")
        beta = alg.kl_ctrl.kl_coef
        rewards = kl_penalised(rewards, _ragged(kl_sums, sizes), beta)
        per_token = [k / max(1, trained_tokens(s)) for k, s in zip(kl_sums, lay.samples)]
        # veRL's names: the mean over responses of each one's token-mean KL, the coefficient
        lay.rec.extra_metrics.update({"reward_kl_penalty": sum(per_token) / len(per_token),
                                      "reward_kl_penalty_coeff": beta})
    flat = [x for g in rewards for x in g]
    lay.rec.extra_metrics["rewards_mean"] = sum(flat) / len(flat)  # what the advantages saw (veRL's name)
    advs = [x for g in step_advantages(rewards, lengths, alg) for x in g]
    for s, adv in zip(lay.samples, advs):
        s["advantage"] = float(adv)
