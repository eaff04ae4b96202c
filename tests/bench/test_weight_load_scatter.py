"""``bench/weight_load_scatter.py``'s floor: the best a one-number model can do on a sample."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
wls = pytest.importorskip("weight_load_scatter")


def test_identical_loads_have_no_floor():
    assert wls.floor_error([0.05] * 7) == 0.0


def test_the_floor_is_no_worse_than_the_median_and_beats_the_extremes():
    xs = [40.0, 42.0, 45.0, 50.0, 55.0, 62.0, 70.0]
    med = statistics.median(xs)
    at_median = statistics.median(abs(med - x) / x for x in xs)
    assert wls.floor_error(xs) <= at_median
    for c in (min(xs), max(xs)):
        assert wls.floor_error(xs) < statistics.median(abs(c - x) / x for x in xs)


def test_the_floor_is_scale_free():
    xs = [0.041, 0.045, 0.052, 0.060, 0.071]
    assert wls.floor_error(xs) == pytest.approx(wls.floor_error([x * 1000 for x in xs]))
