"""Observability: what users look at to see where device time went.

- ``trace``: Chrome/Perfetto ``trace.json``, one track per device.
- ``timeline_plot``: timeline PNG (imports matplotlib; import it only when plotting).
- ``accounting``: busy / idle / switching seconds, idle ratios, borrowed seconds, bubbles
  by cause, and the device-time conservation check (pure Python).
- ``metrics``: ``metrics.jsonl`` + TensorBoard scalars per step.
- ``progress``: one-line live progress for long runs.

Submodules are not imported here, so ``import bidirl.obs.accounting`` stays light.
"""
