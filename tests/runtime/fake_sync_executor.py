"""The least of a ``DeviceExecutor`` a ``SyncDriver`` needs: calls recorded, not run (the
weight-sync and shm tests drive the driver's order by hand)."""


class FakeCalls:
    def __init__(self):
        self.issued = []  # (device, method, args, cb, on_lost)

    def issue(self, device, cb, busy, method, *args, on_lost=None, **kw):
        self.issued.append((device, method, args, cb, on_lost))


class FakeSyncExecutor:
    def __init__(self):
        self.calls = FakeCalls()
        self.layout = type("L", (), {"train_devices": [9]})()

    def unit_device(self, u):
        return u

    def now(self):
        return 0.0
