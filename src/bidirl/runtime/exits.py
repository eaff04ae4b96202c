"""How ``bidirl train`` ends, whatever ends it: Ray stopped, temporary files gone, one line.

Every way out of a run passes through the run's Ray session (``runtime/cluster.py``), whose
exit stops Ray and its agents and removes the run's ``/tmp/bidirl-ray-*`` directory (vLLM's
files inside it), so what is left to do here is what the user reads, and making signals
take that way out too:

- **Signals.**  :func:`run_train` installs :class:`DriverSignals` before anything else:
  a SIGINT or SIGTERM while the run starts up (loading data and the model, Ray starting,
  the tokenizer) raises :class:`Interrupted` in the driver's main thread, once, so that
  the start-up unwinds through the Ray session like any error.  Once the training loop
  runs, ``runtime/stops.py`` takes over (stop at the next step boundary) and gives the
  handlers back afterwards.  The line says which signal, where the run stands and the
  resume command; the exit status is 128 + the signal's number.
- **Errors.**  Expected ones (a bad config, a lost node or primary trainer, a full disk)
  are one line from the CLI, naming the run directory where a resume can follow; an
  unexpected one is announced by a line with the resume command before its traceback.
- **The run directory.**  ``runtime/train.main`` notes it (:func:`note_run_dir`) as soon
  as it is known, so that messages raised deep in the run (the primary trainer lost, in
  the executor) can name it instead of a placeholder.
"""

from __future__ import annotations

import errno
import shutil
import signal
import sys
from pathlib import Path

from bidirl.runtime.checkpoint_integrity import DiskFullError
from bidirl.runtime.checkpoints import complete_checkpoints
from bidirl.runtime.stops import SignalHandlers

_RUN: dict[str, Path | None] = {"dir": None}  # this driver's run directory, once train.main knows it


def note_run_dir(run_dir: Path | str | None) -> None:
    """Record the run directory this driver trains in (``runtime/train.main``)."""
    _RUN["dir"] = Path(run_dir) if run_dir is not None else None


def resume_command(run_dir: Path | str | None = None) -> str:
    """``bidirl train --resume <the run directory>`` (``run_dir``, else the one noted)."""
    where = run_dir if run_dir is not None else _RUN["dir"]
    return f"bidirl train --resume {where if where is not None else 'RUN_DIR'}"


def resume_point(run_dir: Path | str | None = None) -> str:
    """Where a resume would start: "checkpoint step_<k>" or "step 0 (no checkpoint yet)"."""
    where = run_dir if run_dir is not None else _RUN["dir"]
    done = complete_checkpoints(Path(where) / "checkpoints") if where is not None else []
    return f"checkpoint {done[-1].name}" if done else "step 0 (no checkpoint yet)"


class WorkerLost(RuntimeError):
    """A device worker the run cannot do without died (the CLI reports it in one line, exit 2)."""


def primary_trainer_lost(device: int, cause: BaseException | None = None) -> WorkerLost:
    """The error for the primary trainer's worker dying: it holds the optimizer, so the run
    ends; one line with Ray's reason (its first line) and the resume command."""
    why = str(cause).strip().splitlines()[0] if cause is not None and str(cause).strip() else "its worker died"
    return WorkerLost(f"device {device} (the primary trainer, which holds the optimizer) died ({why}); the run "
                      f"cannot go on without it; resume from {resume_point()} with: {resume_command()}")


# -- signals --------------------------------------------------------------------------------------
class Interrupted(BaseException):
    """SIGINT or SIGTERM outside the training loop: unwinds the run like an error would.

    A ``BaseException``, so that no ``except Exception`` on the way swallows it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_status(self) -> int:
        return 128 + self.signum


class DriverSignals(SignalHandlers):
    """SIGINT / SIGTERM handlers for the driver outside the training loop.

    The first signal raises :class:`Interrupted` in the main thread; later ones only say
    that the run is already stopping (the way out stops Ray, which takes a few seconds).
    Outside the main thread (where Python allows no handler) nothing is installed.
    """

    def __init__(self) -> None:
        super().__init__()
        self.received: int | None = None

    def handle(self, signum: int, frame=None) -> None:
        if self.received is None:
            self.received = signum
            raise Interrupted(signum)
        print(f"\n[bidirl] {signal.Signals(signum).name}: already stopping (Ray is shutting down)",
              file=sys.stderr, flush=True)


def interrupted_line(e: Interrupted) -> str:
    """What an :class:`Interrupted` run says last: the signal, what is kept, how to go on."""
    run_dir = _RUN["dir"]
    head = f"[bidirl] {signal.Signals(e.signum).name}: stopped; Ray and its agents stopped, temporary files removed"
    if run_dir is None or not (run_dir / "config.yaml").is_file():
        return f"{head}; nothing was trained or kept: run the same command again to start"
    return f"{head}; resume from {resume_point(run_dir)} with: {resume_command(run_dir)}"


# -- the way out ------------------------------------------------------------------------------------
def _disk_full(e: OSError) -> DiskFullError:
    where = Path(e.filename) if e.filename else _RUN["dir"] or Path.cwd()
    probe = where if where.is_dir() else where.parent
    try:
        free = f"{shutil.disk_usage(probe).free / 2**20:.1f} MiB free there"
    except OSError:
        free = "free space unknown"
    return DiskFullError(f"no space left on device writing {where} ({free}); free some space, then resume from "
                         f"{resume_point()} with: {resume_command()}")


def run_train(train, args, user_errors: tuple[type[BaseException], ...]) -> int:
    """``train(args)`` (``runtime/train.main``) with :class:`DriverSignals` installed: an
    :class:`Interrupted` run ends with one line and 128 + the signal's number; a full disk
    anywhere is a one-line :class:`DiskFullError`; an unexpected error is announced with
    the resume command before its traceback.  ``user_errors``: what the CLI reports in one
    line (passed on as they are)."""
    note_run_dir(getattr(args, "resume", None))  # train.main notes the directory it resolves
    signals = DriverSignals()
    signals.install()
    try:
        return train(args)
    except Interrupted as e:
        print(interrupted_line(e), file=sys.stderr, flush=True)
        return e.exit_status
    except user_errors:
        raise
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise _disk_full(e) from None
        _announce(e)
        raise
    except Exception as e:
        _announce(e)
        raise
    finally:
        signals.restore()


def _announce(e: BaseException) -> None:
    """One line before an unexpected error's traceback, with the resume command when the run
    directory holds a run to resume."""
    run_dir = _RUN["dir"]
    if run_dir is not None and (run_dir / "config.yaml").is_file():
        print(f"[bidirl] the run ended on an unexpected error ({type(e).__name__}; traceback below, please report "
              f"it); Ray stopped, temporary files removed; resume from {resume_point(run_dir)} with: "
              f"{resume_command(run_dir)}", file=sys.stderr, flush=True)
