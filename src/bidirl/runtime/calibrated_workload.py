"""The workload a real run measured, for its calibrated scenario (``calibrated_scenario``):
response lengths in group-id order, dynamic sampling's keep rate, and (multi-turn) the turns.

Multi-turn (``workload.turns``, ``perf/scenario_turns.py``): the rollout driver keeps every
ended trajectory's ``(model turns, environment seconds, model tokens, environment tokens,
seconds off the replicas)`` (``RolloutDriver.trajectory_stats``); they go to
``profile.jsonl`` as ``TrajectoryEnded`` records, and the scenario gets

* ``turns``: ``dist: empirical``, the measured turns per trajectory (drawn with the seed);
* ``tool_latency_s``: the trajectories' seconds off the replicas over their environment
  turns (one ``step`` after each model turn: ``t`` for ``t`` turns), summed over
  trajectories.  Off the replicas is on the run's clock: from the trajectory's start (its
  ``reset``) or a turn's end to its next turn's request, and from its last turn to its end
  (the final ``step``): the environment's own seconds (``env_s``: ``reset`` and every
  ``step``) plus the hub's hand-over.  The simulator waits after each model turn, so the
  ``reset`` is spread over the steps and each trajectory's time off the replicas is on its
  critical path as in the run.  (Records without it: ``env_s``.)
* ``env_tokens``: environment tokens per reply before a next turn (``t - 1`` of them);
* ``response_length``: per *turn*: each trajectory's model tokens over its turns, drawn with
  the seed (``order: sample``; trajectories end in completion order, not by group id).
"""

from __future__ import annotations

TRAJECTORY = "TrajectoryEnded"


def response_lengths(records: list[dict], groups: int | None, group_size: int) -> list[int]:
    """Every trained response's length, in group-id order (groups ``0 .. groups-1``; None:
    every group that completed, as a run with dynamic sampling generated them)."""
    by_group: dict[int, list[int]] = {}
    for r in records:
        if r["event"] == "GroupsCompleted":
            for g, lens in zip(r["group_ids"], r["response_lengths"]):
                if groups is None or g < groups:
                    by_group[g] = [max(1, int(x)) for x in lens][:group_size]
    return [x for g in sorted(by_group) for x in by_group[g]]


def keep_rate_fit(records: list[dict], steps: int) -> dict | None:
    """Dynamic sampling's keep rate as the simulator's ``workload.keep_rate``: a least-squares
    line of "kept" (1 or 0) over the version each group completed at (the steps finished
    before it), its values at version 0 and ``steps - 1``, within [0.01, 1].  None: the run
    filtered nothing."""
    finished = sorted(r["t"] for r in records if r["event"] == "TrainStepFinished")
    points = []
    for r in records:
        if r["event"] == "GroupsCompleted" and "filtered" in r:
            version = sum(1 for t in finished if t <= r["t"])
            points += [(version, 0.0 if f else 1.0) for f in r["filtered"]]
    if not points or all(y == 1.0 for _, y in points):
        return None
    n = len(points)
    mx, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    var = sum((x - mx) ** 2 for x, _ in points)
    slope = sum((x - mx) * (y - my) for x, y in points) / var if var > 0 else 0.0

    def clip(v: float) -> float:
        return round(min(1.0, max(0.01, v)), 4)

    start, end = clip(my - slope * mx), clip(my + slope * (max(1, steps) - 1 - mx))
    return {"start": start, "end": end} if end != start else {"start": start}


def trajectory_records(stats) -> list[dict]:
    """``RolloutDriver.trajectory_stats`` as ``profile.jsonl`` records."""
    return [{"event": TRAJECTORY, "turns": int(x[0]), "env_s": round(float(x[1]), 6), "model_tokens": int(x[2]),
             "env_tokens": int(x[3]), **({"wait_s": round(float(x[4]), 6)} if len(x) > 4 else {})} for x in stats]


def workload_turns(records: list[dict], max_new_tokens: int) -> dict | None:
    """The scenario's ``turns`` and per-turn ``response_length`` from a multi-turn run's
    ``TrajectoryEnded`` records (module docstring), and a note for its description; None: a
    single-turn run (no trajectory had more than one model turn)."""
    trajs = [r for r in records if r["event"] == TRAJECTORY and r["turns"] >= 1]
    if not any(r["turns"] > 1 for r in trajs):
        return None
    steps, replies = sum(r["turns"] for r in trajs), sum(r["turns"] - 1 for r in trajs)
    env_s = sum(r["env_s"] for r in trajs)
    off = sum(r["wait_s"] for r in trajs) if all("wait_s" in r for r in trajs) else env_s
    env_tokens = sum(r["env_tokens"] for r in trajs)
    per_turn = [max(1, round(r["model_tokens"] / r["turns"])) for r in trajs]
    latency = round(off / steps, 6)
    turns = {"dist": "empirical", "values": [r["turns"] for r in trajs], "tool_latency_s": latency,
             "env_tokens": round(env_tokens / replies)}
    lengths = {"dist": "empirical", "min": 1, "max": max(max_new_tokens, max(per_turn)), "values": per_turn,
               "order": "sample"}
    note = (f"multi-turn: {len(trajs)} trajectories, {sum(r['turns'] for r in trajs) / len(trajs):.2f} model turns "
            f"each; tool_latency_s: their {off:.3f} s off the replicas (the environment's own {env_s:.3f} s, "
            f"reset included, and the hand-overs) over their {steps} environment turns")
    return {"turns": turns, "response_length": lengths, "note": note}
