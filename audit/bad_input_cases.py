"""Adversarial but fair bad inputs to the ``bidirl`` CLI, and how each one ended.

Each :class:`Case` is one command line (``python -m bidirl.cli ...``), run as a subprocess
with a timeout in a directory of its own, then classified:

``clean``      expected an error; got exit status 2, a one-line message as stderr's last
               line that names what it should (``names``), and no ``Traceback`` anywhere.
``correct``    expected success (or a documented end: exit 143 after SIGTERM, a killed
               driver's leftovers removed by the next command); got the exit status expected
               (``status``, 0 unless said) and the expected effect (``check``).
``vague``      a clean exit 2 whose message does not name the field (``names``).
``traceback``  a ``Traceback`` in stdout or stderr.
``hang``       still running at the timeout (killed with its process group).
``wrong``      anything else: exit 0/1 where an error was expected, another status, success
               without the expected effect, an error with an effect it must not have (a
               ``check`` of an error case: e.g. Ray imported), or a set-up that failed.

``python -m audit.bad_inputs`` runs every case and prints the table (BENCHMARKS.md, "Bad
inputs"); ``tests/test_bad_inputs.py`` runs a fast subset (``FAST``).  A new case is one more
``Case`` in ``CASES``.  Cases with ``run=True`` start workers and train (minutes each on two
cores); every other case fails before any worker starts.  Issue 43's faults (a damaged
checkpoint, unusable model directories, signals, a killed driver) use the set-ups, in-run
actions and checks of ``audit/bad_input_hooks.py``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from audit import bad_input_hooks as hooks
from bench.measure import ROOT

OK_CLASSES = ("clean", "correct")
# A small run that reaches the rollout and the trainer quickly (the e2e tests' settings).
SMALL = ("rollout.prompts_per_step=4", "rollout.group_size=4", "rollout.max_new_tokens=8",
         "trainer.micro_batch_size=8", "run.tensorboard=false", "run.plot=false", "cluster.prewarm=false",
         "scheduler.policy=async")
RL_RUN = ("run.steps=2", "model.warm_start_steps=0")
"""Two RL steps at once (no supervised warm start): enough to reach the reward calls of a run."""


@dataclass(frozen=True)
class Case:
    name: str
    args: tuple[str, ...]
    """After ``python -m bidirl.cli``; ``{d}`` is the case's directory, ``{f}`` the shared fixtures'."""
    names: str = ""
    """Text the one-line error must contain (the field, flag or file it is about)."""
    expect: str = "error"
    """``error`` or ``ok``."""
    setup: Callable[[Path], None] | None = None
    """Writes what the case needs into its directory before the command runs."""
    check: Callable[[Path, str], str | None] | None = None
    """(case directory, stderr) -> what is missing (for ``ok``) or wrong (for ``error``), or None."""
    run: bool = False
    """Starts workers (only with ``python -m audit.bad_inputs --with-runs``)."""
    area: str = ""
    status: int = 0
    """For ``ok``: the exit status expected (143 after a SIGTERM, -9 for a driver killed so)."""
    during: Callable[[subprocess.Popen, Path], object] | None = None
    """Called once the command has started (a signal, a kill); its stderr is ``hooks.log(d, "stderr")``."""
    probe: bool = False
    """Run through ``hooks.PROBE``; wrong if Ray, vLLM or torch was imported (before any worker)."""


# -- fixtures --------------------------------------------------------------------------------
REWARDS = {
    "raises_at_import.py": "raise RuntimeError('boom at import')\n",
    "syntax_error.py": "def compute_score(:\n",
    "other_name.py": "def score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n",
    "not_callable.py": "compute_score = 5\n",
    "wrong_signature.py": "def compute_score(solution_str):\n    return 1.0\n",
    "returns_none.py": "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                       "    return None\n",
    "returns_string.py": "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                         "    return 'high'\n",
    "returns_nan.py": "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                      "    return float('nan')\n",
    "raises_when_called.py": "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                             "    raise KeyError(ground_truth)\n",
    "sleeps_30s.py": "import time\n\n\ndef compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                     "    time.sleep(30)\n    return 1.0\n",
    "exits_3.py": "import sys\n\n\ndef compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                  "    sys.exit(3)\n",
    # The 3rd call (the first is tried on one row before any worker starts) hangs far past any limit.
    "hangs_once.py": "import time\n\n_calls = [0]\n\n\ndef compute_score(data_source, solution_str, ground_truth, "
                     "extra_info=None):\n    _calls[0] += 1\n    if _calls[0] == 3:\n        time.sleep(600)\n"
                     "    return float(solution_str.strip() == str(ground_truth).strip())\n",
    # The first call (tried on one row before any worker starts) is fine, every 5th after exits.
    "exits_sometimes.py": "import sys\n\n_calls = [0]\n\n\ndef compute_score(data_source, solution_str, "
                          "ground_truth, extra_info=None):\n    _calls[0] += 1\n    if _calls[0] % 5 == 0:\n"
                          "        sys.exit(3)\n"
                          "    return float(solution_str.strip() == str(ground_truth).strip())\n",
    # The first call (tried on one row before any worker starts) is fine, every 5th after is NaN.
    "nan_sometimes.py": "_calls = [0]\n\n\ndef compute_score(data_source, solution_str, ground_truth, "
                        "extra_info=None):\n    _calls[0] += 1\n    if _calls[0] % 5 == 0:\n"
                        "        return float('nan')\n"
                        "    return float(solution_str.strip() == str(ground_truth).strip())\n",
}

SCENARIOS = {
    "list.yaml": "- devices: 4\n- steps: 2\n",
    "scalar.yaml": "42\n",
    "syntax.yaml": "devices: [4\nsteps: 2\n",
    "negative_devices.yaml": "devices: -4\n",
    "typo.yaml": "devcies: 8\n",
    "pools_mismatch.yaml": "devices: 8\npools: {rollout_devices: 4, train_devices: 8}\n",
    "bad_hardware.yaml": "hardware: TPU-v9\n",
    "min_over_max.yaml": "workload: {response_length: {min: 900, max: 100}}\n",
    "file_dist_no_file.yaml": "workload: {response_length: {dist: file}}\n",
    "file_dist_missing.yaml": "workload: {response_length: {dist: file, file: nowhere.txt}}\n",
    "devices_string.yaml": "devices: sixteen\n",
    "workload_list.yaml": "workload: [1, 2]\n",
    "tp_not_dividing.yaml": "pools: {rollout_devices: 8, train_devices: 8, rollout_tp: 3}\n",
    "bad_lengths.yaml": "workload: {response_length: {dist: file, file: lengths.txt}}\n",
    "empirical_empty.yaml": "workload: {response_length: {dist: empirical}}\n",
    "empirical_negative.yaml": "workload: {response_length: {dist: empirical, values: [100, -3]}}\n",
    "calibration_short.yaml": "calibration: {decode: [0.01]}\n",
    "calibration_negative.yaml": "calibration: {prefill: [0.01, -1]}\n",
    "no_hardware.yaml": "model: Qwen3-8B\n",
    "custom_hardware_short.yaml": "hardware: {memory_gib: 96, peak_tflops: 700}\n",
}
# Every scenario names its device and model (required): each bad file above is bad in the one
# field it is about.
SCENARIOS = {k: v if k in ("list.yaml", "scalar.yaml", "syntax.yaml", "no_hardware.yaml")
             or v.startswith("hardware:") else "hardware: H100-80GB\nmodel: Qwen3-8B\n" + v
             for k, v in SCENARIOS.items()}
for _k in ("bad_hardware.yaml", "custom_hardware_short.yaml"):
    SCENARIOS[_k] += "model: Qwen3-8B\n"

CONFIGS = {
    "list.yaml": "- trainer: {lr: 0.001}\n",
    "scalar.yaml": "5\n",
    "syntax.yaml": "trainer: {lr: 0.001\nrun: {steps: 2}\n",
    "typo_section.yaml": "trainr: {lr: 0.001}\n",
    "section_list.yaml": "trainer: [1, 2]\n",
    "bad_value.yaml": "rollout: {group_size: 1}\n",
    "alias_conflict.yaml": "data: {train_batch_size: 8}\nrollout: {prompts_per_step: 4}\n",
}

_ROW = {"prompt": "copy 12", "data_source": "copy", "reward_model": {"ground_truth": "12"}}


def _jsonl(path: Path, rows: list) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _image_fixtures(f: Path) -> None:
    """veRL-layout image rows (issue 40), each wrong in one way; images as paths beside them."""
    import io

    from PIL import Image

    def png(size: int) -> bytes:
        buf = io.BytesIO()
        Image.new("RGB", (size, size), "red").save(buf, format="PNG")
        return buf.getvalue()

    (f / "images").mkdir(exist_ok=True)
    (f / "images" / "ok.png").write_bytes(png(32))
    (f / "images" / "big.png").write_bytes(png(200))
    (f / "images" / "not_an_image.png").write_text("this is text, not a PNG\n")
    row = {"prompt": [{"role": "user", "content": "<image>What colour is the largest shape?"}],
           "images": [{"path": "images/ok.png"}], "data_source": "shapes", "reward_model": {"ground_truth": "red"}}
    _jsonl(f / "img_ok.jsonl", [row] * 4)
    _jsonl(f / "img_undecodable.jsonl", [row, {**row, "images": [{"path": "images/not_an_image.png"}]}])
    _jsonl(f / "img_missing.jsonl", [row, row, {**row, "images": [{"path": "images/nope.png"}]}])
    _jsonl(f / "img_two_placeholders.jsonl", [{**row, "prompt": [{"role": "user", "content": "<image><image>Which?"}]}])
    _jsonl(f / "img_big.jsonl", [row, {**row, "images": [{"path": "images/big.png"}]}])


ENVIRONMENTS = {  # issue 42: a user's environment file, each wrong in one way (docs/environments.md)
    "env_ok.py": "class Environment:\n    def reset(self, row):\n        return list(row['prompt'])\n"
                 "    def step(self, text):\n        return [], 1.0, True\n",
    "env_no_step.py": "class Environment:\n    def reset(self, row):\n        return list(row['prompt'])\n",
    "env_raises_at_import.py": "raise RuntimeError('boom at import')\n",
    "env_step_raises.py": "class Environment:\n    def reset(self, row):\n        return list(row['prompt'])\n"
                          "    def step(self, text):\n        raise KeyError('tool crashed')\n",
    "env_step_hangs.py": "import time\nclass Environment:\n    def reset(self, row):\n"
                         "        return list(row['prompt'])\n"
                         "    def step(self, text):\n        time.sleep(30)\n        return [], 1.0, True\n",
    "env_step_malformed.py": "class Environment:\n    def reset(self, row):\n        return list(row['prompt'])\n"
                             "    def step(self, text):\n        return 'not a tuple'\n",
}


def make_fixtures(f: Path) -> None:
    """Every shared input file: reward files, environments, scenarios, configs, data files."""
    f.mkdir(parents=True, exist_ok=True)
    for name, text in {**REWARDS, **ENVIRONMENTS}.items():
        (f / name).write_text(text)
    (f / "scenarios").mkdir(exist_ok=True)
    for name, text in SCENARIOS.items():
        (f / "scenarios" / name).write_text(text)
    (f / "scenarios" / "lengths.txt").write_text("120\n-5\nabc\n")
    (f / "configs").mkdir(exist_ok=True)
    for name, text in CONFIGS.items():
        (f / "configs" / name).write_text(text)
    _jsonl(f / "good.jsonl", [_ROW] * 8)
    _jsonl(f / "prompt_int.jsonl", [_ROW, {**_ROW, "prompt": 3}])
    _jsonl(f / "no_prompt.jsonl", [{k: v for k, v in _ROW.items() if k != "prompt"}])
    _jsonl(f / "no_ground_truth.jsonl", [{**_ROW, "reward_model": {}}])
    _jsonl(f / "bad_role.jsonl", [{**_ROW, "prompt": [{"role": "wizard", "content": "hi"}]}])
    _jsonl(f / "row_list.jsonl", [[1, 2, 3]])
    _jsonl(f / "long.jsonl", [{**_ROW, "prompt": "copy " + "7" * 300}] * 4)
    _jsonl(f / "some_long.jsonl", [_ROW] * 6 + [{**_ROW, "prompt": "copy " + "7" * 300}] * 2)
    (f / "empty.jsonl").write_text("")
    (f / "not_json.jsonl").write_text(json.dumps(_ROW) + "\n{not json\n")
    (f / "not_json_line_31.jsonl").write_text("".join(json.dumps(_ROW) + "\n" for _ in range(30)) + "{not json\n")
    good = json.dumps(_ROW).encode()
    (f / "not_utf8.jsonl").write_bytes(good + b"\n" + good.replace(b"copy 12", b"copy \xff12") + b"\n")
    hooks.write_bert_model(f / "models" / "bert")
    hooks.write_vision_language_model(f / "models" / "vision_language")
    _image_fixtures(f)
    (f / "blank_line.jsonl").write_text(json.dumps(_ROW) + "\n\n" + json.dumps(_ROW) + "\n")
    (f / "rows.txt").write_text("copy 12\n")
    (f / "garbage.parquet").write_bytes(b"PAR1 this is not parquet at all")
    (f / "a_directory.parquet").mkdir(exist_ok=True)
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:  # the runtime extras are not installed: the parquet cases report it
        return
    pq.write_table(pa.table({"prompt": pa.array([], pa.string()), "data_source": pa.array([], pa.string())}),
                   f / "empty.parquet")
    pq.write_table(pa.table({"question": ["copy 1"], "data_source": ["copy"]}), f / "no_prompt_column.parquet")
    pq.write_table(pa.table({"prompt": [1.5, 2.5], "data_source": ["copy", "copy"],
                             "reward_model": [{"ground_truth": "1"}, {"ground_truth": "2"}]}),
                   f / "prompt_float.parquet")
    pq.write_table(pa.table({"prompt": ["copy 1"], "data_source": [7],
                             "reward_model": [{"ground_truth": "1"}]}), f / "source_int.parquet")


def _checkpoint(run: Path, step: int, pps: int) -> None:
    """A checkpoint the resume checks accept (whole files, the ledger up to it), and no more."""
    import struct
    import zipfile

    ck = run / "checkpoints" / f"step_{step}"
    (ck / "trainer").mkdir(parents=True)
    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    (ck / "trainer" / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 16)
    with zipfile.ZipFile(ck / "trainer" / "optimizer.pt", "w") as z:
        z.writestr("data.pkl", b"x")
    (ck / "trainer" / "trainer_state.json").write_text(json.dumps({"version": step}))
    (ck / "state.json").write_text(json.dumps({"next_step": step, "cursor": {}, "store": {"groups": []},
                                               "rewards_by_step": {str(k): 0.5 for k in range(step)}}))
    (ck / "COMPLETE").write_text("now")
    (run / "trained_groups.jsonl").write_text("".join(
        json.dumps({"group": k * pps + i, "step": k, "staleness": 0}) + "\n" for k in range(step) for i in range(pps)))


def _run_dir(d: Path, *overrides: str, checkpoint: str | None = None) -> None:
    """``d/run``: a run directory as a run that wrote its config (and maybe a checkpoint) leaves it.

    ``checkpoint``: None, ``torn`` (one whose state.json is cut short) or ``finished`` (a
    whole one at ``run.steps``)."""
    import yaml

    from bidirl.runtime.config import load_config

    run = d / "run"
    run.mkdir(parents=True)
    cfg = load_config(None, list(overrides))
    (run / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    if checkpoint == "torn":
        ck = run / "checkpoints" / "step_2"
        ck.mkdir(parents=True)
        (ck / "state.json").write_text('{"next_step": 2, "cur')
        (ck / "COMPLETE").write_text("now")
    elif checkpoint == "finished":
        _checkpoint(run, cfg.run.steps, cfg.rollout.prompts_per_step)


def _resume_dir(*overrides: str, checkpoint: str | None = None) -> Callable[[Path], None]:
    return lambda d: _run_dir(d, *overrides, checkpoint=checkpoint)


def _torn_config(d: Path) -> None:
    _run_dir(d)
    p = d / "run" / "config.yaml"
    p.write_text(p.read_text()[:37])


def _nonempty(d: Path) -> None:
    (d / "taken").mkdir()
    (d / "taken" / "something.txt").write_text("x")


def _file_at(name: str) -> Callable[[Path], None]:
    return lambda d: (d / name).write_text("not a directory\n")


def _data_reordered(d: Path) -> None:
    """A finished run on ``d/data.jsonl`` (its fingerprint recorded as a run records it), then
    the file's rows reversed in place: the same rows, the same count, another order."""
    from bidirl.runtime.config import load_config
    from bidirl.runtime.run_dir import record_data

    rows = [{**_ROW, "prompt": f"copy {i}", "reward_model": {"ground_truth": str(i)}} for i in range(8)]
    _jsonl(d / "data.jsonl", rows)
    _run_dir(d, f"data.files={d / 'data.jsonl'}", "run.steps=3", checkpoint="finished")
    record_data(d / "run", load_config(str(d / "run" / "config.yaml"), []))
    _jsonl(d / "data.jsonl", rows[::-1])


