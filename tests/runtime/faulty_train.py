"""Test-only: ``bidirl train`` with a fault injected around the device backend.

    python tests/runtime/faulty_train.py AT_STEP train-args...

From step ``AT_STEP`` on, the first auxiliary trainer given a chunk is killed as it
starts computing it (``fake_devices.KillFirstAuxTrainer``, the same wrapper the fake
suite uses).  Production code carries no fault injection.
"""

import sys

from fake_devices import KillFirstAuxTrainer

from bidirl.cli import build_parser
from bidirl.runtime import train

if __name__ == "__main__":
    at_step = int(sys.argv[1])
    args = build_parser().parse_args(["train", *sys.argv[2:]])
    sys.exit(train.main(args, wrap_backend=lambda backend, spec: KillFirstAuxTrainer(
        backend, spec.train_devices[0], at_step)))
