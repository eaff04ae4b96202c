"""The real runtime's record of every prompt group: prompt, responses, partials, rewards.

The controller reasons about groups by id; this store holds what the ids stand for.  It
hands out generation requests (fresh, or resuming a partial prefix), absorbs finished and
partial responses, and turns a complete batch into GRPO training samples *in group-id
order* (never completion order), so a run is reproducible and borrowing cannot change
what is trained.  Its ``state_dict`` holds every buffered and in-flight response, which
is what a checkpoint needs to lose nothing on resume.

Rewards are checked where they enter (``score``): the veRL-signature function may return a
number (a bool or an int is one, as in veRL) or a dict with a ``"score"`` number; anything
else — NaN, inf, None, a string, another object, or an exception it raised — is a *bad
reward*.  By ``data.on_bad_reward`` it is either a :class:`BadRewardError` naming the group,
its prompt, the response index and text and the value (``"error"``, the default: one NaN
reward would otherwise turn its whole group's advantages, then every weight, into NaN), or
scored 0 and counted per group (``"zero"``; the reporter logs ``reward/bad_count``).
A dict's other finite numbers (veRL's extra keys, e.g. ``{"score": 1.0, "acc": 1}``) are
kept per response and logged by the reporter as ``reward/extra/<key>`` means per step.

DAPO's overlong shaping (``algorithm.overlong_buffer``) is added here to each good reward
(``algo/reward_shaping.py``, against the group's own response cap), and recorded as the
extra keys ``overlong_reward`` and ``overlong`` (1 if penalised); a bad reward scored 0 is
not shaped.

With DAPO's dynamic sampling (``algorithm.filter_groups``) a group is scored as soon as it
completes (``runtime/rollout_driver.py``) and marked ``filtered`` when its rewards are all
equal; it stays here until its step is recorded.  Each group also keeps its step
(``batch``), for checkpoints.

Every call goes through the run's :class:`~bidirl.runtime.reward_call.RewardGuard`
(``data.reward_timeout_s``): a call that hangs is abandoned and one that raises
``SystemExit``/``KeyboardInterrupt`` is a bad reward like any other.  Under ``zero``, a run
whose first step has no good reward at all stops (``score_step``): it would train on zeros.
"""

from __future__ import annotations

import base64
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

from bidirl.algo.algorithm_config import OverlongBuffer
from bidirl.algo.reward_shaping import overlong_penalty
from bidirl.runtime.messages import ResponseRequest, ResponseResult
from bidirl.runtime.reward_call import (
    BadRewardError,
    OnBadReward,
    RewardTimeout,
    call_reward,
    describe_bad_reward,
    one_line,
    reward_extras,
)


@dataclass
class GroupRecord:
    group_id: int
    prompt_uid: str
    prompt_ids: list[int]
    data_source: str
    ground_truth: Any
    extra_info: dict
    n: int
    done: dict[int, ResponseResult] = field(default_factory=dict)
    partial: dict[int, ResponseResult] = field(default_factory=dict)
    rewards: dict[int, float] = field(default_factory=dict)
    bad: dict[int, str] = field(default_factory=dict)  # response index -> why it scored 0
    extras: dict[int, dict[str, float]] = field(default_factory=dict)  # a dict reward's other numbers
    unshaped: dict[int, float] = field(default_factory=dict)  # the reward before the overlong penalty
    batch: int | None = None  # the step it belongs to (global), once the controller assigned it
    filtered: bool = False  # dynamic sampling: complete with all rewards equal, kept until its step is recorded
    images: tuple[bytes, ...] = ()  # the prompt's images, encoded; prompt_ids hold one placeholder each
    image_tokens: int = 0  # tokens the images add once their placeholders are expanded
    train_prompt_ids: list[int] | None = None  # the prompt as the trainer sees it (expanded); None: prompt_ids
    row: dict | None = None  # multi-turn: the data row (veRL's layout) its environments are reset with

    @property
    def complete(self) -> bool:
        return len(self.done) == self.n

    @property
    def trained_prompt_ids(self) -> list[int]:
        """The prompt the trainer computes on: each image placeholder expanded to its tokens."""
        return self.prompt_ids if self.train_prompt_ids is None else self.train_prompt_ids