# -- checks of the cases that should succeed ---------------------------------------------------
def _summary(d: Path) -> dict:
    return json.loads((d / "run" / "summary.json").read_text())


def _bad_counted(d: Path, stderr: str) -> str | None:
    s = _summary(d)
    if not s.get("audit_ok"):
        return "audit failed"
    return None if s.get("reward_bad_count", 0) > 0 else "no bad reward counted (reward/bad_count)"


def _filtered(d: Path, stderr: str) -> str | None:
    if "2 over data.max_prompt_length=64 dropped" not in stderr:
        return "the dropped rows are not counted on stderr"
    return None if _summary(d).get("audit_ok") else "audit failed"


def _ended_as(outcome: str) -> Callable[[Path, str], str | None]:
    """A run whose every trajectory ended as ``outcome`` (``multi_turn/outcome/<outcome>`` 1 at
    every step) and went on to finish, audited clean."""
    def check(d: Path, stderr: str) -> str | None:
        if not _summary(d).get("audit_ok"):
            return "audit failed"
        steps = [m for m in (json.loads(x) for x in (d / "run" / "metrics.jsonl").read_text().splitlines() if x)
                 if "reward/mean" in m]
        shares = [m.get(f"multi_turn/outcome/{outcome}") for m in steps]
        return None if steps and all(x == 1.0 for x in shares) else f"trajectories not all {outcome}: {shares}"
    return check


