"""The scenario schema: a cluster, a model, a workload and a device split, as typed data.

It lives in the inner ring (next to the hardware and model profiles it names) because
the planner reads it as much as the simulator does: the planner turns an ``Envelope``
into ``Pools`` and reads workload, costs and knobs, and must not import ``bidirl.sim``
to do so.  ``bidirl.sim.scenario`` re-exports these classes and adds the YAML loading
(built-in files, paths).  Every field carries its doc and allowed range
(``bidirl.core.typed_config``); ``check`` holds the rules that span fields.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from bidirl.core.typed_config import build, option, section
from bidirl.perf.profile_spec import HardwareSpec, ModelSpec, hardware_profile, model_profile
from bidirl.perf.profiles import MODELS, HardwareProfile, ModelProfile
from bidirl.perf.scenario_turns import Turns, check_turns
from bidirl.perf.vision import ImageLoad, image_tokens

LengthDist = Literal["lognormal", "constant", "uniform", "file", "empirical"]
LENGTH_DISTS: tuple[str, ...] = LengthDist.__args__  # type: ignore[attr-defined]
LengthOrder = Literal["replay", "cycle", "sample"]


class ScenarioError(ValueError):
    """A scenario file or dict that does not describe a valid run."""


@dataclass(frozen=True)
class LengthDrift:
    """Where a drifting lognormal ends (``ResponseLength``); null: the parameter stays fixed."""

    median: int | None = option(None, "median at the end of the drift (tokens)", ge=1)
    sigma: float | None = option(None, "shape at the end of the drift", ge=0)
    steps: int | None = option(None, "steps the drift takes (null: the run's steps)", ge=1)


@dataclass(frozen=True)
class ResponseLength:
    """Response lengths in tokens, drawn per response (long-tailed by default).

    ``lognormal``: median ``median``, shape ``sigma``, clipped to ``[min, max]`` (responses
    that hit ``max`` are truncated, as with ``max_tokens`` in an engine).
    ``constant``: every response is ``max`` long.  ``uniform``: in ``[min, max]``.
    ``file``: lengths read from ``file`` (one integer per line).
    ``empirical``: the lengths in ``values`` (a real run's measured lengths, response by
    response in group-id order, so batch ``b`` of the simulation gets the lengths batch
    ``b`` of the run had, and a shift of lengths over the run is replayed as it happened).

    How ``file`` and ``empirical`` lengths are used is ``order``: ``replay`` (default)
    gives batch ``b`` the values ``b*B .. (b+1)*B - 1`` in order, whatever the seed (a
    replay is the run that was), and a run that needs more lengths than listed is refused
    naming this field, never wrapped silently; ``cycle`` starts over at the end, as asked;
    ``sample`` draws every batch from the values with the run's seed (the list as a
    distribution, the planner's view of it).

    ``drift`` (lognormal only): the median and shape move linearly from ``median`` /
    ``sigma`` at step 0 to ``drift.median`` / ``drift.sigma`` at step ``drift.steps - 1``
    (default: the run's last step) and stay there: RL responses grow as the policy learns.
    Batch ``b`` is drawn at step ``b``'s parameters, seeded by ``(seed, b)``.
    """

    dist: LengthDist = option("lognormal", "length distribution")
    median: int = option(1500, "lognormal median (tokens)", ge=1)
    sigma: float = option(0.9, "lognormal shape", ge=0)
    min: int = option(16, "shortest response (tokens)", ge=1)
    max: int = option(8192, "longest response; longer ones are truncated", ge=1, le=262144)
    file: str | None = option(None, "lengths file when dist is file (relative to the scenario)")
    values: tuple[int, ...] | None = option(None, "lengths when dist is empirical")
    order: LengthOrder = option("replay", "file/empirical lengths: replay in order (no wrap), cycle, or sample "
                                "with the seed")
    drift: LengthDrift = section(LengthDrift, "lognormal parameters that change over the steps")

    def params_at(self, step: int, steps: int) -> tuple[float, float]:
        """(median, sigma) of the lognormal at ``step`` of a run of ``steps`` steps."""
        d = self.drift
        if d.median is None and d.sigma is None:
            return float(self.median), self.sigma
        span = (d.steps or steps) - 1
        f = min(1.0, step / span) if span > 0 else 1.0
        med = self.median if d.median is None else self.median * (1 - f) + d.median * f
        sig = self.sigma if d.sigma is None else self.sigma * (1 - f) + d.sigma * f
        return float(med), float(sig)

    @property
    def drifts(self) -> bool:
        return self.drift.median is not None or self.drift.sigma is not None


@dataclass(frozen=True)
class KeepRate:
    """DAPO's dynamic sampling (``algorithm.filter_groups``): the share of completed groups
    kept, the others filtered (all rewards equal) and replaced by fresh groups.

    It moves linearly from ``start`` at version 0 to ``end`` at version ``steps - 1``
    (default: the run's last step) and stays there: as the policy masters the easy prompts
    more of their groups are all correct, and as it learns the hard ones fewer are all
    wrong (DAPO's accuracy curves; which way it drifts depends on the data).  A group's fate
    is drawn with the run's seed from the rate at the version of the replica that
    completes it.  ``start`` 1 and ``end`` null (the default): nothing is filtered.
    """

    start: float = option(1.0, "share of groups kept at the start (1: no filtering)", gt=0, le=1)
    end: float | None = option(None, "share kept at the end of the drift; null: start throughout", gt=0, le=1)
    steps: int | None = option(None, "steps the drift takes (null: the run's steps)", ge=1)

    def at(self, step: float, steps: int) -> float:
        """The keep rate at ``step`` (a policy version) of a run of ``steps`` steps."""
        if self.end is None:
            return self.start
        span = (self.steps or steps) - 1
        f = min(1.0, max(0.0, step / span)) if span > 0 else 1.0
        return self.start * (1 - f) + self.end * f

    def effective(self, steps: int) -> float:
        """The run's mean keep rate as generation sees it: ``1 / mean(1 / k)`` over its steps
        (a step generates ``batch / k`` groups)."""
        return steps / sum(1.0 / self.at(k, steps) for k in range(steps)) if steps > 0 else self.start

    @property
    def filters(self) -> bool:
        return self.start < 1.0 or (self.end is not None and self.end < 1.0)


@dataclass(frozen=True)
class Workload:
    prompts_per_step: int = option(64, "prompt groups per training step (GRPO batch)", ge=1)
    group_size: int = option(8, "responses per prompt", ge=1)
    prompt_tokens: int = option(256, "tokens per prompt, its image tokens included", ge=1)
    response_length: ResponseLength = section(ResponseLength, "response length distribution (per model turn "
                                              "when workload.turns has several)")
    turns: Turns = section(Turns, "multi-turn trajectories: model turns, tool latency, environment tokens")
    images_per_prompt: int = option(0, "images in every prompt (a vision-language model's; 0: text only)", ge=0)
    image_pixels: int = option(448 * 448, "pixels of one image after the model's processor resizes it", ge=1)
    image_bytes: int = option(0, "encoded bytes of one image, carried to a replica's host with its prompt", ge=0)

    @property
    def image_load(self) -> ImageLoad:
        return ImageLoad(self.images_per_prompt, self.image_pixels, self.image_bytes)
    keep_rate: KeepRate = section(KeepRate, "DAPO's dynamic sampling: the share of groups kept, drifting")
    max_num_gen_batches: int = option(
        0, "dynamic sampling: at most this many batches of groups generated for one step, filtered ones "
        "included; a step that needs more stops the run (veRL's max_num_gen_batches); 0: no cap", ge=0)


@dataclass(frozen=True)
class TrainLayout:
    """Trainer layout: ``dp`` data-parallel ranks of ``tp`` devices each (tp=1: FSDP/DDP)."""

    dp: int = option(8, "data-parallel ranks", ge=1)
    tp: int = option(1, "tensor-parallel devices per rank", ge=1)


@dataclass(frozen=True)
class Pools:
    """The committed split.  ``rollout_devices + train_devices`` must equal ``devices``."""

    rollout_devices: int = option(8, "devices of the rollout pool (0 .. R-1)", ge=1)
    train_devices: int = option(8, "devices of the training pool (R .. R+T-1)", ge=1)
    rollout_tp: int = option(1, "tensor-parallel devices per rollout replica", ge=1)
    train: TrainLayout = section(TrainLayout, "training pool layout")


def _cost(doc: str) -> Any:
    return option(None, doc, ge=0)


@dataclass(frozen=True)
class Costs:
    """Overrides of the priors (seconds); ``null`` keeps the profile-derived prior."""

    weight_sync_s: float | None = _cost("weight broadcast to the rollout replicas")
    weight_sync_s_per_gb: float | None = _cost(
        "a measured transport's seconds per GB of weights (bench/weight_sync.py's per-byte fit; "
        "null: the link's bandwidth); used when weight_sync_s is null")
    roll_on_train_c_in_s: float | None = _cost("switch a train device to rollout")
    roll_on_train_c_out_s: float | None = _cost("switch it back")
    train_on_roll_c_in_s: float | None = _cost("switch a rollout replica to auxiliary training")
    train_on_roll_c_out_s: float | None = _cost("switch it back")
    train_on_roll_c_grad_s: float | None = _cost("ship an auxiliary chunk's gradients")
    colocated_switch_s: float | None = _cost("sync policy: offload/onload between stages")


@dataclass(frozen=True)
class SimKnobs:
    """How the simulated world differs from the scheduler's prior beliefs."""

    timing_noise_cv: float = option(0.03, "lognormal noise on every simulated stage time", ge=0, le=1)
    prior_scale: float = option(1.25, "scheduler's models start this far off; calibration fixes it",
                                ge=0.1, le=10)
    micro_batch_tokens: int = option(16384, "tokens per training micro-batch", ge=16)
    micro_batch_samples: int | None = option(
        None, "sequences per training micro-batch, a cap beside micro_batch_tokens (null: tokens alone)", ge=1)
    allow_oversubscribe: bool = option(
        False, "run a split whose roles do not fit in device memory (refused otherwise, with the reason); "
        "for studies of the scheduler alone")


def _coefs(doc: str) -> Any:
    return option(None, doc)


@dataclass(frozen=True)
class Calibration:
    """Stage times measured on a real run (``scenario.yaml`` in its run directory).

    Each set field replaces the simulated hardware's roofline for that stage (the ground
    truth); the scheduler still starts from the profile priors scaled by
    ``sim.prior_scale``, as the real run's scheduler did, and calibrates online.
    ``null``: the profile-derived roofline.
    """

    decode: tuple[float, ...] | None = _coefs("decode step [a, c, k]: a + c * running + k * sum of contexts (s)")
    prefill: tuple[float, ...] | None = _coefs("prefill [a_p, c_p]: a_p + c_p * tokens (s)")
    train_micro: tuple[float, ...] | None = _coefs(
        "training micro-batch [a_m, c_m, q_m]: a_m + c_m * tokens + q_m * tokens * seq_len (s)")
    aux_micro: tuple[float, ...] | None = _coefs("an auxiliary trainer's micro-batch, same form; null: train_micro")
    train_step_overhead_s: float | None = option(
        None, "per training step beyond its micro-batches (merge, optimizer, driver); null: the optimizer prior",
        ge=0)
    replica_cap: int | None = option(None, "responses a replica runs at once (max_num_seqs); null: from KV memory",
                                     ge=1)
    reprefill_on_sync: bool = option(
        False, "a weight update re-prefills every running response (bidirl's runtime: no KV of old weights)")
    prefill_per_response: bool = option(
        False, "each response prefills its own prompt, and the groups assigned together are one prefill burst "
        "(bidirl's runtime: vLLM prefix caching off); false: one prefill per group, its responses sharing it")
    startup_s: float = option(0.0, "seconds from the run's start to its first engine step (driver and engine "
                              "start-up); every device idles meanwhile", ge=0)
    prewarmed: bool = option(
        False, "the run timed a hot switch of every role its devices may be lent for, and a weight load, before "
        "its loop (cluster.prewarm), and its scheduler started from those: the simulated scheduler starts from "
        "this scenario's costs the same way; false: from the roofline priors")


CALIBRATED_LENGTHS = {"decode": 3, "prefill": 2, "train_micro": 3, "aux_micro": 3}


@dataclass(frozen=True)
class Scenario:
    name: str = option(doc="scenario name (default: the file's stem)")
    hardware: str | HardwareSpec = option(
        doc="a device in the catalogue (bidirl.perf.profiles.HARDWARE) or a mapping of its figures "
            "(bidirl.perf.profile_spec.HardwareSpec)")
    model: str | ModelSpec = option(
        doc="a model in the catalogue (bidirl.perf.profiles.MODELS) or a mapping: {config: config.json} "
            "or its fields (bidirl.perf.profile_spec.ModelSpec)")
    devices: int = option(16, "devices in the cluster", ge=2)
    staleness: int = option(1, "version gap bound (docs/algorithm.md)", ge=0, le=16)
    steps: int = option(20, "optimizer steps to run", ge=1)
    seed: int = option(0, "random seed of lengths and timing noise", ge=0)
    description: str = option("", "free text")
    workload: Workload = section(Workload, "what one step trains")
    pools: Pools = section(Pools, "the committed device split")
    costs: Costs = section(Costs, "switch-cost overrides")
    sim: SimKnobs = section(SimKnobs, "how the simulated world differs from the priors")
    calibration: Calibration = section(Calibration, "stage times measured on a real run (override the rooflines)")

    def replace(self, **changes: Any) -> Scenario:
        return dataclasses.replace(self, **changes)

    @property
    def hw(self) -> HardwareProfile:
        """The device profile ``hardware`` names or describes."""
        return hardware_profile(self.hardware, ScenarioError)

    @property
    def model_profile(self) -> ModelProfile:
        """The model profile ``model`` names or describes (a ``config.json`` is read)."""
        return model_profile(self.model, ScenarioError)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def check(s: Scenario) -> Scenario:
    """The rules that span fields (each field's own range is checked when it is built)."""

    def need(cond: bool, path: str, allowed: str, value: Any) -> None:
        if not cond:
            raise ScenarioError(f"{path}: {allowed}, got {value!r}")

    rl, p = s.workload.response_length, s.pools
    s.hw  # noqa: B018  (an unknown device or a missing figure fails here, naming its field)
    s.model_profile  # noqa: B018  (likewise a model)
    need(rl.min <= rl.max, "workload.response_length.min", "must be <= max", rl.min)
    if rl.drifts:
        need(rl.dist == "lognormal", "workload.response_length.drift", "applies to dist lognormal only",
             rl.dist)
    if rl.dist == "file":
        need(bool(rl.file), "workload.response_length.file", "must be a path when dist is file", rl.file)
    if rl.dist == "empirical":
        need(bool(rl.values), "workload.response_length.values", "must list lengths when dist is empirical",
             rl.values)
        need(all(1 <= v <= rl.max for v in rl.values), "workload.response_length.values",
             f"must be lengths in [1, max ({rl.max})]", [v for v in rl.values if not 1 <= v <= rl.max][:3])
    check_turns(s.workload.turns, need)
    for name, n in CALIBRATED_LENGTHS.items():
        coefs = getattr(s.calibration, name)
        if coefs is not None:
            need(len(coefs) == n, f"calibration.{name}", f"must hold {n} coefficients", coefs)
            need(all(c >= 0 for c in coefs), f"calibration.{name}",
                 "must be >= 0 (time cannot shrink with more work)", coefs)
    w, m = s.workload, s.model_profile
    # A calibrated scenario's fitted prefill holds its tower's time (the simulator prices no
    # image on top, sim/world.py), so its images only describe the run, whatever its model.
    if w.images_per_prompt and s.calibration.prefill is None:
        vl = ", ".join(k for k, v in MODELS.items() if v.vision_patch)
        need(m.vision_patch > 0, "workload.images_per_prompt", f"0 for {m.name}, which has no vision tower (or a "
             f"vision-language model: {vl})", w.images_per_prompt)
        tokens = w.images_per_prompt * image_tokens(m, w.image_pixels)
        need(w.prompt_tokens >= tokens, "workload.prompt_tokens", f"must count the image tokens ({w.images_per_prompt} "
             f"x {image_tokens(m, w.image_pixels):g} for {m.name} at image_pixels {w.image_pixels}) and the text",
             w.prompt_tokens)
    need(p.rollout_devices + p.train_devices == s.devices, "pools.train_devices",
         f"rollout_devices + train_devices must equal devices ({s.devices})", p.train_devices)
    need(p.rollout_devices % p.rollout_tp == 0, "pools.rollout_tp",
         f"must divide pools.rollout_devices ({p.rollout_devices})", p.rollout_tp)
    need(p.train.dp * p.train.tp == p.train_devices, "pools.train.dp",
         f"dp * tp must equal pools.train_devices ({p.train_devices})", p.train.dp)
    return s


def read_lengths(path: str) -> list[int]:
    """The response lengths of a ``dist: file`` scenario: positive integers, one a line.

    A ``ScenarioError`` names the file and the first bad line."""
    where = f"workload.response_length.file: {path}"
    try:
        lines = Path(path).read_text().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ScenarioError(f"{where}: cannot read it ({getattr(e, 'strerror', None) or e})") from None
    values = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            v = int(line)
        except ValueError:
            v = 0
        if v < 1:
            raise ScenarioError(f"{where}: line {i} is {line.strip()!r:.40}; allowed: one positive integer "
                                "(tokens) per line")
        values.append(v)
    if not values:
        raise ScenarioError(f"{where}: holds no lengths; allowed: one positive integer (tokens) per line")
    return values


def from_dict(data: dict[str, Any], default_name: str = "custom") -> Scenario:
    """A checked scenario from a mapping (a parsed YAML file)."""
    if not isinstance(data, dict):
        raise ScenarioError(f"scenario: expected a mapping, got {type(data).__name__}")
    data = dict(data)
    data.setdefault("name", default_name)
    for key, spec in (("hardware", HardwareSpec), ("model", ModelSpec)):
        value = data.get(key)
        if isinstance(value, dict):
            data[key] = build(spec, value, key, ScenarioError)
        elif key in data and not isinstance(value, (str, spec)):
            raise ScenarioError(f"{key}: expected a catalogue name or a mapping, got {value!r}")
    return check(build(Scenario, data, "", ScenarioError))
