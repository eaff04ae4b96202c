#!/usr/bin/env bash
# Set up .venv (if needed) and run the whole test suite, lint included.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 RAY_USAGE_STATS_ENABLED=0
# Two workers, a test module per worker at a time (``loadscope``): a module's shared start-up
# (a Ray instance, a two-node cluster) happens once, and one end-to-end run's single-core
# phases (imports, start-up) overlap another's work on the second core.
exec .venv/bin/python -m pytest -q -n 2 --dist loadscope "$@"