def _trained_from_0(d: Path, stderr: str) -> str | None:
    if "no complete checkpoint yet: starting from step 0" not in stderr:
        return "did not say it starts from step 0"
    return None if _summary(d).get("audit_ok") else "audit failed"


def _finished(d: Path, stderr: str) -> str | None:
    if "this run is finished" not in stderr:
        return "did not say the run is finished"
    return "started workers" if "workers up" in stderr else None


def _lr_recorded(d: Path, stderr: str) -> str | None:
    problem = _finished(d, stderr)
    if problem:
        return problem
    path = d / "run" / "resume_changes.jsonl"
    if not path.is_file():
        return "resume_changes.jsonl not written"
    rec = [json.loads(ln) for ln in path.read_text().splitlines()]
    return None if [(r["field"], r["new"]) for r in rec] == [("trainer.lr", 1e-4)] else f"recorded {rec}"


def _data_change_recorded(d: Path, stderr: str) -> str | None:
    problem = _finished(d, stderr)
    if problem:
        return problem
    if "resuming on changed training data (--allow-data-change)" not in stderr:
        return "did not say it resumes on changed data"
    path = d / "run" / "resume_changes.jsonl"
    rec = [json.loads(ln) for ln in path.read_text().splitlines()] if path.is_file() else []
    return None if [r["field"] for r in rec] == ["data.files"] else f"resume_changes.jsonl holds {rec}"


def _timed_out_and_went_on(d: Path, stderr: str) -> str | None:
    if "hangs_once.py:compute_score did not return within 2 s (data.reward_timeout_s=2" not in stderr:
        return "no timeout message naming the call and data.reward_timeout_s"
    stdout = hooks.log(d, "stdout").read_text()
    if "slow rewards 1" not in stdout + stderr:
        return "the progress line does not count the slow reward"
    return _bad_counted(d, stderr)


def _config_unchanged(d: Path, stderr: str) -> str | None:
    """``train --print-config`` printed the default config: the override was taken and changed nothing."""
    default = subprocess.run([sys.executable, "-m", "bidirl.cli", "train", "--print-config"], cwd=d,
                             env=hooks.cli_env(), capture_output=True, text=True, timeout=120)
    same = hooks.log(d, "stdout").read_text() == default.stdout
    return None if same else "the printed config differs from the default"


def _plan_ok(d: Path, stderr: str) -> str | None:
    return None if (d / "plan.json").is_file() else "plan.json not written"


def _help_ok(d: Path, stderr: str) -> str | None:
    return None


# -- the cases ---------------------------------------------------------------------------------
def _train(name: str, *args: str, names: str, area: str = "config", **kw) -> Case:
    """``bidirl train`` in a fresh run directory of the case's own."""
    return Case(name, ("train", "--run-dir", "{d}/run", *args), names=names, area=area, **kw)


