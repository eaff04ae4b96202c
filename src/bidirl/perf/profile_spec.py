"""A user's own hardware and model in a scenario: the ``hardware:`` and ``model:`` mappings.

A scenario names a catalogue entry (``hardware: H100-80GB``) or describes its own::

    hardware:                      model:
      base: H100-80GB   # optional   config: path/to/config.json   # or its directory
      name: my-gpu                   name: my-14b
      memory_gib: 96                 # or the fields: layers, hidden, heads, kv_heads,
      peak_tflops: 700               #   head_dim, vocab, intermediate (params counted
      hbm_gbps: 4000                 #   from them) or params, bytes_per_param
      intra_node_gbps: 400
      inter_node_gbps: 50
      intra_node_latency_us: 5
      inter_node_latency_us: 12
      devices_per_node: 4

Without ``base``, the figures a roofline needs are required (``REQUIRED_HARDWARE``); the
rest take the defaults of ``HardwareProfile``.  With it, every field left out is the base
entry's.  A model's fields override what its ``config.json`` says; without a config,
``layers, hidden, heads, vocab`` and ``params`` or ``intermediate`` are required.
Errors name the field (``hardware.memory_gib: required ...``).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bidirl.core.typed_config import option
from bidirl.perf.profiles import HARDWARE, MODELS, HardwareProfile, ModelProfile, hf_shape

HF_KEYS = {"layers": "num_hidden_layers", "hidden": "hidden_size", "heads": "num_attention_heads",
           "kv_heads": "num_key_value_heads", "head_dim": "head_dim", "vocab": "vocab_size",
           "intermediate": "intermediate_size"}
REQUIRED_HARDWARE = ("memory_gib", "peak_tflops", "hbm_gbps", "intra_node_gbps", "inter_node_gbps",
                     "devices_per_node")


def _pos(doc: str, integer: bool = False) -> Any:
    return option(None, doc, gt=0) if not integer else option(None, doc, ge=1)


@dataclass(frozen=True)
class HardwareSpec:
    """One device type, described by its figures (see the module docstring)."""

    base: str | None = option(None, "a catalogue entry the fields left out are taken from",
                              choices=lambda: sorted(HARDWARE))
    name: str | None = option(None, "a name for the device (default: custom, or the base's)")
    memory_gib: float | None = _pos("device memory (GiB)")
    peak_tflops: float | None = _pos("dense bf16 tensor throughput (TFLOP/s)")
    hbm_gbps: float | None = _pos("device memory bandwidth (GB/s)")
    intra_node_gbps: float | None = _pos("device-to-device bandwidth inside a node, per direction (GB/s)")
    inter_node_gbps: float | None = _pos("network bandwidth per device across nodes (GB/s)")
    intra_node_latency_us: float | None = option(None, "one hop of a collective inside a node (us)", ge=0)
    inter_node_latency_us: float | None = option(None, "one hop of a collective across nodes (us)", ge=0)
    devices_per_node: int | None = _pos("devices in one node", integer=True)
    host_gbps: float | None = _pos("host <-> device copy bandwidth (GB/s)")
    decode_efficiency: float | None = option(None, "fraction of the roofline decode reaches", gt=0, le=1)
    train_mfu: float | None = option(None, "model-flops utilisation in training", gt=0, le=1)
    engine_wake_s: float | None = option(None, "wake a slept inference engine (s)", ge=0)
    trainer_wake_s: float | None = option(None, "bring an auxiliary trainer up (s)", ge=0)


@dataclass(frozen=True)
class ModelSpec:
    """One model, from its Hugging Face ``config.json`` or its fields."""

    config: str | None = option(None, "a Hugging Face config.json (or its directory), relative to the scenario")
    name: str | None = option(None, "a name for the model (default: the config's directory, or custom)")
    params: float | None = _pos("parameter count (default: counted from the shapes)")
    active_params: float | None = option(None, "parameters one token runs through (experts); 0: params", ge=0)
    layers: int | None = _pos("decoder layers (num_hidden_layers)", integer=True)
    hidden: int | None = _pos("hidden size", integer=True)
    heads: int | None = _pos("attention heads", integer=True)
    kv_heads: int | None = _pos("key/value heads (default: heads)", integer=True)
    head_dim: int | None = _pos("head dimension (default: hidden / heads)", integer=True)
    vocab: int | None = _pos("vocabulary size", integer=True)
    intermediate: int | None = _pos("MLP intermediate size (counts params when params is not given)",
                                    integer=True)
    bytes_per_param: int | None = option(None, "bytes per weight (2: bf16, 4: fp32)", choices=(1, 2, 4))


def hardware_profile(value: str | HardwareSpec, err: type[Exception], where: str = "hardware") -> HardwareProfile:
    """The profile a scenario's ``hardware`` field describes."""
    if isinstance(value, str):
        if value not in HARDWARE:
            raise err(f"{where}: unknown device {value!r}; allowed: {', '.join(sorted(HARDWARE))}, "
                      "or a mapping of the device's figures (memory_gib, peak_tflops, ...)")
        return HARDWARE[value]
    given = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)
             if getattr(value, f.name) is not None and f.name != "base"}
    if value.base is not None:
        return dataclasses.replace(HARDWARE[value.base], **{"name": value.base, **given})
    missing = [k for k in REQUIRED_HARDWARE if k not in given]
    if missing:
        raise err(f"{where}.{missing[0]}: required (the device's figures: {', '.join(REQUIRED_HARDWARE)}; "
                  f"or give {where}.base, a catalogue entry: {', '.join(sorted(HARDWARE))})")
    given.setdefault("name", "custom")
    host = given.pop("host_gbps", min(given["intra_node_gbps"], 25.0))
    return HardwareProfile(host_gbps=host, **given)


