"""``bench/startup.py``: milestones read from a run's stamped lines, and the per-round ratios."""

from __future__ import annotations

import pytest

from bench import startup

LINES = [(0.7, "[bidirl] warm start: 40 SFT steps"), (4.0, "[bidirl] prompts: 4096 rows, mean 14.5"),
         (20.5, "(DeviceWorker pid=1) WARNING ..."), (24.9, "[bidirl] 2 device workers up in 15.3 s"),
         (25.6, "step 1/3 (33%) | reward 0.2"), (25.8, "step 2/3 (67%) | reward 0.1"),
         (26.0, "step 3/3 (100%) | reward 0.0"), (27.7, "[bidirl] run directory: R")]


def test_milestones_are_the_first_marked_line_and_the_last_step():
    m = startup.milestones(LINES, 27.8)
    assert m == {"prompts": 4.0, "workers_up": 24.9, "first_step": 25.6, "last_step": 26.0, "exit": 27.8}
    assert startup.milestones([(1.0, "bidirl train: error: data: row 3")], 1.2) == {
        "prompts": None, "workers_up": None, "first_step": None, "last_step": None, "exit": 1.2}


def _run(k, rev, exit_s, rc=0):
    return {"round": k, "rev": rev, "returncode": rc,
            "milestones": {"prompts": 1.0, "workers_up": exit_s - 5, "first_step": exit_s - 3,
                           "last_step": exit_s - 2, "exit": exit_s}}


def test_ratios_pair_revisions_within_a_round_and_skip_failed_runs():
    runs = [_run(0, "A", 40.0), _run(0, "B", 30.0), _run(1, "A", 44.0), _run(1, "B", 33.0),
            _run(2, "A", 50.0), _run(2, "B", 10.0, rc=1)]
    s = startup.summarise(["A", "B"], runs)
    assert s["exit_over_first_per_round"] == {"B": [0.75, 0.75]}, "round 3's B failed: no ratio"
    assert s["median_exit_over_first"] == {"B": 0.75}
    assert s["median_s"]["A"]["exit"] == 44.0 and s["median_s"]["A"]["runs_ok"] == 3
    assert s["median_s"]["B"]["exit"] == 31.5 and s["median_s"]["B"]["runs_ok"] == 2


def test_an_unknown_revision_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        startup.main(["--revs", "no-such-rev-xyz", "--rounds", "1", "--json", str(tmp_path / "o.json")])
    assert e.value.code == 2 and "--revs: 'no-such-rev-xyz' is not a commit" in capsys.readouterr().err
    assert not (tmp_path / "o.json").exists()