CASES: list[Case] = [
    # --- train config: every section, wrong types / out of range / unknown names / typos
    _train("trainer.lr out of range", "trainer.lr=2", names="trainer.lr"),
    _train("trainer.lr zero", "trainer.lr=0", names="trainer.lr"),
    _train("trainer.lr not a number", "trainer.lr=fast", names="trainer.lr"),
    _train("trainer.lr typo", "trainer.lrr=1e-4", names="did you mean lr"),
    _train("trainer.micro_batch_size zero", "trainer.micro_batch_size=0", names="trainer.micro_batch_size"),
    _train("trainer.betas scalar", "trainer.betas=0.9", names="trainer.betas"),
    _train("trainer.betas one value", "trainer.betas=[0.9]", names="trainer.betas"),
    _train("trainer.betas out of range", "trainer.betas=[0.9,1.5]", names="trainer.betas"),
    _train("trainer.max_grad_norm negative", "trainer.max_grad_norm=-1", names="trainer.max_grad_norm"),
    _train("trainer.clip_eps_low >= 1", "trainer.clip_eps_low=1", names="trainer.clip_eps_low"),
    _train("trainer.on_nonfinite unknown", "trainer.on_nonfinite=ignore", names="trainer.on_nonfinite"),
    _train("trainer.threads zero", "trainer.threads=0", names="trainer.threads"),
    _train("trainer.kl_coef string", "trainer.kl_coef=[a]", names="trainer.kl_coef"),
    _train("model.tiny_hidden 7", "model.tiny_hidden=7", names="model.tiny_hidden"),
    _train("model.tiny_hidden 136 (head_dim 34)", "model.tiny_hidden=136", names="model.tiny_hidden"),
    _train("model.tiny_hidden zero", "model.tiny_hidden=0", names="model.tiny_hidden"),
    _train("model.tiny_layers zero", "model.tiny_layers=0", names="model.tiny_layers"),
    _train("model.dtype unknown", "model.dtype=int8", names="model.dtype"),
    _train("model.path missing", "model.path=/nonexistent/model", names="model.path"),
    _train("model.path is a file", "model.path={f}/good.jsonl", names="model.path"),
    _train("model.warm_start_steps negative", "model.warm_start_steps=-1", names="model.warm_start_steps"),
    _train("model typo", "model.tiny_hiden=64", names="did you mean tiny_hidden"),
    _train("data.seed negative", "data.seed=-1", names="data.seed"),
    _train("data.seed fractional", "data.seed=1.5", names="data.seed"),
    _train("data.task unknown", "data.task=chess", names="data.task"),
    _train("data.task null without files", "data.task=null", names="data.task"),
    _train("data.max_prompt_length zero", "data.max_prompt_length=0", names="data.max_prompt_length"),
    _train("data.on_bad_reward unknown", "data.on_bad_reward=ignore", names="data.on_bad_reward"),
    _train("data.filter_overlong_prompts not bool", "data.filter_overlong_prompts=maybe",
           names="data.filter_overlong_prompts"),
    _train("data.reward_fn_name empty", "data.reward_fn={f}/other_name.py", "data.reward_fn_name=",
           names="data.reward_fn_name"),
    _train("rollout.max_num_seqs zero", "rollout.max_num_seqs=0", names="rollout.max_num_seqs"),
    _train("rollout.prompts_per_step zero", "rollout.prompts_per_step=0", names="rollout.prompts_per_step"),
    _train("rollout.group_size 1", "rollout.group_size=1", names="rollout.group_size"),
    _train("rollout.group_size word", "rollout.group_size=four", names="rollout.group_size"),
    _train("rollout.max_new_tokens huge", "rollout.max_new_tokens=100000", names="rollout.max_new_tokens"),
    _train("rollout.temperature zero", "rollout.temperature=0", names="rollout.temperature"),
    _train("rollout.kv_cache_mb tiny", "rollout.kv_cache_mb=1", names="rollout.kv_cache_mb"),
    _train("scheduler.policy unknown", "scheduler.policy=fastest", names="scheduler.policy"),
    _train("scheduler.staleness negative", "scheduler.staleness=-1", names="scheduler.staleness"),
    _train("scheduler.staleness huge", "scheduler.staleness=100", names="scheduler.staleness"),
    _train("scheduler typo", "scheduler.polcy=async", names="did you mean policy"),
    _train("cluster.rollout_devices zero", "cluster.rollout_devices=0", names="cluster.rollout_devices"),
    _train("cluster.device unknown", "cluster.device=tpu", names="cluster.device"),
    _train("cluster.gpus_per_device 2", "cluster.gpus_per_device=2", names="cluster.gpus_per_device"),
    _train("cluster.oversubscribe not bool", "cluster.oversubscribe=maybe", names="cluster.oversubscribe"),
    _train("cluster larger than the machine", "cluster.rollout_devices=300", "cluster.train_devices=300",
           names="cluster.oversubscribe", area="cluster"),
    _train("trainer.strategy unknown", "trainer.strategy=zero3", names="trainer.strategy"),
    _train("trainer state over cluster.device_memory_gib", "cluster.train_devices=2", "cluster.oversubscribe=true",
           "cluster.device_memory_gib=0.008", names="trainer.strategy=fsdp2", area="cluster"),
    _train("run.steps zero", "run.steps=0", names="run.steps"),
    _train("run.checkpoint_every negative", "run.checkpoint_every=-1", names="run.checkpoint_every"),
    _train("run.keep_checkpoints zero", "run.keep_checkpoints=0", names="run.keep_checkpoints"),
    _train("run.seed negative", "run.seed=-1", names="run.seed"),
    _train("run.tensorboard not bool", "run.tensorboard=2", names="run.tensorboard"),
    _train("section given a value", "run=5", names="run"),
    _train("value used as a section", "run.steps.max=3", names="run.steps"),
    _train("unknown section", "optimizer.lr=1e-4", names="optimizer"),
    _train("section typo", "trainr.lr=1e-4", names="did you mean trainer"),
    _train("override without =", "trainer.lr", names="trainer.lr"),
    _train("override with empty key", "=5", names="override"),
    _train("override value not YAML", "trainer.betas=[0.9", names="trainer.betas"),
    _train("trainer.lr_schedule unknown", "trainer.lr_schedule=step", names="trainer.lr_schedule"),
    _train("trainer.lr_min_ratio over 1", "trainer.lr_min_ratio=2", names="trainer.lr_min_ratio"),
    _train("rollout.top_p zero", "rollout.top_p=0", names="rollout.top_p"),
    _train("rollout.top_k below -1", "rollout.top_k=-5", names="rollout.top_k"),
    _train("rollout.max_new_tokens_start zero", "rollout.max_new_tokens_start=0",
           names="rollout.max_new_tokens_start"),
    _train("data.val_files missing", "data.val_files={d}/missing.parquet", names="data.val_files[0]"),
    _train("data.val_max_samples zero", "data.val_max_samples=0", names="data.val_max_samples"),
    _train("run.wandb without the package", "run.wandb=true", names="run.wandb"),
    _train("run.worker_log_level unknown", "run.worker_log_level=loud", names="run.worker_log_level"),
    _train("veRL field bidirl does not take", "actor_rollout_ref.actor.ppo_epochs=2",
           names="actor_rollout_ref.actor.ppo_epochs"),
    _train("veRL alias and field disagree", "--config", "{f}/configs/alias_conflict.yaml",
           names="rollout.prompts_per_step", area="yaml"),
    _train("veRL alias bad value", "actor_rollout_ref.rollout.n=1", names="rollout.group_size"),
    Case("--print-config bad field", ("train", "--print-config", "trainer.lrr=1"), names="did you mean lr",
         area="config"),
    # --- config files
    _train("--config missing", "--config", "{d}/nope.yaml", names="nope.yaml", area="yaml"),
    _train("--config top level a list", "--config", "{f}/configs/list.yaml", names="list.yaml", area="yaml"),
    _train("--config top level a scalar", "--config", "{f}/configs/scalar.yaml", names="scalar.yaml", area="yaml"),
    _train("--config syntax error", "--config", "{f}/configs/syntax.yaml", names="not valid YAML", area="yaml"),
    _train("--config section typo", "--config", "{f}/configs/typo_section.yaml", names="did you mean trainer",
           area="yaml"),
    _train("--config section a list", "--config", "{f}/configs/section_list.yaml", names="trainer", area="yaml"),
    _train("--config bad value", "--config", "{f}/configs/bad_value.yaml", names="rollout.group_size", area="yaml"),
    _train("--config a directory", "--config", "{f}/configs", names="configs", area="yaml"),
    # --- data files
    _train("data file missing", "data.files={d}/missing.parquet", names="data.files[0]", area="data"),
    _train("data file unknown format", "data.files={f}/rows.txt", names="data.files[0]", area="data"),
    _train("data file a directory", "data.files={f}/a_directory.parquet", names="data.files[0]", area="data"),
    _train("parquet empty", "data.files={f}/empty.parquet", names="empty.parquet", area="data"),
    _train("parquet not parquet", "data.files={f}/garbage.parquet", names="garbage.parquet", area="data"),
    _train("parquet without prompt column", "data.files={f}/no_prompt_column.parquet", names="'prompt'",
           area="data"),
    _train("parquet prompt a float", "data.files={f}/prompt_float.parquet", names="'prompt'", area="data"),
    _train("parquet data_source an int", "data.files={f}/source_int.parquet", names="'data_source'", area="data"),
    _train("jsonl empty", "data.files={f}/empty.jsonl", names="empty.jsonl", area="data"),
    _train("jsonl prompt an int", "data.files={f}/prompt_int.jsonl", names="line 2", area="data"),
    _train("jsonl without prompt", "data.files={f}/no_prompt.jsonl", names="'prompt'", area="data"),
    _train("jsonl without ground truth", "data.files={f}/no_ground_truth.jsonl", names="ground_truth",
           area="data"),
    _train("jsonl unknown role", "data.files={f}/bad_role.jsonl", names="role", area="data"),
    _train("jsonl row not an object", "data.files={f}/row_list.jsonl", names="line 1", area="data"),
    _train("jsonl invalid JSON line", "data.files={f}/not_json.jsonl", names="line 2", area="data"),
    _train("jsonl blank line", "data.files={f}/blank_line.jsonl", names="line 2", area="data"),
    _train("over-long prompts", "data.files={f}/long.jsonl", "data.max_prompt_length=64",
           names="data.max_prompt_length", area="data"),
    _train("over-long prompts, all filtered", "data.files={f}/long.jsonl", "data.max_prompt_length=64",
           "data.filter_overlong_prompts=true", names="nothing left", area="data"),
    _train("prompt + max_new_tokens over the context", "data.files={f}/long.jsonl",
           "data.max_prompt_length=1000", "rollout.max_new_tokens=300", names="rollout.max_new_tokens", area="data"),
    # --- reward functions
    _train("reward file missing", "data.reward_fn={d}/nope.py", names="data.reward_fn", area="reward"),
    _train("reward file raises at import", "data.reward_fn={f}/raises_at_import.py", names="raises_at_import.py",
           area="reward"),
    _train("reward file syntax error", "data.reward_fn={f}/syntax_error.py", names="syntax_error.py", area="reward"),
    _train("reward function name absent", "data.reward_fn={f}/other_name.py", names="compute_score",
           area="reward"),
    _train("reward function name given, absent", "data.reward_fn={f}/other_name.py", "data.reward_fn_name=grade",
           names="grade", area="reward"),
    _train("reward name not callable", "data.reward_fn={f}/not_callable.py", names="compute_score", area="reward"),
    _train("reward wrong signature", "data.reward_fn={f}/wrong_signature.py", names="data.reward_fn",
           area="reward"),
    _train("reward returns None", "data.reward_fn={f}/returns_none.py", names="data.on_bad_reward", area="reward"),
    _train("reward returns a string", "data.reward_fn={f}/returns_string.py", names="data.on_bad_reward",
           area="reward"),
    _train("reward returns NaN", "data.reward_fn={f}/returns_nan.py", names="data.on_bad_reward", area="reward"),
    _train("reward raises when called", "data.reward_fn={f}/raises_when_called.py", names="KeyError",
           area="reward"),
    _train("reward file not .py", "data.reward_fn={f}/good.jsonl", names="data.reward_fn", area="reward"),
    # --- scenarios (simulate, plan)
    Case("scenario missing", ("simulate", "--scenario", "{d}/nope.yaml"), names="nope.yaml", area="scenario"),
    Case("scenario unknown built-in", ("simulate", "--scenario", "no-such-scenario"), names="no-such-scenario",
         area="scenario"),
    Case("scenario top level a list", ("simulate", "--scenario", "{f}/scenarios/list.yaml"), names="list",
         area="scenario"),
    Case("scenario top level a scalar", ("simulate", "--scenario", "{f}/scenarios/scalar.yaml"), names="mapping",
         area="scenario"),
    Case("scenario syntax error", ("simulate", "--scenario", "{f}/scenarios/syntax.yaml"), names="not valid YAML",
         area="scenario"),
    Case("scenario negative devices", ("simulate", "--scenario", "{f}/scenarios/negative_devices.yaml"),
         names="devices", area="scenario"),
    Case("scenario field typo", ("simulate", "--scenario", "{f}/scenarios/typo.yaml"), names="did you mean devices",
         area="scenario"),
    Case("scenario pools do not add up", ("simulate", "--scenario", "{f}/scenarios/pools_mismatch.yaml"),
         names="pools.train_devices", area="scenario"),
    Case("scenario unknown hardware", ("simulate", "--scenario", "{f}/scenarios/bad_hardware.yaml"),
         names="hardware", area="scenario"),
    Case("scenario min over max", ("simulate", "--scenario", "{f}/scenarios/min_over_max.yaml"),
         names="workload.response_length.min", area="scenario"),
    Case("scenario file dist without file", ("simulate", "--scenario", "{f}/scenarios/file_dist_no_file.yaml"),
         names="workload.response_length.file", area="scenario"),
    Case("scenario lengths file missing", ("simulate", "--scenario", "{f}/scenarios/file_dist_missing.yaml"),
         names="workload.response_length.file", area="scenario"),
    Case("scenario lengths file bad lines", ("simulate", "--scenario", "{f}/scenarios/bad_lengths.yaml"),
         names="lengths.txt", area="scenario"),
    Case("scenario devices a word", ("simulate", "--scenario", "{f}/scenarios/devices_string.yaml"),
         names="devices", area="scenario"),
    Case("scenario section a list", ("simulate", "--scenario", "{f}/scenarios/workload_list.yaml"),
         names="workload", area="scenario"),
    Case("scenario rollout_tp not dividing", ("simulate", "--scenario", "{f}/scenarios/tp_not_dividing.yaml"),
         names="pools.rollout_tp", area="scenario"),
    Case("scenario empirical without values", ("simulate", "--scenario", "{f}/scenarios/empirical_empty.yaml"),
         names="workload.response_length.values", area="scenario"),
    Case("scenario empirical negative length", ("simulate", "--scenario", "{f}/scenarios/empirical_negative.yaml"),
         names="workload.response_length.values", area="scenario"),
    Case("scenario calibration too few coefficients",
         ("simulate", "--scenario", "{f}/scenarios/calibration_short.yaml"), names="calibration.decode",
         area="scenario"),
    Case("scenario calibration negative coefficient",
         ("simulate", "--scenario", "{f}/scenarios/calibration_negative.yaml"), names="calibration.prefill",
         area="scenario"),
    Case("plan on a list scenario", ("plan", "--scenario", "{f}/scenarios/list.yaml"), names="list",
         area="scenario"),
    Case("plan on a missing lengths file", ("plan", "--scenario", "{f}/scenarios/file_dist_missing.yaml"),
         names="workload.response_length.file", area="scenario"),
    Case("scenario without hardware", ("simulate", "--scenario", "{f}/scenarios/no_hardware.yaml"),
         names="hardware", area="scenario"),
    Case("scenario custom hardware missing a figure",
         ("simulate", "--scenario", "{f}/scenarios/custom_hardware_short.yaml"),
         names="hardware.hbm_gbps", area="scenario"),
    Case("plan on a bad lengths file", ("plan", "--scenario", "{f}/scenarios/bad_lengths.yaml"),
         names="lengths.txt", area="scenario"),
    Case("scenario a directory", ("simulate", "--scenario", "{f}/scenarios"), names="scenarios", area="scenario"),
    # --- simulate / plan flags
    Case("simulate --steps 0", ("simulate", "--steps", "0"), names="--steps", area="flags"),
    Case("simulate --steps -3", ("simulate", "--steps", "-3"), names="--steps", area="flags"),
    Case("simulate --steps word", ("simulate", "--steps", "ten"), names="--steps", area="flags"),
    Case("simulate --seed -1", ("simulate", "--seed", "-1"), names="--seed", area="flags"),
    Case("simulate --policy unknown", ("simulate", "--policy", "fastest"), names="--policy", area="flags"),
    Case("simulate --plan unknown", ("simulate", "--plan", "maybe"), names="--plan", area="flags"),
    Case("simulate --grid unknown", ("simulate", "--grid", "huge"), names="--grid", area="flags"),
    Case("simulate --grid --policies unknown", ("simulate", "--grid", "paper", "--policies", "fastest"),
         names="--policies", area="flags"),
    Case("simulate --json into a directory", ("simulate", "--steps", "2", "--json", "{d}"), names="--json",
         area="flags"),
    Case("simulate --plot to a missing drive", ("simulate", "--steps", "2", "--plot", "/proc/nope/x.png"),
         names="--plot", area="flags"),
    Case("simulate --trace into a directory", ("simulate", "--steps", "2", "--trace", "{d}"), names="--trace",
         area="flags"),
    Case("plan --top 0", ("plan", "--top", "0"), names="--top", area="flags"),
    Case("plan --top -2", ("plan", "--top", "-2"), names="--top", area="flags"),
    Case("plan --top word", ("plan", "--top", "many"), names="--top", area="flags"),
    Case("plan --json into a directory", ("plan", "--json", "{d}"), names="--json", area="flags"),
    Case("unknown subcommand", ("tune",), names="tune", area="flags"),
    Case("export a missing run", ("export", "{d}/nope", "{d}/out"), names="nope", area="flags"),
    Case("export --step negative", ("export", "{d}/run", "{d}/out", "--step", "-1"), names="--step",
         setup=_resume_dir(), area="flags"),
    Case("export a run without checkpoints", ("export", "{d}/run", "{d}/out"), names="checkpoint",
         setup=_resume_dir(), area="flags"),
    Case("make-model --layers -1", ("make-model", "{d}/m", "--layers", "-1"), names="--layers", area="flags"),
    Case("make-model --heads 0", ("make-model", "{d}/m", "--heads", "0"), names="--heads", area="flags"),
    Case("make-model --hidden not a multiple", ("make-model", "{d}/m", "--hidden", "7", "--heads", "4"),
         names="hidden_size", area="flags"),
    Case("make-model --arch unknown", ("make-model", "{d}/m", "--arch", "gpt-9"), names="--arch", area="flags"),
    Case("make-model --vocab below the tokenizer", ("make-model", "{d}/m", "--vocab", "3"), names="vocab_size",
         area="flags"),
    Case("make-model into a non-empty directory", ("make-model", "{d}/taken"), names="taken", setup=_nonempty,
         area="flags"),
    Case("plan --json", ("plan", "--top", "1", "--json", "{d}/plan.json"), expect="ok", check=_plan_ok,
         area="flags"),
    # --- resume
    Case("--resume missing directory", ("train", "--resume", "{d}/nope"), names="--resume", area="resume"),
    Case("--resume directory without config", ("train", "--resume", "{d}"), names="config.yaml", area="resume"),
    Case("--resume a file", ("train", "--resume", "{d}/file"), names="--resume", setup=_file_at("file"),
         area="resume"),
    Case("--resume with --config", ("train", "--resume", "{d}/run", "--config", "{f}/configs/bad_value.yaml"),
         names="--config", setup=_resume_dir(), area="resume"),
    Case("--resume with --run-dir", ("train", "--resume", "{d}/run", "--run-dir", "{d}/other"), names="--run-dir",
         setup=_resume_dir(), area="resume"),
    Case("--resume changes prompts_per_step", ("train", "--resume", "{d}/run", "rollout.prompts_per_step=16"),
         names="rollout.prompts_per_step", setup=_resume_dir(), area="resume"),
    Case("--resume changes data.seed and group_size", ("train", "--resume", "{d}/run", "data.seed=3",
                                                       "rollout.group_size=4"),
         names="data.seed", setup=_resume_dir(), area="resume"),
    Case("--resume changes the model", ("train", "--resume", "{d}/run", "model.tiny_layers=3"),
         names="model.tiny_layers", setup=_resume_dir(), area="resume"),
    Case("--resume bad override value", ("train", "--resume", "{d}/run", "trainer.lr=-1"), names="trainer.lr",
         setup=_resume_dir(), area="resume"),
    Case("--resume torn config.yaml", ("train", "--resume", "{d}/run"), names="config.yaml", setup=_torn_config,
         area="resume"),
    Case("--resume only a damaged checkpoint", ("train", "--resume", "{d}/run"), names="step_2",
         setup=_resume_dir(checkpoint="torn"), area="resume"),
    Case("--resume a finished run", ("train", "--resume", "{d}/run"), expect="ok", check=_finished,
         setup=_resume_dir("run.steps=3", checkpoint="finished"), area="resume"),
    Case("--resume a finished run, new lr", ("train", "--resume", "{d}/run", "trainer.lr=1e-4"), expect="ok",
         check=_lr_recorded, setup=_resume_dir("run.steps=3", checkpoint="finished"), area="resume"),
    Case("--resume run.steps below the checkpoint", ("train", "--resume", "{d}/run", "run.steps=2"),
         names="run.steps", setup=_resume_dir("run.steps=3", checkpoint="finished"), area="resume"),
    Case("--run-dir not empty", ("train", "--run-dir", "{d}/taken"), names="--resume", setup=_nonempty,
         area="resume"),
    Case("--run-dir is a file", ("train", "--run-dir", "{d}/file"), names="file", setup=_file_at("file"),
         area="resume"),
    # --- issue 43: models checked before any worker starts (probe: no Ray, vLLM or torch imported)
    _train("model.path a small-vocab model", "model.path={d}/small_vocab", names="vocab_size 200",
           setup=hooks.small_vocab_model, probe=True, area="model"),
    _train("model.path a BERT model", "model.path={f}/models/bert", names="architecture BertForMaskedLM",
           probe=True, area="model"),
    _train("model.path a vision-language model", "model.path={f}/models/vision_language",
           names="vision-language", probe=True, area="model"),
    # --- issue 43: the guarded reward call, data, veRL's adv_estimator, data identity on resume
    _train("reward sleeps 30 s, data.reward_timeout_s=1", "data.reward_fn={f}/sleeps_30s.py",
           "data.reward_timeout_s=1", names="sleeps_30s.py:compute_score did not return within 1 s "
           "(data.reward_timeout_s=1", area="reward"),
    _train("reward calls sys.exit(3)", "data.reward_fn={f}/exits_3.py",
           names="exits_3.py:compute_score raised SystemExit: 3", area="reward"),
    _train("jsonl not UTF-8", "data.files={f}/not_utf8.jsonl", names="not_utf8.jsonl: line 2: byte 0xff at byte "
           "offset", area="data"),
    _train("jsonl invalid JSON at line 31", "data.files={f}/not_json_line_31.jsonl",
           names="not_json_line_31.jsonl: line 31", area="data"),
    Case("algorithm.adv_estimator=grpo (veRL's default)", ("train", "--print-config", "algorithm.adv_estimator=grpo"),
         expect="ok", check=_config_unchanged, area="config"),
    _train("algorithm.adv_estimator another value", "algorithm.adv_estimator=gae", names="algorithm.adv_estimator"),
    Case("--resume, data file reordered in place", ("train", "--resume", "{d}/run"), names="data.jsonl",
         setup=_data_reordered, area="resume"),
    Case("--resume, data file reordered, --allow-data-change", ("train", "--resume", "{d}/run",
                                                                 "--allow-data-change"),
         expect="ok", check=_data_change_recorded, setup=_data_reordered, area="resume"),
    # --- issue 40: image rows (veRL's multimodal layout) on the tiny vision-language model
    _train("image that is not an image", "model.kind=vl", "data.files={f}/img_undecodable.jsonl",
           names="img_undecodable.jsonl: line 2: field 'images[0]'", probe=True, area="images"),
    _train("image file missing", "model.kind=vl", "data.files={f}/img_missing.jsonl",
           names="img_missing.jsonl: line 3: field 'images[0]'", probe=True, area="images"),
    _train("two <image> placeholders, one image", "model.kind=vl", "data.files={f}/img_two_placeholders.jsonl",
           names="holds 1 image(s) but the prompt has 2", probe=True, area="images"),
    _train("image over data.max_image_pixels", "model.kind=vl", "data.files={f}/img_big.jsonl",
           "data.max_image_pixels=10000", names="over data.max_image_pixels=10,000", probe=True, area="images"),
    _train("data.max_image_pixels zero", "model.kind=vl", "data.files={f}/img_ok.jsonl", "data.max_image_pixels=0",
           names="data.max_image_pixels", area="images"),
    # --- issue 42: a user's multi-turn environment
    _train("env.path missing", "env.path={d}/nope.py", names="env.path", area="environment"),
    _train("env.name not in the file", "env.path={f}/env_ok.py", "env.name=Game",
           names="no class named 'Game'", probe=True, area="environment"),
    _train("environment without step", "env.path={f}/env_no_step.py", names="step", probe=True,
           area="environment"),
    _train("environment raises at import", "env.path={f}/env_raises_at_import.py", names="env_raises_at_import.py",
           probe=True, area="environment"),
    _train("environment and data.reward_fn", "env.path={f}/env_ok.py", "data.reward_fn={f}/other_name.py",
           names="data.reward_fn", probe=True, area="environment"),
    _train("environment with images", "env.path={f}/env_ok.py", "model.kind=vl", "data.task=shapes",
           names="model.kind=vl", probe=True, area="environment"),
    # --- need a real run (--with-runs): workers start
    _train("NaN reward, on_bad_reward=error", *SMALL, "run.steps=2", "data.reward_fn={f}/nan_sometimes.py",
           names="data.on_bad_reward=zero", area="reward", run=True),
    _train("NaN reward, on_bad_reward=zero", *SMALL, "run.steps=2", "data.reward_fn={f}/nan_sometimes.py",
           "data.on_bad_reward=zero", names="", expect="ok", check=_bad_counted, area="reward", run=True),
    _train("over-long prompts filtered", *SMALL, "run.steps=2", "data.files={f}/some_long.jsonl",
           "data.max_prompt_length=64", "data.filter_overlong_prompts=true", "model.warm_start_steps=0",
           names="", expect="ok", check=_filtered, area="data", run=True),
    Case("--resume a run without a checkpoint", ("train", "--resume", "{d}/run"), expect="ok",
         check=_trained_from_0, setup=_resume_dir(*SMALL, "run.steps=2", "model.warm_start_steps=0"),
         area="resume", run=True),
    # --- issue 43, with workers: rewards that hang or exit, a damaged checkpoint, signals, a killed driver
    _train("reward hangs once, data.reward_timeout_s=2, on_bad_reward=zero", *SMALL, *RL_RUN,
           "data.reward_fn={f}/hangs_once.py", "data.reward_timeout_s=2", "data.on_bad_reward=zero", names="",
           expect="ok", check=_timed_out_and_went_on, area="reward", run=True),
    _train("reward sometimes calls sys.exit(3), on_bad_reward=zero", *SMALL, *RL_RUN,
           "data.reward_fn={f}/exits_sometimes.py", "data.on_bad_reward=zero", names="", expect="ok",
           check=_bad_counted, area="reward", run=True),
    _train("every reward bad (sys.exit(3)), on_bad_reward=zero", *SMALL, *RL_RUN, "data.reward_fn={f}/exits_3.py",
           "data.on_bad_reward=zero", names="every reward of the first training step was bad", area="reward",
           run=True),
    Case("--resume, newest checkpoint bit-flipped", ("train", "--resume", "{d}/run"), expect="ok",
         setup=hooks.trained_then_damaged(*SMALL, "run.steps=4", "run.checkpoint_every=2", "model.warm_start_steps=0"),
         during=hooks.note_private_dir, check=hooks.fell_back_and_finished(4), area="checkpoint", run=True),
    _train("SIGTERM 4 s after the start", *SMALL, "run.steps=3", names="", expect="ok", status=143,
           during=hooks.sigterm_at(4.0), check=hooks.sigterm_line_and_nothing_left, area="exit", run=True),
    _train("driver killed (kill -9) once workers are up, then another bidirl", *SMALL, "run.steps=50", names="",
           expect="ok", status=-9, during=hooks.kill_when_workers_up, check=hooks.next_command_cleans_up,
           area="exit", run=True),
    # --- issue 42, with workers: an environment that raises, hangs or answers malformed ends its trajectory
    _train("environment step raises", *SMALL, *RL_RUN, "env.path={f}/env_step_raises.py", names="", expect="ok",
           check=_ended_as("env_error"), area="environment", run=True),
    _train("environment step hangs, env.turn_timeout_s=1", *SMALL, *RL_RUN, "env.path={f}/env_step_hangs.py",
           "env.turn_timeout_s=1", names="", expect="ok", check=_ended_as("env_timeout"), area="environment", run=True),
    _train("environment step malformed", *SMALL, *RL_RUN, "env.path={f}/env_step_malformed.py", names="",
           expect="ok", check=_ended_as("env_error"), area="environment", run=True),
]

