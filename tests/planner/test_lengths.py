"""Length statistics: the moments and order statistics the prediction is built on."""

from __future__ import annotations

import pytest

from bidirl.planner.lengths import LengthStats
from bidirl.sim.scenario import ResponseLength, Workload


def stats(**rl) -> LengthStats:
    return LengthStats.from_workload(Workload(prompt_tokens=100,
                                              response_length=ResponseLength(**rl)))


def test_constant_lengths_have_no_tail():
    s = stats(dist="constant", max=4000)
    assert s.mean == pytest.approx(4000)
    assert s.expected_max(512) == pytest.approx(4000)
    # Every slot holds a sequence half-way through on average.
    assert s.running_context == pytest.approx(100 + 2000)
    assert s.train_seq_len == pytest.approx(4100)


def test_uniform_mean_and_max():
    s = stats(dist="uniform", min=1000, max=3000)
    assert s.mean == pytest.approx(2000, rel=1e-3)
    # E[max of n uniform] = min + (max - min) n / (n + 1)
    assert s.expected_max(3) == pytest.approx(1000 + 2000 * 3 / 4, rel=2e-3)


def test_lognormal_tail_grows_with_batch_and_is_clipped():
    s = stats(dist="lognormal", median=1000, sigma=0.9, min=16, max=8192)
    assert 1000 < s.mean < 1000 * 1.6  # clipped mean below exp(sigma^2 / 2) x median
    maxes = [s.expected_max(n) for n in (1, 8, 64, 512)]
    assert maxes == sorted(maxes)
    assert maxes[-1] == pytest.approx(8192, rel=0.02)  # 512 draws almost surely hit the cap
    assert s.running_context > 100 + s.mean / 2  # long tails hold slots longer


def test_file_lengths(tmp_path):
    f = tmp_path / "lengths.txt"
    f.write_text("\n".join(["100"] * 3 + ["900"]))
    s = stats(dist="file", file=str(f), max=1000)
    assert s.mean == pytest.approx(300, rel=1e-3)
    assert s.expected_max(64) == pytest.approx(900, rel=1e-3)


def test_staggered_max_of_constant_lengths():
    """All responses equally long: the last-started one finishes last, E[min U] = 1/(n+1)."""
    s = stats(dist="constant", max=4000)
    m = s.staggered_max(15)
    assert m(0.0) == pytest.approx(4000)
    assert m(3200.0) == pytest.approx(4000 - 3200 / 16, rel=5e-3)


def test_staggered_max_falls_with_the_window():
    s = stats(dist="lognormal", median=1000, sigma=0.9, min=16, max=8192)
    m = s.staggered_max(512)
    values = [m(x) for x in (0, 100, 1000, 10_000, 100_000)]
    assert values == sorted(values, reverse=True)
    assert values[0] == pytest.approx(s.expected_max(512))
