"""Test-only: ``bidirl train`` whose training samples turn NaN from one step on.

    python tests/runtime/nonfinite_train.py AT_STEP train-args...

From the run's step ``AT_STEP`` (counted in this process) on, every chunk the primary
trainer computes gets NaN advantages, so its loss is NaN: ``trainer.on_nonfinite=stop``
then raises ``NonFiniteStepError`` in the worker.  Production code carries no fault injection.
"""

import sys
from dataclasses import dataclass
from typing import Any

from bidirl.cli import main
from bidirl.runtime import train


@dataclass
class NanAdvantagesFrom:
    inner: Any
    at_step: int
    steps_seen: int = 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def submit(self, device: int, method: str, *args, returns: int = 1, **kwargs):
        if method == "call" and args[:2] == ("train", "apply_refs"):
            self.steps_seen += 1
        if method == "call" and args[:2] == ("train", "compute_chunk_ref") and self.steps_seen >= self.at_step:
            mbs = [[{**s, "advantage": float("nan")} for s in mb] for mb in args[2]]
            args = (*args[:2], mbs, *args[3:])
        return self.inner.submit(device, method, *args, returns=returns, **kwargs)


if __name__ == "__main__":
    at_step = int(sys.argv[1])
    real_main = train.main
    train.main = lambda args: real_main(args, wrap_backend=lambda backend, spec: NanAdvantagesFrom(backend, at_step))
    sys.exit(main(["train", *sys.argv[2:]]))
