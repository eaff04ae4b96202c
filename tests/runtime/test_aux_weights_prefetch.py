"""An auxiliary's weights are asked for before the step's micro-batches queue on rank 0.

A lend made while a step runs loads the primary's weights of that step; had the driver
asked rank 0 for them only then, the request would queue behind every micro-batch call
already on the device, and that wait would be measured as ``C_in`` (2.5 s against 3 ms on
the first lend of a real run), which then held the switch-cost estimate high enough to
refuse the next lends.
"""

from __future__ import annotations

from fake_run import run_fake


def test_each_steps_weights_are_requested_before_its_micro_batches():
    calls: list[tuple[str, int]] = []  # ("weights" | "compute", the executor's version then)

    def setup(ex):
        submit = ex.backend.submit
        rank0 = ex.layout.train_devices[0]

        def spy(device, method, *args, **kw):
            if device == rank0 and method == "call" and args[:2] == ("train", "weights"):
                calls.append(("weights", ex.weights.version))
            elif device == rank0 and method == "call" and args[1:2] == ("compute_chunk_ref",):
                calls.append(("compute", ex.weights.version))
            return submit(device, method, *args, **kw)

        ex.backend.submit = spy
        return None

    run = run_fake("bidirl", rollout=1, train=1, steps=4, setup=setup)
    assert run.executor.controller.finished
    versions = sorted({v for kind, v in calls if kind == "compute"})
    assert versions == [0, 1, 2, 3]
    for v in versions:
        first_compute = calls.index(("compute", v))
        assert ("weights", v) in calls[:first_compute], (v, calls)
