"""The real runtime's record of every prompt group: prompt, responses, partials, rewards.

The controller reasons about groups by id; this store holds what the ids stand for.  It
hands out generation requests (fresh, or resuming a partial prefix), absorbs finished and
partial responses, and turns a complete batch into GRPO training samples *in group-id
order* (never completion order), so a run is reproducible and borrowing cannot change
what is trained.  Its ``state_dict`` holds every buffered and in-flight response, which
is what a checkpoint needs to lose nothing on resume.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from bidirl.runtime.rollout_role import ResponseRequest, ResponseResult


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

    @property
    def complete(self) -> bool:
        return len(self.done) == self.n


class GroupStore:
    def __init__(self, n: int, max_new_tokens: int, temperature: float, seed: int) -> None:
        self.n, self.max_new_tokens, self.temperature, self.seed = n, max_new_tokens, temperature, seed
        self.groups: dict[int, GroupRecord] = {}

    def add(self, group_id: int, prompt_uid: str, prompt_ids: list[int], data_source: str,
            ground_truth: Any, extra_info: dict | None = None) -> GroupRecord:
        if group_id in self.groups:
            raise ValueError(f"group {group_id} already exists")
        rec = GroupRecord(group_id, prompt_uid, list(prompt_ids), data_source, ground_truth,
                          dict(extra_info or {}), self.n)
        self.groups[group_id] = rec
        return rec

    def requests_for(self, group_id: int) -> list[ResponseRequest]:
        """Requests for every response not yet finished: partials resume their prefix."""
        rec = self.groups[group_id]
        out = []
        for i in range(rec.n):
            if i in rec.done:
                continue
            if i in rec.partial and rec.partial[i].token_ids:
                out.append(rec.partial.pop(i).as_request())
            else:
                rec.partial.pop(i, None)
                out.append(ResponseRequest(group_id, i, rec.prompt_ids, self.max_new_tokens,
                                           self.temperature, seed=self._seed(group_id, i)))
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

    def score(self, group_id: int, reward_fn, decode) -> list[float]:
        """Rewards of a complete group, in response order (cached)."""
        rec = self.groups[group_id]
        if not rec.complete:
            raise RuntimeError(f"group {group_id} scored before it was complete")
        if len(rec.rewards) < rec.n:
            for i in range(rec.n):
                text = decode(rec.done[i].token_ids)
                rec.rewards[i] = float(reward_fn(rec.data_source, text, rec.ground_truth,
                                                 rec.extra_info))
        return [rec.rewards[i] for i in range(rec.n)]

    def pop(self, group_id: int) -> GroupRecord:
        return self.groups.pop(group_id)

    def _seed(self, group_id: int, index: int) -> int:
        return (self.seed * 1_000_003 + group_id * 1009 + index) % (2**31 - 1)

    # -- checkpoint -------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"n": self.n, "groups": [
            {**{k: v for k, v in asdict(rec).items() if k not in ("done", "partial", "rewards")},
             "done": [asdict(r) for r in rec.done.values()],
             "partial": [asdict(r) for r in rec.partial.values()]}
            for rec in self.groups.values()]}

    def load_state_dict(self, state: dict) -> None:
        self.groups = {}
        for g in state["groups"]:
            rec = GroupRecord(g["group_id"], g["prompt_uid"], g["prompt_ids"], g["data_source"],
                              g["ground_truth"], g["extra_info"], g["n"])
            rec.done = {r["index"]: ResponseResult(**r) for r in g["done"]}
            rec.partial = {r["index"]: ResponseResult(**r) for r in g["partial"]}
            self.groups[rec.group_id] = rec
