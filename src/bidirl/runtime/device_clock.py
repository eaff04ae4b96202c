"""What each real device is doing, turned into ``Interval`` records as it changes.

The driver knows when it handed a device work and when the result came back; it calls
``set`` at each change and the clock closes the previous stretch.  The intervals tile
``[0, wall]`` for every device by construction, so the same conservation check that the
simulator passes applies to real runs.
"""

from __future__ import annotations

from bidirl.core.timeline import Activity, Interval


class DeviceClock:
    def __init__(self, pools: dict[int, str], native_roles: dict[int, str]) -> None:
        self.pools = pools
        self.intervals: list[Interval] = []
        self._cur: dict[int, tuple[Activity, str, str, float]] = {
            d: (Activity.IDLE, native_roles[d], "starting", 0.0) for d in pools}

    def set(self, device: int, activity: Activity, role: str, label: str, t: float) -> None:
        act, cur_role, cur_label, since = self._cur[device]
        if (act, cur_role, cur_label) == (activity, role, label):
            return
        if t > since:
            self.intervals.append(self._interval(device, act, cur_role, cur_label, since, t))
            since = t
        self._cur[device] = (activity, role, label, since)

    def activity(self, device: int) -> Activity:
        return self._cur[device][0]

    def close(self, t: float) -> list[Interval]:
        for d, (act, role, label, since) in self._cur.items():
            if t > since:
                self.intervals.append(self._interval(d, act, role, label, since, t))
            self._cur[d] = (act, role, label, t)
        return sorted(self.intervals, key=lambda i: (i.device, i.start_s))

    def _interval(self, d, act, role, label, t0, t1) -> Interval:
        pool = self.pools[d]
        borrowed = (pool == "train" and role == "rollout") or (pool == "rollout" and role in ("aux_train", "train"))
        return Interval(d, pool, role, act, t0, t1, label, borrowed)