class GroupStore:
    def __init__(self, n: int, max_new_tokens: int, temperature: float, seed: int,
                 on_bad_reward: OnBadReward = "error", cap_for=None, reproducible: bool = False,
                 overlong: OverlongBuffer | None = None) -> None:
        """``on_bad_reward`` applies to reward functions that carry no choice of their own
        (a :class:`RewardFn` does).  ``cap_for(group_id)``: that group's response cap, when
        it is not ``max_new_tokens`` for all (a length curriculum).  ``reproducible``: an
        interrupted response restarts from its first token with its own seed instead of
        resuming its prefix (a resumed request draws from another random stream).
        ``overlong``: DAPO's length penalty on training rewards (see the module doc)."""
        if on_bad_reward not in ("error", "zero"):
            raise ValueError(f"on_bad_reward must be 'error' or 'zero', got {on_bad_reward!r}")
        self.n, self.max_new_tokens, self.temperature, self.seed = n, max_new_tokens, temperature, seed
        self.on_bad_reward = on_bad_reward
        self.reproducible = reproducible
        self.overlong = overlong if overlong is not None and overlong.enable else None
        self.cap_for = cap_for or (lambda _gid: max_new_tokens)
        self.groups: dict[int, GroupRecord] = {}
        self._warned_bad = False
        self._first_step_scored = False

    def add(self, group_id: int, prompt_uid: str, prompt_ids: list[int], data_source: str,
            ground_truth: Any, extra_info: dict | None = None, images: tuple[bytes, ...] = (),
            train_prompt_ids: list[int] | None = None, row: dict | None = None) -> GroupRecord:
        """A new group.  With ``images``, ``prompt_ids`` holds one placeholder per image (what
        vLLM is sent) and ``train_prompt_ids`` the same prompt with each expanded (what the
        trainer computes on)."""
        if group_id in self.groups:
            raise ValueError(f"group {group_id} already exists")
        trained = None if train_prompt_ids is None else list(train_prompt_ids)
        rec = GroupRecord(group_id, prompt_uid, list(prompt_ids), data_source, ground_truth,
                          dict(extra_info or {}), self.n, images=tuple(images),
                          image_tokens=len(trained) - len(prompt_ids) if trained is not None else 0,
                          train_prompt_ids=trained, row=row)
        self.groups[group_id] = rec
        return rec

    def requests_for(self, group_id: int) -> list[ResponseRequest]:
        """Requests for every response not yet finished: partials resume their prefix."""
        rec = self.groups[group_id]
        out = []
        for i in range(rec.n):
            if i in rec.done:
                continue
            if i in rec.partial and rec.partial[i].token_ids and not self.reproducible:
                out.append(rec.partial.pop(i).as_request())
            else:
                rec.partial.pop(i, None)
                out.append(ResponseRequest(group_id, i, rec.prompt_ids, self.cap_for(group_id),
                                           self.temperature, seed=self._seed(group_id, i), images=rec.images,
                                           image_tokens=rec.image_tokens))
        return out

    def absorb_finished(self, results: list[ResponseResult]) -> list[int]:
        """Record finished responses; return the ids of groups that just became complete."""
        newly = []
        for r in results:
            rec = self.groups[r.group_id]
            if r.index in rec.done:
                raise RuntimeError(f"group {r.group_id} response {r.index} finished twice")
            rec.done[r.index] = r
            if rec.complete:
                newly.append(r.group_id)
        return sorted(newly)

    def absorb_partials(self, partials: list[ResponseResult]) -> list[int]:
        """Keep interrupted prefixes for resumption; return the affected group ids."""
        affected = set()
        for p in partials:
            rec = self.groups[p.group_id]
            if p.index in rec.done:
                raise RuntimeError(f"group {p.group_id} response {p.index} is done and partial")
            rec.partial[p.index] = p
            affected.add(p.group_id)
        return sorted(affected)

    def versions(self, group_id: int) -> tuple[int | None, int | None, int]:
        """(oldest, newest) token version and token count over the group's responses."""
        rec = self.groups[group_id]
        vs = [v for r in list(rec.done.values()) + list(rec.partial.values()) for v in r.versions]
        return (min(vs) if vs else None, max(vs) if vs else None, len(vs))

    def score(self, group_id: int, reward_fn, decode, on_bad_reward: OnBadReward | None = None) -> list[float]:
        """Rewards of a complete group, in response order (cached), each a finite float.

        A bad reward (see the module doc) raises :class:`BadRewardError` or scores 0 and is
        recorded in ``rec.bad``, by ``on_bad_reward``, else the function's own
        ``on_bad_reward`` attribute (:class:`RewardFn`), else the store's.
        """
        rec = self.groups[group_id]
        if not rec.complete:
            raise RuntimeError(f"group {group_id} scored before it was complete")
        if len(rec.rewards) < rec.n:
            policy = on_bad_reward or getattr(reward_fn, "on_bad_reward", None) or self.on_bad_reward
            rec.bad.clear()
            rec.extras.clear()
            rec.unshaped.clear()
            for i in range(rec.n):
                if rec.done[i].env_reward is not None:  # a trajectory: its episode's return is its reward
                    rec.rewards[i] = rec.unshaped[i] = rec.done[i].env_reward
                    continue
                text = decode(rec.done[i].token_ids)
                value, raw = call_reward(reward_fn, rec.data_source, text, rec.ground_truth, rec.extra_info)
                if value is None:
                    problem = describe_bad_reward(raw)
                    where = (f"group {group_id} (prompt uid {rec.prompt_uid}, data_source {rec.data_source!r}) "
                             f"response {i} {one_line(repr(text), 80)}")
                    name = getattr(reward_fn, "name", None) or getattr(reward_fn, "__name__", "reward function")
                    if policy != "zero":
                        fix = ("make it faster, raise data.reward_timeout_s" if isinstance(raw, RewardTimeout)
                               else "fix the reward function")
                        raise BadRewardError(f"bad reward: {name} {problem} for {where}; {fix} or set "
                                             "data.on_bad_reward=zero to score such responses 0")
                    if not self._warned_bad:
                        self._warned_bad = True
                        print(f"[bidirl] warning: {name} {problem} for {where}; scored 0 "
                              "(data.on_bad_reward=zero); further ones are counted in reward/bad_count",
                              file=sys.stderr)
                    rec.bad[i] = problem
                    value = rec.unshaped[i] = 0.0
                else:
                    extras = reward_extras(raw)
                    rec.unshaped[i] = value
                    if self.overlong is not None:
                        penalty = self._overlong_penalty(group_id, len(rec.done[i].token_ids))
                        value += penalty
                        extras.update(overlong_reward=penalty, overlong=float(penalty < 0))
                    if extras:
                        rec.extras[i] = extras
                rec.rewards[i] = value
        return [rec.rewards[i] for i in range(rec.n)]

    def filter_values(self, group_id: int, metric: str | None) -> list[float]:
        """What dynamic sampling judges a scored group on (``algorithm.filter_groups.metric``):
        the training rewards (null, ``seq_reward``, ``seq_final_reward``); the function's own
        values before shaping (``score``); else that key of its dict, a plain number counting
        as its own ``acc`` (veRL's DAPO recipe filters on ``acc``, its reward's correctness)."""
        rec = self.groups[group_id]
        if metric in (None, "seq_reward", "seq_final_reward"):
            return [rec.rewards[i] for i in range(rec.n)]
        out = []
        for i in range(rec.n):
            extras = rec.extras.get(i, {})
            if metric in extras and metric not in ("overlong_reward", "overlong"):
                out.append(extras[metric])
            elif metric == "score" or (metric == "acc" and i in rec.unshaped and not rec.bad.get(i)
                                       and set(extras) <= {"overlong_reward", "overlong"}):
                out.append(rec.unshaped[i])
            elif i in rec.bad:
                out.append(0.0)
            else:
                raise BadRewardError(f"algorithm.filter_groups.metric={metric}: the reward function gave group "
                                 f"{group_id} response {i} no {metric!r} (its keys: {sorted(extras) or 'none'}); "
                                 "return it in a dict, or filter on seq_reward")
        return out

    def score_step(self, group_ids, reward_fn, decode) -> list[list[float]]:
        """``score`` of each group of a training step, in order.

        The run's first step whose every response is bad (scored 0 under
        ``data.on_bad_reward=zero``) is a :class:`BadRewardError`: with no good reward at all
        the run would train on zeros and exit 0 as if it had learned.
        """
        rewards = [self.score(g, reward_fn, decode) for g in group_ids]
        if not self._first_step_scored and group_ids:
            self._first_step_scored = True
            recs = [self.groups[g] for g in group_ids]
            if all(len(r.bad) == r.n for r in recs):
                name = getattr(reward_fn, "name", None) or getattr(reward_fn, "__name__", "reward function")
                first = recs[0].bad[min(recs[0].bad)]
                raise BadRewardError(f"every reward of the first training step was bad: all {sum(r.n for r in recs)} "
                                     f"responses of its {len(recs)} groups scored 0 under data.on_bad_reward=zero "
                                     f"(the first: {name} {first}); training on zeros learns nothing: fix the "
                                     "reward function")
        return rewards

    def _overlong_penalty(self, group_id: int, length: int) -> float:
        ob = self.overlong
        if ob.len is None:
            raise ValueError("algorithm.overlong_buffer.enable needs algorithm.overlong_buffer.len")
        return overlong_penalty(length, self.cap_for(group_id), ob.len, ob.penalty_factor)

    def bad_count(self, group_ids) -> int:
        """Responses of these (scored) groups whose reward was bad and scored 0."""
        return sum(len(self.groups[g].bad) for g in group_ids if g in self.groups)

    def extra_means(self, group_ids) -> dict[str, float]:
        """Mean of each extra key of a dict reward over the responses of these groups that have it."""
        sums: dict[str, list[float]] = {}
        for g in group_ids:
            rec = self.groups.get(g)
            for extras in (rec.extras.values() if rec else ()):
                for k, v in extras.items():
                    sums.setdefault(k, []).append(v)
        return {k: sum(v) / len(v) for k, v in sums.items()}

    def trajectory_means(self, group_ids) -> dict[str, float]:
        """Multi-turn figures of these groups' trajectories (veRL-like names, per step): model
        turns, environment time, model and environment tokens, and the share of each outcome."""
        done = [r for g in group_ids if g in self.groups
                for r in self.groups[g].done.values() if r.loss_mask is not None]
        if not done:
            return {}
        n = len(done)
        out = {"multi_turn/turns_mean": sum(r.turns for r in done) / n,
               "multi_turn/turns_max": float(max(r.turns for r in done)),
               "multi_turn/env_seconds_mean": sum(r.env_seconds for r in done) / n,
               "multi_turn/model_tokens_mean": sum(sum(r.loss_mask) for r in done) / n,
               "multi_turn/env_tokens_mean": sum(len(r.loss_mask) - sum(r.loss_mask) for r in done) / n}
        for outcome in sorted({r.outcome for r in done}):
            out[f"multi_turn/outcome/{outcome}"] = sum(r.outcome == outcome for r in done) / n
        return out

    def pop(self, group_id: int) -> GroupRecord:
        return self.groups.pop(group_id)

    def _seed(self, group_id: int, index: int) -> int:
        return (self.seed * 1_000_003 + group_id * 1009 + index) % (2**31 - 1)

    # -- checkpoint -------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Every group's prompt, step and responses (rewards are scored again, and a filtered
        group judged again, when a resumed run completes it).  A group's images once, as
        base64 text (the state is JSON); its responses' copies are given back on load."""
        return {"n": self.n, "groups": [
            {**{k: v for k, v in asdict(rec).items()
                if k not in ("done", "partial", "rewards", "bad", "extras", "filtered", "images")},
             "images": [base64.b64encode(b).decode("ascii") for b in rec.images],
             "done": [result_state(r) for r in rec.done.values()],
             "partial": [result_state(r) for r in rec.partial.values()]}
            for rec in self.groups.values()]}

    def load_state_dict(self, state: dict) -> None:
        self.groups = {}
        for g in state["groups"]:
            images = tuple(base64.b64decode(b) for b in g.get("images", ()))
            rec = GroupRecord(g["group_id"], g["prompt_uid"], g["prompt_ids"], g["data_source"],
                              g["ground_truth"], g["extra_info"], g["n"], images=images,
                              image_tokens=g.get("image_tokens", 0), train_prompt_ids=g.get("train_prompt_ids"),
                              row=g.get("row"))
            rec.done = {r["index"]: ResponseResult(**{**r, "images": images}) for r in g["done"]}
            rec.partial = {r["index"]: ResponseResult(**{**r, "images": images}) for r in g["partial"]}
            rec.batch = g.get("batch")  # a checkpoint from before it was kept: None (ids were steps)
            self.groups[rec.group_id] = rec


def result_state(r: ResponseResult) -> dict:
    """A response as a checkpoint keeps it (JSON): without its images, which its group holds
    once (``GroupStore.state_dict``) and gives back on load."""
    return {k: v for k, v in asdict(r).items() if k != "images"}
