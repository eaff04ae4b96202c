"""Resume and stop logic on synthetic run directories: no Ray, no vLLM, no torch.

Checkpoint selection (the newest usable one, falling back past a damaged one), the ledger
and ``metrics.jsonl`` cut back to the checkpoint (a torn last line dropped), the overrides
a resume may change, the CLI's argument checks, a finished run, the stop signals and a
refused checkpoint leaving no partial directory.
"""

from __future__ import annotations

import argparse
import json
import signal
import struct
import zipfile
from pathlib import Path

import pytest

from bidirl.obs.metrics import read_metrics, truncate_metrics
from bidirl.runtime import train
from bidirl.runtime.checkpoints import (
    ResumeError,
    read_jsonl,
    safetensors_problem,
    select_checkpoint,
    write_checkpoint,
)
from bidirl.runtime.config import ConfigError, load_config
from bidirl.runtime.run_dir import RESUME_CHANGES, resume_changes, truncate_ledger
from bidirl.runtime.run_summary import audit
from bidirl.runtime.session import TrainSession
from bidirl.runtime.stops import StopSignals, nonfinite_step_error

PPS = 2  # prompts (groups) per step in these run directories


def _safetensors(path: Path, n_floats: int = 4) -> None:
    header = json.dumps({"w": {"dtype": "F32", "shape": [n_floats], "data_offsets": [0, 4 * n_floats]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * (4 * n_floats))


def _checkpoint(run: Path, step: int, legacy: bool = False) -> Path:
    """A checkpoint as a run writes it: ``model/`` (a model directory) and ``trainer/``; or,
    ``legacy``, as runs wrote it before model directories (the weights alone in ``trainer/``)."""
    ck = run / "checkpoints" / f"step_{step}"
    (ck / "trainer").mkdir(parents=True)
    if legacy:
        _safetensors(ck / "trainer" / "model.safetensors")
    else:
        (ck / "model").mkdir()
        _safetensors(ck / "model" / "model.safetensors")
        (ck / "model" / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    with zipfile.ZipFile(ck / "trainer" / "optimizer.pt", "w") as z:
        z.writestr("data.pkl", b"x")
    (ck / "trainer" / "trainer_state.json").write_text(json.dumps({"version": step}))
    state = {"next_step": step, "cursor": {}, "store": {"groups": []},
             "rewards_by_step": {str(k): 0.5 for k in range(step)}}
    (ck / "state.json").write_text(json.dumps(state))
    (ck / "COMPLETE").write_text("now")
    return ck


def _run_dir(tmp_path: Path, steps_done: int, checkpoints=(), steps: int = 10) -> Path:
    """A run directory as a run killed after ``steps_done`` steps leaves it."""
    run = tmp_path / "run"
    run.mkdir()
    cfg = load_config(None, [f"rollout.prompts_per_step={PPS}", f"run.steps={steps}"])
    import yaml

    (run / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    (run / "trained_groups.jsonl").write_text("".join(
        json.dumps({"group": s * PPS + i, "step": s, "staleness": 0}) + "\n"
        for s in range(steps_done) for i in range(PPS)))
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "reward/mean": 0.5}) + "\n"
                                               for s in range(steps_done)))
    for k in checkpoints:
        _checkpoint(run, k)
    return run


def _session(run: Path, *overrides: str) -> TrainSession:
    cfg = load_config(str(run / "config.yaml"), list(overrides))
    return TrainSession(cfg, run, resume=True)


