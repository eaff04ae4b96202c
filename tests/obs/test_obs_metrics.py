"""metrics.jsonl round trip, non-finite values skipped, TensorBoard event files written."""

from __future__ import annotations

import importlib.util
import json
import logging
import math

import numpy as np
import pytest

from bidirl.obs import metrics as metrics_mod
from bidirl.obs.metrics import MetricsLogger, read_metrics


def _tb_scalars(run_dir) -> dict[str, list[tuple[int, float]]]:
    """Scalars of every event file in ``run_dir`` (both simple_value and tensor forms)."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    out: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(run_dir.glob("events.out.tfevents.*")):
        for event in EventFileLoader(str(path)).Load():
            for value in event.summary.value:
                kind = value.WhichOneof("value")
                number = (
                    value.simple_value if kind == "simple_value" else (value.tensor.float_val[0])
                )
                out.setdefault(value.tag, []).append((event.step, number))
    return out


def test_round_trip(tmp_path):
    with MetricsLogger(tmp_path, tensorboard="none") as logger:
        first = logger.log(
            1,
            {
                "timing_s/gen": 1.25,
                "perf/throughput": 900,
                "trainer/idle_ratio": np.float32(0.5),
                "flag": True,
            },
        )
        logger.log(2, {"timing_s/gen": np.array(2.0), "perf/throughput": 1000})
    assert first == {
        "step": 1,
        "flag": 1,
        "perf/throughput": 900,
        "timing_s/gen": 1.25,
        "trainer/idle_ratio": 0.5,
    }
    assert list(first)[0] == "step"
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert records == [first, {"step": 2, "perf/throughput": 1000, "timing_s/gen": 2.0}]
    assert read_metrics(tmp_path) == records  # a run directory works too


def test_reopen_appends(tmp_path):
    with MetricsLogger(tmp_path, tensorboard="none") as logger:
        logger.log(1, {"x": 1.0})
    with MetricsLogger(tmp_path, tensorboard="none") as logger:
        logger.log(2, {"x": 2.0})
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]


def test_non_finite_values_are_skipped_with_a_warning(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="bidirl.obs.metrics")
    with MetricsLogger(tmp_path, tensorboard="none") as logger:
        record = logger.log(
            3,
            {
                "actor/pg_loss": float("nan"),
                "perf/throughput": math.inf,
                "note": "text",
                "step": 9,
                "ok": 1.0,
            },
        )
        logger.log(4, {"actor/pg_loss": float("nan"), "ok": 2.0})
    assert record == {"step": 3, "ok": 1.0}
    text = caplog.text
    for key in ("actor/pg_loss", "perf/throughput", "note", "'step'"):
        assert key in text
    assert "'actor/pg_loss' was skipped 2 time(s)" in text
    raw = (tmp_path / "metrics.jsonl").read_text()
    assert "NaN" not in raw and "Infinity" not in raw
    assert [json.loads(line)["step"] for line in raw.splitlines()] == [3, 4]


def test_truncated_last_line_is_dropped_but_corruption_raises(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "x": 1.0}\n{"step": 2, "x"')
    assert read_metrics(path) == [{"step": 1, "x": 1.0}]
    path.write_text('{"step": 1\n{"step": 2}\n')
    with pytest.raises(ValueError, match="metrics.jsonl:1"):
        read_metrics(path)


def test_closed_logger_refuses_and_close_is_idempotent(tmp_path):
    logger = MetricsLogger(tmp_path, tensorboard="none")
    logger.close()
    logger.close()
    with pytest.raises(RuntimeError, match="closed"):
        logger.log(1, {"x": 1.0})
    with pytest.raises(ValueError, match="tensorboard"):
        MetricsLogger(tmp_path, tensorboard="wandb")


@pytest.mark.parametrize("backend", ["tensorboard", "torch", "auto"])
def test_tensorboard_events(tmp_path, backend):
    needed = {
        "tensorboard": ["tensorboard"],
        "torch": ["torch", "tensorboard"],
        "auto": ["tensorboard"],
    }[backend]
    for module in needed:
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed")
    with MetricsLogger(tmp_path, tensorboard=backend) as logger:
        logger.log(1, {"timing_s/gen": 1.5, "bad": float("nan")})
        logger.log(2, {"timing_s/gen": 2.5})
    assert logger.tb_backend in ("torch", "tensorboard")
    assert list(tmp_path.glob("events.out.tfevents.*"))
    scalars = _tb_scalars(tmp_path)
    assert scalars == {"timing_s/gen": [(1, 1.5), (2, 2.5)]}


def test_no_tensorboard_warns_once(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(metrics_mod, "_warned_no_tensorboard", False)
    real_import = __import__

    def no_tb(name, *args, **kwargs):
        if name.startswith(("torch", "tensorboard")):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr("builtins.__import__", no_tb)
    caplog.set_level(logging.WARNING, logger="bidirl.obs.metrics")
    for sub in ("a", "b"):
        with MetricsLogger(tmp_path / sub) as logger:
            logger.log(1, {"x": 1.0})
        assert logger.tb_backend is None
    assert caplog.text.count("TensorBoard events are not written") == 1
    assert read_metrics(tmp_path / "a") == [{"step": 1, "x": 1.0}]


class _FakeWandbRun:
    def __init__(self, **kwargs):
        self.kwargs, self.logged, self.defined, self.finished = kwargs, [], [], False

    def define_metric(self, name, **kwargs):
        self.defined.append((name, kwargs))

    def log(self, data):
        self.logged.append(data)

    def finish(self):
        self.finished = True


def test_wandb_gets_every_record_with_its_step_and_resumes_the_same_run(tmp_path, monkeypatch):
    import sys
    import types

    runs = []
    fake = types.ModuleType("wandb")
    fake.init = lambda **kw: runs.append(_FakeWandbRun(**kw)) or runs[-1]
    monkeypatch.setitem(sys.modules, "wandb", fake)
    with MetricsLogger(tmp_path, tensorboard="none", wandb={"project": "p", "config": {"a": 1}}) as logger:
        logger.log(3, {"reward/mean": 0.5, "bad": float("nan")})
        logger.log(2, {"val/score/mean": 0.25})  # out of step order: a validation reporting late
    run = runs[0]
    assert run.kwargs["project"] == "p" and run.kwargs["name"] == tmp_path.name and run.kwargs["config"] == {"a": 1}
    assert run.kwargs["dir"] == str(tmp_path) and run.kwargs["resume"] == "allow"
    assert ("*", {"step_metric": "trainer/global_step"}) in run.defined
    assert run.logged == [{"reward/mean": 0.5, "trainer/global_step": 3},
                          {"val/score/mean": 0.25, "trainer/global_step": 2}]
    assert run.finished
    MetricsLogger(tmp_path, tensorboard="none", wandb={}).close()
    assert runs[1].kwargs["id"] == run.kwargs["id"], "a resumed run continues the same wandb run"


def test_wandb_missing_is_an_import_error_naming_the_field(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb -> ImportError
    with pytest.raises(ImportError, match="run.wandb"):
        MetricsLogger(tmp_path, tensorboard="none", wandb={})


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch's SummaryWriter")
def test_sample_text_goes_to_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    with MetricsLogger(tmp_path, tensorboard="torch") as logger:
        logger.log_text(4, "samples/val", "**prompt** 'add 1+2'")
    tags = {v.tag for p in tmp_path.glob("events.out.tfevents.*") for e in EventFileLoader(str(p)).Load()
            for v in e.summary.value}
    assert any(t.startswith("samples/val") for t in tags), tags