FAST = [
    "trainer.lr out of range", "trainer.lr typo", "trainer.betas one value", "model.tiny_hidden 7",
    "model.tiny_hidden 136 (head_dim 34)", "data.seed negative", "rollout.max_num_seqs zero",
    "scheduler.policy unknown", "cluster larger than the machine", "run.seed negative", "value used as a section",
    "trainer.strategy unknown", "trainer state over cluster.device_memory_gib",
    "section typo", "override without =", "--config top level a list", "--config syntax error",
    "--config a directory", "data file missing", "jsonl prompt an int", "reward file missing",
    "scenario top level a list", "scenario negative devices", "scenario field typo",
    "scenario lengths file missing", "plan --top 0", "simulate --steps 0", "simulate --json into a directory",
    "parquet not parquet", "--resume missing directory", "--resume with --config", "--resume changes prompts_per_step",
    "--run-dir is a file", "model.path a BERT model", "model.path a vision-language model",
    "reward sleeps 30 s, data.reward_timeout_s=1", "reward calls sys.exit(3)", "jsonl not UTF-8",
    "jsonl invalid JSON at line 31", "algorithm.adv_estimator another value", "--resume, data file reordered in place",
    "image that is not an image", "two <image> placeholders, one image", "environment without step",
    "environment and data.reward_fn",
]
"""The subset ``tests/test_bad_inputs.py`` runs: each fails before anything heavy is imported."""


