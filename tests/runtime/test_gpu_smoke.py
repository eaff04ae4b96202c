"""The GPU smoke script, as a test that runs only where a CUDA device exists."""

import subprocess

import pytest
from runtime_cli_helpers import ROOT

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


def test_gpu_smoke_script(tmp_path):
    out = subprocess.run(["bash", "scripts/gpu_smoke.sh"], cwd=ROOT, capture_output=True, text=True,
                         timeout=720, env={"OUT": str(tmp_path / "gpu"), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert (tmp_path / "gpu" / "switch_costs.json").is_file()
    assert '"audit_ok": true' in (tmp_path / "gpu" / "train_vl.txt").read_text()  # the Qwen2.5-VL-shaped run
    assert '"audit_ok": true' in (tmp_path / "gpu" / "train_lora.txt").read_text()  # LoRA on the 0.5B shape
    fsdp2 = (tmp_path / "gpu" / "train_fsdp2.txt").read_text()
    assert '"audit_ok": true' in fsdp2 or "skipped" in fsdp2
