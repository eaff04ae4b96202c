"""Hugging Face's progress bars: one switch, whether transformers loads before it or after."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


@pytest.mark.parametrize("transformers_first", [False, True])
def test_quiet_hf_progress_bars_holds_whenever_transformers_loads(transformers_first):
    load = "from transformers.utils import logging as hf_logging\n"
    code = ((load if transformers_first else "")
            + "from bidirl.engines.hf_io import quiet_hf_progress_bars\n"
            + "quiet_hf_progress_bars()\n"
            + ("" if transformers_first else load)
            + "from huggingface_hub.utils import are_progress_bars_disabled\n"
            + "print(hf_logging.is_progress_bar_enabled(), are_progress_bars_disabled())\n")
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_DISABLE_PROGRESS_BARS"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split()[-2:] == ["False", "True"]
