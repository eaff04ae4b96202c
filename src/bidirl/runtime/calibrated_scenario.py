"""A real run's measured profile, written as a scenario the simulator can replay.

(work in progress)
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from bidirl.controller.events import GroupsCompleted, StageMeasured, TrainStepFinished, WeightsSynced


def profile_records(profile) -> list[dict]:
    out = []
    for t, ev in profile:
        rec = {"t": round(t, 6), "event": type(ev).__name__}
        if isinstance(ev, GroupsCompleted):
            rec.update(replica=ev.replica, group_ids=list(ev.group_ids),
                       response_lengths=[list(x) for x in ev.response_lengths])
        elif isinstance(ev, (StageMeasured, WeightsSynced, TrainStepFinished)):
            rec.update({k: (list(v) if isinstance(v, tuple) else v)
                        for k, v in dataclasses.asdict(ev).items()})
        out.append(rec)
    return out


def write_profile(run_dir: Path, rt) -> None:
    with (Path(run_dir) / "profile.jsonl").open("w") as f:
        for rec in profile_records(rt.profile):
            f.write(json.dumps(rec) + "\n")