def read_hf_config(path: str, err: type[Exception], where: str) -> dict:
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    try:
        data = json.loads(p.read_text())
    except OSError as e:
        raise err(f"{where}: cannot read {p} ({e.strerror or e})") from None
    except ValueError as e:
        raise err(f"{where}: {p} is not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise err(f"{where}: {p} holds a {type(data).__name__}, not a model config mapping")
    return data


def model_profile(value: str | ModelSpec, err: type[Exception], where: str = "model") -> ModelProfile:
    """The profile a scenario's ``model`` field describes."""
    if isinstance(value, str):
        if value not in MODELS:
            raise err(f"{where}: unknown model {value!r}; allowed: {', '.join(sorted(MODELS))}, "
                      "or a mapping {config: path/to/config.json} or of the model's fields")
        return MODELS[value]
    cfg: dict[str, Any] = {}
    name = value.name
    if value.config is not None:
        cfg = read_hf_config(value.config, err, f"{where}.config")
        cfg = dict(cfg.get("text_config", cfg)) if "hidden_size" not in cfg else dict(cfg)
        stem = Path(value.config)
        name = name or (stem.name if stem.is_dir() else stem.parent.name) or None
    given = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)
             if getattr(value, f.name) is not None and f.name not in ("config", "name")}
    cfg.update({HF_KEYS[k]: v for k, v in given.items() if k in HF_KEYS})
    if "params" in given:  # the shapes still size the KV cache and the FLOPs
        cfg.setdefault("intermediate_size", 0)
    missing = [k for k, hf in HF_KEYS.items() if hf not in cfg and k not in ("kv_heads", "head_dim")]
    if missing and not (missing == ["intermediate"] and any(x in cfg for x in ("num_experts", "num_local_experts"))):
        key = missing[0]
        also = f" (or {where}.params)" if key == "intermediate" else ""
        src = f"{value.config} has no {HF_KEYS[key]!r}; give it" if value.config else "required"
        raise err(f"{where}.{key}: {src}{also} (or {where}.config, a Hugging Face config.json)")
    try:
        fields = hf_shape(cfg)
    except KeyError as e:
        raise err(f"{where}.config: {value.config} has no {e.args[0]!r}; allowed: a Hugging Face decoder "
                  "config (hidden_size, num_hidden_layers, num_attention_heads, vocab_size, "
                  "intermediate_size, ...)") from None
    fields.update({k: v for k, v in given.items() if k not in HF_KEYS})
    if fields["heads"] % fields["kv_heads"]:
        raise err(f"{where}.kv_heads: must divide heads ({fields['heads']}), got {fields['kv_heads']}")
    return ModelProfile(name=name or "custom", **fields)