def cases(names: list[str] | None = None, with_runs: bool = False) -> list[Case]:
    by_name = {c.name: c for c in CASES}
    assert len(by_name) == len(CASES), "case names are unique"
    if names is not None:
        return [by_name[n] for n in names]
    return [c for c in CASES if with_runs or not c.run]


# -- running and classifying -------------------------------------------------------------------
@dataclass
class Outcome:
    case: Case
    cls: str
    rc: int | None
    message: str
    seconds: float

    @property
    def expected(self) -> str:
        return "error (exit 2)" if self.case.expect == "error" else f"ok (exit {self.case.status})"

    @property
    def got(self) -> str:
        return "timeout" if self.rc is None else f"exit {self.rc}"

    def to_json(self) -> dict:
        return {"case": self.case.name, "area": self.case.area, "args": list(self.case.args),
                "expected": self.expected, "got": self.got, "class": self.cls, "message": self.message,
                "seconds": round(self.seconds, 2), "needs_run": self.case.run}


def classify(case: Case, rc: int | None, stdout: str, stderr: str, check_problem: str | None) -> tuple[str, str]:
    """(class, the one-line message or what went wrong)."""
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    last = lines[-1].strip() if lines else ""
    if rc is None:
        return "hang", last
    if "Traceback" in stderr or "Traceback" in stdout:
        tb = [ln for ln in lines if ln.strip() and not ln.startswith(" ")]
        return "traceback", tb[-1] if tb else last
    if case.expect == "error":
        if rc != 2:
            return "wrong", f"exit {rc}: {last}"
        if case.names not in last:
            return "vague", last
        return ("clean", last) if check_problem is None else ("wrong", check_problem)
    if rc != case.status:
        return "wrong", f"exit {rc}: {last}"
    return ("correct", last) if check_problem is None else ("wrong", check_problem)


