"""With ``workload.turns`` at its defaults (one turn), every scenario simulates exactly as
before the multi-turn model existed: the trace hash and the throughput, wall time, ideal and
attainable figures of a few built-in scenarios under every policy, bit for bit, against the
numbers the simulator gave before (``data/single_turn_baseline.json``, written by the
commit before ``workload.turns``)."""

from __future__ import annotations

import json
from pathlib import Path

from bidirl.policy import policy_names
from bidirl.sim.run import simulate
from bidirl.sim.scenario import load

BASELINE = json.loads((Path(__file__).parent / "data" / "single_turn_baseline.json").read_text())
RUNS = (("tiny-cpu", 6), ("default", 4), ("paper-geo3k", 3), ("user-h100-40-drift", 3))


def test_single_turn_scenarios_simulate_bit_for_bit_as_before():
    got = {}
    for name, steps in RUNS:
        sc = load(name)
        assert not sc.workload.turns.multi
        for pol in policy_names():
            r = simulate(sc, pol, steps=steps, record_intervals=False)
            got[f"{name}/{pol}"] = [r.trace_sha256, r.throughput_tokens_per_s.hex(), r.wall_s.hex(),
                                    r.ideal_tokens_per_s.hex(), r.attainable_tokens_per_s.hex()]
    assert got == BASELINE