# -- jsonl files ------------------------------------------------------------------------------
def test_read_jsonl_drops_a_torn_last_line_and_refuses_a_corrupt_middle(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_text('{"a": 1}\n{"a": 2}\n{"a": ')
    assert read_jsonl(p) == ([{"a": 1}, {"a": 2}], 1)
    p.write_text('{"a": 1}\n{"a"\n{"a": 3}\n')
    with pytest.raises(ValueError, match="line 2"):
        read_jsonl(p)
    assert read_jsonl(tmp_path / "missing.jsonl") == ([], 0)


def test_truncate_metrics_keeps_steps_before_the_checkpoint(tmp_path):
    p = tmp_path / "metrics.jsonl"
    lines = [{"step": s, "reward/mean": 0.1} for s in range(6)] + [{"step": 10, "final/wall_s": 3.0}]
    lines += [{"step": s, "reward/mean": 0.2} for s in (4, 5)]  # a previous resume's replay
    p.write_text("".join(json.dumps(r) + "\n" for r in lines) + '{"step": 6, "rew')
    assert truncate_metrics(tmp_path, 4) == 6
    assert [r["step"] for r in read_metrics(p)] == [0, 1, 2, 3]
    assert p.read_text().endswith("\n")
    assert truncate_metrics(p, 4) == 0


def test_truncate_metrics_ends_an_unterminated_last_line(tmp_path):
    p = tmp_path / "metrics.jsonl"
    p.write_text('{"step": 0, "x": 1}')
    truncate_metrics(p, 5)
    assert p.read_text() == '{"step": 0, "x": 1}\n'


def test_ledger_truncation_tolerates_a_torn_last_line(tmp_path):
    run = _run_dir(tmp_path, 5)
    with (run / "trained_groups.jsonl").open("a") as f:
        f.write('{"group": 10, "st')
    s = _session(run)
    truncate_ledger(s.ledger_path, 3)
    assert [r["step"] for r in read_jsonl(s.ledger_path)[0]] == [0, 0, 1, 1, 2, 2]
    assert audit(s.ledger_path, s.cfg, upto=3)["ok"] and not audit(s.ledger_path, s.cfg)["ok"]


# -- checkpoint selection ----------------------------------------------------------------------
def test_newest_usable_checkpoint_is_chosen(tmp_path):
    run = _run_dir(tmp_path, 6, checkpoints=(4, 6))
    ck, state = select_checkpoint(run / "checkpoints", run / "trained_groups.jsonl", PPS)
    assert ck.name == "step_6" and state["next_step"] == 6


@pytest.mark.parametrize("damage", ["state", "safetensors", "config", "optimizer", "ledger", "torn_ledger_ok"])
def test_damaged_newest_checkpoint_falls_back_to_the_older_one(tmp_path, capsys, damage):
    run = _run_dir(tmp_path, 6, checkpoints=(4, 6))
    newest = run / "checkpoints" / "step_6"
    ledger = run / "trained_groups.jsonl"
    if damage == "state":
        text = (newest / "state.json").read_text()
        (newest / "state.json").write_text(text[: len(text) // 2])
    elif damage == "safetensors":
        f = newest / "model" / "model.safetensors"
        f.write_bytes(f.read_bytes()[:-3])
    elif damage == "config":
        (newest / "model" / "config.json").write_text('{"model_ty')
    elif damage == "optimizer":
        f = newest / "trainer" / "optimizer.pt"
        f.write_bytes(f.read_bytes()[:10])
    elif damage == "ledger":  # cut short: step 5's records are gone
        ledger.write_text("".join(ledger.read_text().splitlines(keepends=True)[:10]) + '{"group": 10, "s')
    else:  # only a torn last line beyond the checkpoint: the newest stays usable
        ledger.write_text(ledger.read_text() + '{"group": 12, "s')
    ck, state = select_checkpoint(run / "checkpoints", ledger, PPS)
    err = capsys.readouterr().err
    if damage == "torn_ledger_ok":
        assert ck == newest and "torn last line" in err
        return
    assert ck.name == "step_4" and state["next_step"] == 4
    assert "step_6 is unusable" in err and "falling back" in err
    assert (newest / "DAMAGED").is_file() and not (newest / "COMPLETE").exists()


def test_a_checkpoint_of_the_older_layout_still_resumes(tmp_path, capsys):
    from bidirl.runtime.checkpoints import checkpoint_dirs, checkpoint_problem

    run = _run_dir(tmp_path, 6)
    old = _checkpoint(run, 6, legacy=True)
    assert checkpoint_problem(old)[0] is None
    assert checkpoint_dirs(old) == (old / "trainer", old / "trainer")
    ck, _ = select_checkpoint(run / "checkpoints", run / "trained_groups.jsonl", PPS)
    assert ck == old
    (old / "trainer" / "model.safetensors").write_bytes(b"\1\0")
    assert checkpoint_problem(old)[0].startswith("trainer/model.safetensors: ")


def test_export_copies_the_newest_whole_model_directory(tmp_path, capsys):
    from bidirl.cli import main

    run = _run_dir(tmp_path, 6, checkpoints=(4, 6))
    (run / "checkpoints" / "step_6" / "model" / "config.json").write_text("{")
    assert main(["export", str(run), str(tmp_path / "out")]) == 0
    assert "step_4" in capsys.readouterr().err, "the newest one's config is torn: the older one"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["config.json", "model.safetensors"]
    assert main(["export", str(run), str(tmp_path / "out")]) == 2, "the output exists"
    assert main(["export", "--step", "5", str(run), str(tmp_path / "o5")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"bidirl export: error: --step: {run} has no complete checkpoint of step 5 (complete: 4, 6)"
    assert main(["export", "--step", "6", str(run), str(tmp_path / "o6")]) == 2
    assert "step_6: model/config.json: truncated or corrupt" in capsys.readouterr().err
    assert not (tmp_path / "o6").exists()


def test_publish_model_links_the_newest_checkpoint(tmp_path):
    from bidirl.runtime.checkpoints import publish_model

    run = _run_dir(tmp_path, 6, checkpoints=(4,))
    assert publish_model(run).parent.name == "step_4"
    _checkpoint(run, 6)
    assert publish_model(run).parent.name == "step_6"
    a, b = run / "model" / "model.safetensors", run / "checkpoints" / "step_6" / "model" / "model.safetensors"
    assert a.read_bytes() == b.read_bytes()
    assert sorted(p.name for p in run.iterdir() if p.name.startswith(".")) == [], "no temporary left"


def test_no_usable_checkpoint_is_a_one_line_error(tmp_path):
    run = _run_dir(tmp_path, 6, checkpoints=(4, 6))
    for k in (4, 6):
        (run / "checkpoints" / f"step_{k}" / "state.json").write_text('{"next_st')
    with pytest.raises(ResumeError) as e:
        select_checkpoint(run / "checkpoints", run / "trained_groups.jsonl", PPS)
    assert "no usable checkpoint" in str(e.value) and "\n" not in str(e.value)
    assert (run / "checkpoints" / "step_6" / "COMPLETE").is_file(), "nothing marked when nothing is chosen"


def test_no_checkpoint_and_incomplete_ones_are_ignored(tmp_path):
    run = _run_dir(tmp_path, 2)
    assert select_checkpoint(run / "checkpoints", run / "trained_groups.jsonl", PPS) == (None, None)
    ck = _checkpoint(run, 2)
    (ck / "COMPLETE").unlink()
    assert select_checkpoint(run / "checkpoints", run / "trained_groups.jsonl", PPS) == (None, None)


def test_safetensors_problem(tmp_path):
    f = tmp_path / "m.safetensors"
    _safetensors(f)
    assert safetensors_problem(f) is None
    f.write_bytes(f.read_bytes() + b"\0")
    assert "header describes" in safetensors_problem(f)
    f.write_bytes(b"\1\0")
    assert safetensors_problem(f)


# -- prepare_resume: the run directory cut back to the checkpoint ----------------------------------
def test_prepare_resume_cuts_ledger_and_metrics_back_to_the_checkpoint(tmp_path, capsys):
    run = _run_dir(tmp_path, 7, checkpoints=(4, 6))
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"step": 7, "rew')
    s = _session(run)
    ck, state = s.prepare_resume()
    assert ck.name == "step_6" and s.start_step == 6
    assert sorted(r["group"] for r in read_jsonl(s.ledger_path)[0]) == list(range(6 * PPS))
    assert [r["step"] for r in read_metrics(run)] == list(range(6))
    assert sorted(s.rewards_by_step) == list(range(6))
    assert "dropped 2 record(s)" in capsys.readouterr().err
    assert s.prepare_resume() == (ck, state), "chosen once"


def test_prepare_resume_refuses_fewer_steps_than_the_checkpoint(tmp_path):
    run = _run_dir(tmp_path, 6, checkpoints=(6,))
    with pytest.raises(ResumeError, match="run.steps=5 is below the checkpoint's step 6"):
        _session(run, "run.steps=5").prepare_resume()


def _args(*argv: str) -> argparse.Namespace:
    from bidirl.cli import build_parser

    return build_parser().parse_args(["train", *argv])


def test_resume_of_a_finished_run_trains_nothing_and_exits_0(tmp_path, capsys):
    run = _run_dir(tmp_path, 10, checkpoints=(9, 10))
    metrics = (run / "metrics.jsonl").read_text() + json.dumps({"step": 10, "final/wall_s": 1.0}) + "\n"
    (run / "metrics.jsonl").write_text(metrics)
    assert train.main(_args("--resume", str(run))) == 0
    assert "this run is finished (10 steps" in capsys.readouterr().err
    assert (run / "metrics.jsonl").read_text() == metrics, "a finished run is left as it is"
    assert len(read_jsonl(run / "trained_groups.jsonl")[0]) == 10 * PPS


# -- what a resume may change --------------------------------------------------------------------
@pytest.mark.parametrize("override,field", [
    ("rollout.group_size=4", "rollout.group_size"), ("rollout.prompts_per_step=4", "rollout.prompts_per_step"),
    ("data.seed=3", "data.seed"), ("data.task=copy", "data.task"), ("run.seed=1", "run.seed"),
    ("scheduler.staleness=3", "scheduler.staleness"), ("model.tiny_layers=3", "model.tiny_layers"),
    ("rollout.max_new_tokens=4", "rollout.max_new_tokens"), ("run.run_dir=/tmp/x", "run.run_dir"),
])
def test_resume_refuses_overrides_the_ledger_depends_on(tmp_path, override, field):
    run = _run_dir(tmp_path, 6, checkpoints=(6,))
    before = (run / "config.yaml").read_text()
    with pytest.raises(ConfigError) as e:
        train.main(_args("--resume", str(run), override))
    msg = str(e.value)
    saved = load_config(str(run / "config.yaml"))
    old = saved.to_dict()[field.split(".")[0]][field.split(".")[1]]
    assert f"--resume: {field} is {old!r}" in msg and "\n" not in msg, msg
    assert (run / "config.yaml").read_text() == before
    assert (run / "checkpoints" / "step_6" / "COMPLETE").is_file()


def test_resume_refusal_lists_every_refused_field(tmp_path):
    run = _run_dir(tmp_path, 6, checkpoints=(6,))
    with pytest.raises(ConfigError) as e:
        train.main(_args("--resume", str(run), "data.seed=3", "trainer.lr=1e-4", "rollout.group_size=4"))
    msg = str(e.value)
    assert "data.seed is 0 in the checkpointed run" in msg and "rollout.group_size is 8" in msg, msg
    assert "trainer.lr" not in msg.split(": the data stream")[0], "an allowed change is not listed as refused"
    assert not (run / RESUME_CHANGES).exists(), "nothing recorded for a refused resume"


def test_resume_allows_safe_overrides():
    saved = load_config(None, [])
    changes = resume_changes(saved, load_config(None, [
        "run.steps=900", "run.checkpoint_every=5", "run.tensorboard=false", "run.plot=false",
        "scheduler.policy=async", "cluster.rollout_devices=2", "cluster.prewarm=false", "run.keep_checkpoints=3",
        "trainer.on_nonfinite=stop", "trainer.micro_batch_size=4", "data.on_bad_reward=zero",
        "trainer.lr=1e-4", "trainer.max_grad_norm=0.5", "trainer.kl_coef=0.1"]))
    assert ("trainer.lr", 1e-3, 1e-4) in changes and ("run.steps", 500, 900) in changes
    assert len(changes) == 14


def test_resume_records_the_changes_it_allows(tmp_path, capsys):
    run = _run_dir(tmp_path, 6, checkpoints=(6,), steps=6)
    assert train.main(_args("--resume", str(run), "trainer.lr=1e-4", "run.plot=false")) == 0  # finished
    lines = [json.loads(ln) for ln in (run / RESUME_CHANGES).read_text().splitlines()]
    assert [(r["step"], r["field"], r["old"], r["new"]) for r in lines] == [
        (6, "run.plot", True, False), (6, "trainer.lr", 1e-3, 1e-4)]
    assert "resume from step 6 changes run.plot True -> False, trainer.lr 0.001 -> 0.0001" in capsys.readouterr().err
    assert load_config(str(run / "config.yaml")).trainer.lr == 1e-4
    assert train.main(_args("--resume", str(run), "trainer.lr=1e-4")) == 0  # the same again: no change
    assert len((run / RESUME_CHANGES).read_text().splitlines()) == 2


def test_resume_refuses_a_config_yaml_cut_short(tmp_path):
    run = _run_dir(tmp_path, 6, checkpoints=(6,))
    text = (run / "config.yaml").read_text()
    (run / "config.yaml").write_text(text[:text.index("rollout:")])  # still valid YAML
    with pytest.raises(ConfigError, match=r"config.yaml does not state rollout.prompts_per_step.*cut short"):
        train.main(_args("--resume", str(run)))


@pytest.mark.parametrize("extra", [["--config", "x.yaml"], ["--run-dir", "elsewhere"]])
def test_config_or_run_dir_beside_resume_is_an_error(tmp_path, extra):
    run = _run_dir(tmp_path, 1)
    with pytest.raises(ConfigError, match=f"{extra[0]} cannot be given with --resume"):
        train.main(_args("--resume", str(run), *extra))


def test_cli_reports_argument_errors_in_one_line(tmp_path, capsys):
    from bidirl.cli import main

    run = _run_dir(tmp_path, 1)
    assert main(["train", "--resume", str(run), "--run-dir", "x"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("bidirl train: error: --run-dir cannot be given")


# -- stops ---------------------------------------------------------------------------------------
def test_stop_signals_first_asks_second_abandons_third_is_the_default():
    before = signal.getsignal(signal.SIGTERM)
    stop = StopSignals()
    stop.install()
    try:
        assert signal.getsignal(signal.SIGTERM) == stop.handle
        signal.raise_signal(signal.SIGTERM)
        assert stop.requested and not stop.abandon and stop.name == "SIGTERM" and stop.exit_status == 143
        signal.raise_signal(signal.SIGINT)
        assert stop.abandon and stop.name == "SIGTERM", "the first signal names the stop"
        assert signal.getsignal(signal.SIGTERM) == before, "the third signal meets the old handler"
    finally:
        stop.restore()
    assert signal.getsignal(signal.SIGTERM) == before
    sigint = StopSignals()
    sigint.handle(signal.SIGINT)
    assert sigint.exit_status == 130


def test_nonfinite_step_error_is_found_plain_or_wrapped():
    from bidirl.engines.trainer_config import NonFiniteStepError

    e = NonFiniteStepError("step 3: non-finite loss nan")

    class RayTaskError(RuntimeError):
        cause = e

    assert nonfinite_step_error(e) is e
    assert nonfinite_step_error(RayTaskError("remote traceback")) is e
    assert nonfinite_step_error(RuntimeError("other")) is None


def test_a_refused_checkpoint_leaves_no_partial_directory(tmp_path):
    from bidirl.engines.trainer_config import NonFiniteWeightsError

    run = _run_dir(tmp_path, 4, checkpoints=(3,))

    class Layout:
        train_devices = [0]

    class RefusingTrainer:
        layout = Layout()

        def call_now(self, device, method, role, name, out):
            (Path(out) / "model").mkdir(parents=True)
            (Path(out) / "model" / "model.safetensors").write_bytes(b"partial")
            raise NonFiniteWeightsError("refusing to write: NaN")

    with pytest.raises(NonFiniteWeightsError):
        write_checkpoint(run / "checkpoints", 4, RefusingTrainer(), store=None, cursor=None, rewards_by_step={},
                         prompts_per_step=PPS, keep=2)
    assert not (run / "checkpoints" / "step_4").exists()
    assert (run / "checkpoints" / "step_3" / "COMPLETE").is_file()


def test_a_run_that_fails_before_start_up_leaves_no_directory(tmp_path):
    """The same command, its data fixed, can then use the same --run-dir."""
    from bidirl.algo.data import DataError

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": 3, "data_source": "add", "reward_model": {"ground_truth": "1"}}\n')
    run = tmp_path / "run"
    for _ in range(2):  # the second time is the same error, not "run directory exists"
        with pytest.raises(DataError, match="line 1"):
            train.main(_args("--run-dir", str(run), f"data.files={bad}"))
        assert not run.exists()