def _checked(case: Case, d: Path, rc: int | None, stderr: str) -> str | None:
    """What the case's checks (and its probe's) find wrong, once it ended as expected."""
    if rc != (2 if case.expect == "error" else case.status):
        return None
    checks = ([hooks.heavy_imports] if case.probe else []) + ([case.check] if case.check else [])
    for check in checks:
        try:
            problem = check(d, stderr)
        except (OSError, ValueError, KeyError) as e:
            problem = f"check failed: {type(e).__name__}: {e}"
        if problem:
            return problem
    return None


def run_case(case: Case, work: Path, fixtures: Path, timeout: float | None = None) -> Outcome:
    d = work / "".join(ch if ch.isalnum() else "_" for ch in case.name)
    d.mkdir(parents=True, exist_ok=True)
    if case.setup:
        try:
            case.setup(d)
        except Exception as e:  # noqa: BLE001 - a broken set-up is the case's outcome, not the table's end
            return Outcome(case, "wrong", None, f"set-up failed: {type(e).__name__}: {e}", 0.0)
    args = [a.format(d=d, f=fixtures) for a in case.args]
    timeout = timeout or (900 if case.run else 120)
    env = hooks.cli_env()
    if case.probe:
        cmd = [sys.executable, "-c", hooks.PROBE, *args]
        env["BIDIRL_BENCH_PROBE"] = str(hooks.log(d, "imported"))
    else:
        cmd = [sys.executable, "-m", "bidirl.cli", *args]
    t0 = time.perf_counter()
    failed = None
    # Into files, not pipes: a ``during`` hook reads stderr while the command runs.
    with hooks.log(d, "stdout").open("w") as out, hooks.log(d, "stderr").open("w") as err:
        proc = subprocess.Popen(cmd, cwd=d, env=env, text=True, stdout=out, stderr=err, start_new_session=True)
        try:
            if case.during:
                case.during(proc, d)
            rc = proc.wait(timeout=max(1.0, t0 + timeout - time.perf_counter()))
        except subprocess.TimeoutExpired:
            rc = None
        except Exception as e:  # noqa: BLE001 - a broken ``during`` hook: this case is wrong, the table goes on
            failed, rc = f"in-run action failed: {type(e).__name__}: {e}", None
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    seconds = time.perf_counter() - t0
    if failed:
        return Outcome(case, "wrong", rc, failed, seconds)
    stdout = hooks.log(d, "stdout").read_text(errors="replace")
    stderr = hooks.log(d, "stderr").read_text(errors="replace")
    cls, message = classify(case, rc, stdout, stderr, _checked(case, d, rc, stderr))
    return Outcome(case, cls, rc, message, seconds)


