"""How ``bidirl train`` ends, in process and without Ray: the signal handlers of the start-up,
the last line and exit status of an interrupted run, a full disk, an unexpected error, and
the lost primary trainer's one line naming the real run directory."""

from __future__ import annotations

import errno
import os
import signal

import pytest

from bidirl.runtime.checkpoint_integrity import DiskFullError
from bidirl.runtime.exits import DriverSignals, Interrupted, note_run_dir, primary_trainer_lost, run_train


@pytest.fixture(autouse=True)
def _no_run_noted():
    note_run_dir(None)
    yield
    note_run_dir(None)


def _run_dir(tmp_path, checkpoint: int | None = None):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("run: {}\n")
    if checkpoint is not None:
        ck = run / "checkpoints" / f"step_{checkpoint}"
        ck.mkdir(parents=True)
        (ck / "COMPLETE").write_text("now")
    return run


def test_the_first_signal_raises_once_and_the_handlers_are_put_back(capsys):
    before = signal.getsignal(signal.SIGTERM)
    s = DriverSignals()
    s.install()
    try:
        with pytest.raises(Interrupted) as e:
            os.kill(os.getpid(), signal.SIGTERM)
        assert e.value.signum == signal.SIGTERM and e.value.exit_status == 143
        os.kill(os.getpid(), signal.SIGINT)  # while stopping: said, not raised
        assert "SIGINT: already stopping" in capsys.readouterr().err
    finally:
        s.restore()
    assert signal.getsignal(signal.SIGTERM) == before


def _interrupted_by(sig):
    def train(args):
        os.kill(os.getpid(), sig)
        raise AssertionError("the signal did not interrupt")
    return train


def test_a_signal_during_start_up_ends_with_one_line_and_the_resume_command(tmp_path, capsys):
    run = _run_dir(tmp_path, checkpoint=4)

    def train(args):
        note_run_dir(run)
        return _interrupted_by(signal.SIGTERM)(args)

    assert run_train(train, None, ()) == 143
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"[bidirl] SIGTERM: stopped; Ray and its agents stopped, temporary files removed; resume from "
                   f"checkpoint step_4 with: bidirl train --resume {run}"]
    assert signal.getsignal(signal.SIGTERM) is not None and not isinstance(
        getattr(signal.getsignal(signal.SIGTERM), "__self__", None), DriverSignals), "handlers put back"


def test_a_resume_interrupted_before_its_directory_is_resolved_still_names_it(tmp_path, capsys):
    import argparse

    run = _run_dir(tmp_path, checkpoint=6)
    assert run_train(_interrupted_by(signal.SIGTERM), argparse.Namespace(resume=str(run)), ()) == 143
    assert capsys.readouterr().err.strip().endswith(f"resume from checkpoint step_6 with: bidirl train --resume {run}")


def test_a_signal_before_anything_was_kept_says_to_start_again(capsys):
    assert run_train(_interrupted_by(signal.SIGINT), None, ()) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["[bidirl] SIGINT: stopped; Ray and its agents stopped, temporary files removed; nothing was "
                   "trained or kept: run the same command again to start"]


def test_a_full_disk_anywhere_is_one_line(tmp_path):
    run = _run_dir(tmp_path, checkpoint=2)

    def train(args):
        note_run_dir(run)
        raise OSError(errno.ENOSPC, "No space left on device", str(run / "metrics.jsonl"))

    with pytest.raises(DiskFullError) as e:
        run_train(train, None, ())
    assert str(e.value).startswith(f"no space left on device writing {run / 'metrics.jsonl'} (")
    assert str(e.value).endswith(f"resume from checkpoint step_2 with: bidirl train --resume {run}")


def test_user_errors_pass_as_they_are_and_an_unexpected_one_is_announced(tmp_path, capsys):
    run = _run_dir(tmp_path)

    class Mine(ValueError):
        pass

    def train(args):
        note_run_dir(run)
        raise args

    with pytest.raises(Mine):
        run_train(train, Mine("bad field"), (Mine,))
    assert capsys.readouterr().err == ""
    with pytest.raises(KeyError):
        run_train(train, KeyError("bug"), (Mine,))
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("[bidirl] the run ended on an unexpected error (KeyError; traceback")
    assert err[0].endswith(f"resume from step 0 (no checkpoint yet) with: bidirl train --resume {run}")


def test_the_lost_primary_trainer_names_the_run_directory(tmp_path):
    run = _run_dir(tmp_path, checkpoint=6)
    note_run_dir(run)
    cause = RuntimeError("The actor died unexpectedly before finishing this task.\n\tclass_name: DeviceWorker\n")
    e = primary_trainer_lost(1, cause)
    assert str(e) == ("device 1 (the primary trainer, which holds the optimizer) died (The actor died unexpectedly "
                      "before finishing this task.); the run cannot go on without it; resume from checkpoint step_6 "
                      f"with: bidirl train --resume {run}")
    assert "RUN_DIR" not in str(e)


def test_the_cli_reports_a_lost_primary_trainer_in_one_line(tmp_path, monkeypatch, capsys):
    from bidirl import cli
    from bidirl.runtime import train as train_mod

    run = _run_dir(tmp_path, checkpoint=2)

    def fake_main(args):
        note_run_dir(run)
        try:
            raise RuntimeError("DeviceLost: the actor died")
        except RuntimeError as lost:
            raise primary_trainer_lost(1, lost)  # noqa: B904 (chained, as in the executor)

    monkeypatch.setattr(train_mod, "main", fake_main)
    assert cli.main(["train"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"bidirl train: error: device 1 (the primary trainer, which holds the optimizer) died (DeviceLost: "
                   f"the actor died); the run cannot go on without it; resume from checkpoint step_2 with: bidirl "
                   f"train --resume {run}"]


def test_the_executor_ends_a_run_whose_primary_trainer_died_with_that_line(tmp_path, monkeypatch):
    """On the fake device backend: the primary trainer's worker dies during its third step;
    the loop ends with ``WorkerLost`` naming the run directory (no placeholder)."""
    import fake_run

    from bidirl.runtime.exits import WorkerLost

    run = _run_dir(tmp_path, checkpoint=2)
    note_run_dir(run)

    class KillPrimaryInStep3:
        def __init__(self, inner, primary):
            self.inner, self.primary, self.steps = inner, primary, 0

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def submit(self, device, method, *args, returns=1, **kwargs):
            out = self.inner.submit(device, method, *args, returns=returns, **kwargs)
            if device == self.primary and args[:2] == ("train", "apply_refs"):
                self.steps += 1
                if self.steps == 3:
                    self.inner.kill(device)
            return out

    real = fake_run.FakeBackend

    def backend(devices, costs=None):
        inner = real(devices, costs)
        return KillPrimaryInStep3(inner, devices[-1])

    monkeypatch.setattr(fake_run, "FakeBackend", backend)
    with pytest.raises(WorkerLost) as e:
        fake_run.run_fake("async")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("device 2 (the primary trainer, which holds the optimizer) died (")
    assert msg.endswith(f"resume from checkpoint step_2 with: bidirl train --resume {run}"), msg
