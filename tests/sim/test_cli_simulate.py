"""``bidirl simulate``: the files it writes and how it fails, run in-process (fast)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bidirl import cli
from bidirl.cli import main
from bidirl.sim import grid
from bidirl.sim.scenario import builtin_names

JSON_KEYS = {
    "policy", "scenario", "steps", "throughput_tokens_per_s", "mean_step_time_s",
    "pool_busy_fraction", "switch_time_s", "borrows", "ideal_tokens_per_s", "efficiency",
    "staleness", "groups_trained", "groups_lost", "trace_sha256", "attainable_tokens_per_s",
    "efficiency_attainable",
}


def test_json_has_every_promised_key(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main(["simulate", "--scenario", "tiny-cpu", "--policy", "bidirl", "--steps", "3",
                 "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert JSON_KEYS <= set(data)
    assert set(data["pool_busy_fraction"]) == {"rollout", "train"}
    assert set(data["borrows"]) == {"roll_on_train", "train_on_roll"}
    assert set(data["staleness"]) == {"mean", "max"}
    assert data["policy"] == "bidirl" and data["scenario"] == "tiny-cpu" and data["steps"] == 3
    assert data["groups_trained"] == 3 * 4 and data["groups_lost"] == 0
    assert len(data["trace_sha256"]) == 64
    assert 0 < data["efficiency"] <= 1.05
    assert data["efficiency"] == pytest.approx(
        data["throughput_tokens_per_s"] / data["ideal_tokens_per_s"])
    assert 0 < data["attainable_tokens_per_s"] <= data["ideal_tokens_per_s"]
    assert data["efficiency_attainable"] == pytest.approx(
        data["throughput_tokens_per_s"] / data["attainable_tokens_per_s"])
    assert "throughput" in capsys.readouterr().out


def test_trace_has_one_track_per_device_and_plot_is_a_png(tmp_path):
    trace, png = tmp_path / "trace.json", tmp_path / "timeline.png"
    assert main(["simulate", "--scenario", "default", "--policy", "bidirl", "--steps", "2",
                 "--trace", str(trace), "--plot", str(png)]) == 0
    events = json.loads(trace.read_text())["traceEvents"]
    tracks = {e["tid"] for e in events if e.get("ph") == "M" and e["name"] == "thread_name"}
    slices = [e for e in events if e.get("ph") == "X"]
    assert len(tracks) == 16  # the default scenario has 16 devices
    assert {e["tid"] for e in slices} == tracks
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in slices)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_scenario_exits_2_with_one_line_naming_the_field(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nhardware: H100-80GB\nmodel: Qwen3-8B\ndevices: 16\n"
                   "pools: {rollout_devices: 8, train_devices: 4, train: {dp: 4}}\n")
    assert main(["simulate", "--scenario", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "pools.train_devices" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("body, field", [
    ("workload: {group_size: 0}", "workload.group_size"),
    ("pools: {rollout_tp: 3}", "pools.rollout_tp"),
    ("sim: {timing_noise_cv: 2.0}", "sim.timing_noise_cv"),
    ("nonsense: 1", "nonsense"),
])
def test_each_bad_field_is_named(tmp_path, capsys, body, field):
    _assert_one_line_error(tmp_path, capsys, f"hardware: H100-80GB\nmodel: Qwen3-8B\n{body}", field)


def _assert_one_line_error(tmp_path, capsys, body: str, field: str) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"name: bad\n{body}\n")
    assert main(["simulate", "--scenario", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and field in err, err


@pytest.mark.parametrize("body, field", [
    ("model: Qwen3-8B", "hardware: required"),
    ("hardware: H100-80GB", "model: required"),
    ("hardware: {memory_gib: 96}\nmodel: Qwen3-8B", "hardware.peak_tflops: required"),
    ("hardware: TPU-v9\nmodel: Qwen3-8B", "hardware: unknown device 'TPU-v9'"),
    ("hardware: H100-80GB\nmodel: {layers: 4, hidden: 256}", "model.heads: required"),
    ("hardware: H100-80GB\nmodel: {config: nowhere/config.json}", "model.config: cannot read"),
])
def test_a_missing_or_bad_device_or_model_is_named(tmp_path, capsys, body, field):
    _assert_one_line_error(tmp_path, capsys, body, field)


def test_unknown_scenario_lists_the_builtins(capsys):
    assert main(["simulate", "--scenario", "no-such-scenario"]) == 2
    err = capsys.readouterr().err
    assert "no-such-scenario" in err
    assert all(name in err for name in builtin_names())


def test_grid_paper_runs_with_a_policy_subset(tmp_path, capsys, monkeypatch):
    """The CLI path of ``--grid paper``, cut to two scenarios so that it stays quick."""
    full = grid.paper_grid
    monkeypatch.setattr(grid, "paper_grid", lambda steps, seed: full(steps, seed)[:2])
    out = tmp_path / "grid.json"
    assert main(["simulate", "--grid", "paper", "--policies", "async,bidirl", "--steps", "2",
                 "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["summary"]["scenarios"] == 2
    assert [set(r["results"]) for r in data["rows"]] == [{"async", "bidirl"}] * 2
    assert "bidirl_over_async" in data["summary"]
    assert "a6000-32-qwen3-4b-4k-s1" in capsys.readouterr().out


def test_grid_rejects_unknown_grid_and_policy(capsys):
    assert main(["simulate", "--grid", "huge"]) == 2
    assert "--grid" in capsys.readouterr().err
    assert main(["simulate", "--grid", "paper", "--policies", "async,nope"]) == 2
    assert "nope" in capsys.readouterr().err


def test_run_grid_on_two_scenarios_all_policies():
    rows = grid.run_grid(grid.paper_grid(steps=2)[:2])
    assert len(rows) == 2 and all(set(r.results) == set(grid.POLICIES) for r in rows)
    assert all(r.ratio("async") == 1.0 for r in rows)
    table = grid.format_table(rows)
    assert len(table.splitlines()) == 2 + 2
    summary = grid.summarize(rows)
    assert set(summary["bidirl_over_async"]) == {"min", "median", "max"}
    assert summary["paper_bidirl_over_baselines"] == [1.05, 1.94]


def test_json_without_trace_has_the_figures_of_a_run_with_trace(tmp_path, capsys):
    """Without --trace the CLI keeps no intervals; what it reports comes from the recorder's
    tallies and must not change. trace_sha256 included (one streaming hash)."""
    plain, traced, trace = tmp_path / "plain.json", tmp_path / "traced.json", tmp_path / "t.json"
    argv = ["simulate", "--scenario", "default", "--policy", "bidirl", "--steps", "3"]
    assert main([*argv, "--json", str(plain)]) == 0
    out_plain = capsys.readouterr().out
    assert main([*argv, "--json", str(traced), "--trace", str(trace)]) == 0
    out_traced = capsys.readouterr().out
    a, b = json.loads(plain.read_text()), json.loads(traced.read_text())
    for key in ("throughput_tokens_per_s", "tokens_trained", "wall_s", "mean_step_time_s",
                "pool_busy_fraction", "switch_time_s", "borrows", "ideal_tokens_per_s",
                "efficiency", "staleness", "groups_trained", "groups_lost", "step_times_s",
                "admission", "attainable_tokens_per_s", "efficiency_attainable"):
        assert a[key] == b[key], key
    for key in ("pool_seconds", "events", "colocated_switches", "ledger_ok"):
        assert a["extra"][key] == b["extra"][key], key
    assert len(a["trace_sha256"]) == len(b["trace_sha256"]) == 64
    assert a["trace_sha256"] == b["trace_sha256"]  # one streaming hash, with or without a trace
    assert "trace   ->" not in out_plain
    assert "trace   ->" in out_traced and trace.exists()


def test_json_only_run_keeps_no_intervals(monkeypatch, tmp_path):
    """The CLI asks the simulator for intervals only when --trace or --plot needs them."""
    asked = []
    real = cli.simulate

    def spy(*args, **kwargs):
        asked.append(kwargs["record_intervals"])
        return real(*args, **kwargs)

    monkeypatch.setattr(cli, "simulate", spy)
    base = ["simulate", "--scenario", "tiny-cpu", "--steps", "2"]
    assert main([*base, "--json", str(tmp_path / "r.json")]) == 0
    assert main([*base, "--trace", str(tmp_path / "t.json")]) == 0
    assert asked == [False, True]


def test_simulate_and_plan_load_no_heavy_stack():
    """``bidirl simulate`` and ``bidirl plan`` (and ``--help``) load neither torch, vLLM, Ray,
    transformers nor matplotlib: those wait inside the subcommands that need them."""
    code = ("import sys, bidirl.cli; bidirl.cli.build_parser().parse_args(['simulate']); "
            "print(','.join(m for m in ('torch', 'vllm', 'ray', 'transformers', 'matplotlib') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