def run_cases(selected: list[Case], work: Path, progress: Callable[[Outcome], None] | None = None,
              timeout: float | None = None) -> list[Outcome]:
    import bidirl

    here = Path(bidirl.__file__).resolve()
    if not here.is_relative_to(ROOT / "src"):  # the set-ups would write another checkout's config
        raise RuntimeError(f"bidirl is imported from {here}, not from {ROOT / 'src'}; put it first on PYTHONPATH")
    fixtures = work / "fixtures"
    make_fixtures(fixtures)
    out = []
    for case in selected:
        o = run_case(case, work / "cases", fixtures, timeout)
        out.append(o)
        if progress:
            progress(o)
    return out


def format_table(outcomes: list[Outcome], width: int = 70) -> str:
    rows = [("case", "expected", "got", "class", "s", "message")]
    rows += [(o.case.name, o.expected, o.got, o.cls, f"{o.seconds:.1f}", o.message[:width]) for o in outcomes]
    w = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = [" | ".join(r[i].ljust(w[i]) for i in range(5)) + " | " + r[5] for r in rows]
    lines.insert(1, "-+-".join("-" * n for n in w) + "-+-" + "-" * 20)
    return "\n".join(lines)


def counts(outcomes: list[Outcome]) -> dict[str, int]:
    c: dict[str, int] = {}
    for o in outcomes:
        c[o.cls] = c.get(o.cls, 0) + 1
    return dict(sorted(c.items()))
