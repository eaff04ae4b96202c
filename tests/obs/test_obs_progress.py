"""ProgressLine: carriage-return redraws on a TTY, periodic plain lines in logs."""

from __future__ import annotations

import io

from bidirl.obs.progress import ProgressLine, format_duration, format_progress


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_format():
    line = format_progress(
        12,
        100,
        elapsed_s=41,
        eta_s=302,
        reward=0.5321,
        tokens_per_s=1234.0,
        idle_ratios={"rollout": 0.03, "train": 0.12},
        staleness_mean=0.8,
        staleness_max=2,
    )
    assert line == (
        "step 12/100 (12%) | reward 0.532 | 1.23k tok/s | "
        "idle rollout 3% train 12% | stale 0.8/2 | 0:41 | ETA 5:02"
    )
    assert format_progress(0, 10) == "step 0/10 (0%)"
    assert format_duration(3725) == "1:02:05"


def test_a_validation_collapsed_to_one_response_is_flagged():
    assert format_progress(5, 10, val_score=0.5, val_mode_share=0.52) == (
        "step 5/10 (50%) | val 0.500 COLLAPSE? 52% one response")
    assert format_progress(5, 10, val_score=0.5, val_mode_share=0.5) == "step 5/10 (50%) | val 0.500"
    assert format_progress(5, 10, val_score=0.5) == "step 5/10 (50%) | val 0.500"


def test_non_tty_prints_plain_lines_periodically():
    clock, out = FakeClock(), io.StringIO()
    progress = ProgressLine(10, stream=out, tty=False, every_s=30.0, clock=clock)
    for step in range(1, 11):
        clock.now += 10.0
        progress.update(step, reward=0.1 * step)
    progress.close()
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    # the first step, then every 30 s (steps 4, 7, 10); the last step always
    assert [line.split(" ")[1] for line in lines] == ["1/10", "4/10", "7/10", "10/10"]
    assert "ETA 1:30" in lines[0]  # 10 s per step, 9 steps left
    assert lines[-1].endswith("ETA 0:00")


def test_close_flushes_the_pending_line():
    clock, out = FakeClock(), io.StringIO()
    with ProgressLine(100, stream=out, tty=False, every_s=60.0, clock=clock) as progress:
        progress.update(1)
        clock.now += 1
        progress.update(2)
    assert [line.split(" ")[1] for line in out.getvalue().splitlines()] == ["1/100", "2/100"]


def test_tty_redraws_in_place():
    clock, out = FakeClock(), io.StringIO()
    progress = ProgressLine(3, stream=out, tty=True, min_refresh_s=0.1, clock=clock)
    clock.now += 1
    progress.update(1, tokens_per_s=2_500_000.0, idle_ratios={"train": 0.5})
    clock.now += 1
    progress.update(2)  # shorter line: the rest of the old one is blanked out
    clock.now += 0.01
    progress.update(3)  # the final step is drawn even inside the refresh interval
    progress.close()
    text = out.getvalue()
    assert text.count("\r") == 3 and text.endswith("\n") and text.count("\n") == 1
    frames = text.rstrip("\n").split("\r")[1:]
    assert "2.50M tok/s" in frames[0]
    assert len(frames[1]) == len(frames[0])
    assert frames[2].startswith("step 3/3")


def test_resumed_run_eta_counts_only_new_steps():
    clock = FakeClock()
    progress = ProgressLine(100, stream=io.StringIO(), tty=False, start_step=50, clock=clock)
    clock.now += 20.0
    assert progress.eta_s(50) is None
    assert progress.eta_s(60) == 80.0  # 2 s per step, 40 left


def test_the_validation_score_follows_the_reward():
    line = format_progress(50, 300, reward=0.41, val_score=0.6125, tokens_per_s=900.0)
    assert line == "step 50/300 (17%) | reward 0.410 | val 0.613 | 900 tok/s"
