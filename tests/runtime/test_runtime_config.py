"""Config loading: defaults, YAML, overrides, and errors that name the field."""

import pytest

from bidirl.runtime.config import ConfigError, load_config


def test_defaults_are_valid():
    c = load_config()
    assert c.cluster.rollout_devices + c.cluster.train_devices == 2
    assert c.scheduler.policy in ("async", "bidirl")


def test_yaml_then_overrides(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("trainer:\n  lr: 0.001\nscheduler: {policy: sync}\nrun: {steps: 3}\n")
    c = load_config(str(p), ["run.steps=5", "data.files=", "rollout.temperature=0.7"])
    assert c.trainer.lr == 0.001 and c.scheduler.policy == "sync"
    assert c.run.steps == 5 and c.rollout.temperature == 0.7


@pytest.mark.parametrize("override, field", [
    ("trainer.lrr=1", "trainer.lrr"),
    ("scheduler.policy=fastest", "scheduler.policy"),
    ("rollout.group_size=1", "rollout.group_size"),
    ("rollout.group_size=two", "rollout.group_size"),
    ("trainer.lr=-1", "trainer.lr"),
    ("run=3", "run"),
    ("model.path=/nonexistent/model", "model.path"),
    ("data.files=/nonexistent.parquet", "data.files[0]"),
    ("nokey", "nokey"),
    ("data.seed=-1", "data.seed"),
    ("run.seed=-1", "run.seed"),
    ("run.seed=4294967296", "run.seed"),
    ("trainer.betas=[0.9,1.0]", "trainer.betas"),
    ("trainer.betas=[0.9", "trainer.betas"),  # not YAML
    ("=3", "=3"),
    ("rollout.min_new_tokens=17", "rollout.min_new_tokens"),  # over max_new_tokens (16)
    ("rollout.min_new_tokens=-1", "rollout.min_new_tokens"),
    ("rollout.tensor_parallel_size=2", "cluster.rollout_devices"),  # 1 rollout device: not a multiple of 2
    ("rollout.tensor_parallel_size=0", "rollout.tensor_parallel_size"),
])
def test_bad_values_name_the_field(override, field):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    msg = str(e.value)
    # "field: what is wrong", or, for an override that is not key=value, the override quoted
    assert msg.startswith(f"{field}: ") or msg.startswith(f"override '{field}'"), msg


def test_tensor_parallel_replicas_are_refused_on_cuda_in_one_line():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["rollout.tensor_parallel_size=2", "cluster.rollout_devices=2", "cluster.device=cuda"])
    assert str(e.value).startswith("rollout.tensor_parallel_size: must be 1 with cluster.device=cuda") \
        and "\n" not in str(e.value)
    assert load_config(None, ["rollout.tensor_parallel_size=2", "cluster.rollout_devices=2"]) \
        .rollout.tensor_parallel_size == 2


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(str(tmp_path / "missing.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(str(bad))
    top = tmp_path / "list.yaml"
    top.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(str(top))


def test_the_trainer_section_is_the_torch_trainers_config():
    from bidirl.engines.trainer_config import TrainerConfig, from_wire, trainer_wire

    c = load_config(None, ["trainer.lr=3e-4", "trainer.betas=[0.8, 0.95]"])
    assert type(c.trainer) is TrainerConfig
    # What the default run used before the two configs were merged.
    d = load_config().trainer
    assert (d.lr, d.clip_eps_low, d.clip_eps_high, d.max_grad_norm) == (1e-3, 0.2, 0.28, 1.0)
    cfg, algorithm, device, seed = from_wire(trainer_wire(c.trainer, device="cpu", seed=7), threads=2)
    assert cfg == TrainerConfig(lr=3e-4, betas=(0.8, 0.95), threads=2) and (device, seed) == ("cpu", 7)
    assert algorithm == c.algorithm  # the defaults when none is given


def test_written_config_loads_back(tmp_path):
    import yaml

    c = load_config(None, ["scheduler.policy=async", "data.files=", "trainer.max_grad_norm=null"])
    p = tmp_path / "config.yaml"
    p.write_text(yaml.safe_dump(c.to_dict(), sort_keys=False))
    assert load_config(str(p)) == c


def test_help_lists_every_field_with_its_doc():
    from bidirl.runtime.config import help_text

    text = help_text()
    assert "rollout.max_num_seqs = 128" in text and "vLLM's concurrent sequences" in text
    assert "scheduler.policy = 'bidirl'" in text and "one-step-off" in text


def test_a_length_curriculum_grows_the_cap_linearly_by_step():
    from bidirl.runtime.config import load_config
    from bidirl.runtime.group_store import GroupStore
    from bidirl.runtime.prepare import response_cap

    cfg = load_config(None, ["rollout.max_new_tokens=128", "rollout.max_new_tokens_start=32",
                             "rollout.prompts_per_step=4", "run.steps=5"])
    cap = response_cap(cfg)
    assert [cap(g) for g in (0, 3, 4, 8, 12, 16, 19, 400)] == [32, 32, 56, 80, 104, 128, 128, 128]
    assert response_cap(load_config(None, [])) is None  # no curriculum: the constant cap
    store = GroupStore(2, 128, 1.0, 0, cap_for=cap)
    store.add(9, "u", [1, 2], "copy", "x")
    assert {r.max_new_tokens for r in store.requests_for(9)} == {80}


def test_verl_names_are_aliases_in_files_and_overrides(tmp_path):
    p = tmp_path / "verl.yaml"
    p.write_text("data:\n  train_batch_size: 3\n  max_response_length: 24\n"
                 "actor_rollout_ref:\n  rollout: {n: 4, top_p: 0.9, top_k: 20}\n"
                 "  actor: {optim: {lr: 2.0e-5, lr_warmup_steps: 5, warmup_style: cosine}}\n"
                 "trainer: {total_training_steps: 30, test_freq: 10, save_freq: -1}\n")
    c = load_config(str(p), ["actor_rollout_ref.rollout.temperature=0.7", "trainer.log_val_generations=2"])
    assert (c.rollout.prompts_per_step, c.rollout.group_size, c.rollout.max_new_tokens) == (3, 4, 24)
    assert (c.rollout.top_p, c.rollout.top_k, c.rollout.temperature) == (0.9, 20, 0.7)
    assert (c.trainer.lr, c.trainer.lr_warmup_steps, c.trainer.lr_schedule) == (2e-5, 5, "cosine")
    assert (c.run.steps, c.run.val_every, c.run.checkpoint_every, c.run.val_samples) == (30, 10, 0, 2)
    assert load_config(None, ["trainer.test_freq=-1"]).run.val_every == 0  # veRL's "off"


def test_an_alias_and_its_field_together_or_an_unsupported_verl_field_are_errors(tmp_path):
    p = tmp_path / "both.yaml"
    p.write_text("data: {files: [], train_files: [], max_response_length: 8}\n"
                 "actor_rollout_ref: {rollout: {response_length: 8}}\n")
    assert load_config(str(p)).rollout.max_new_tokens == 8  # two names, one value: fine
    p.write_text("data: {files: [], max_response_length: 8}\nrollout: {max_new_tokens: 16}\n")
    with pytest.raises(ConfigError, match="the same field as data.max_response_length .rollout.max_new_tokens., "
                                          "with another value"):
        load_config(str(p))
    with pytest.raises(ConfigError, match=r"^actor_rollout_ref.actor.ppo_epochs: a veRL field bidirl does not take"):
        load_config(None, ["actor_rollout_ref.actor.ppo_epochs=2"])


def test_wandb_without_the_package_is_one_error_naming_the_field(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ConfigError, match=r"^run.wandb: true needs the wandb package"):
        load_config(None, ["run.wandb=true"])
    assert load_config(None, ["run.wandb=false"]).run.wandb is False


def test_validation_and_sampling_fields_are_checked():
    with pytest.raises(ConfigError, match="^data.val_max_samples"):
        load_config(None, ["data.val_max_samples=0"])
    with pytest.raises(ConfigError, match="^data.val_files"):
        load_config(None, ["data.val_files=/nonexistent.parquet"])
    with pytest.raises(ConfigError, match="^rollout.top_p"):
        load_config(None, ["rollout.top_p=0"])
    with pytest.raises(ConfigError, match="^trainer.lr_schedule"):
        load_config(None, ["trainer.lr_schedule=step"])


def test_help_lists_the_new_fields_and_the_alias_table():
    from bidirl.runtime.config import help_text
    from bidirl.runtime.verl_names import VERL_ALIASES

    text = help_text()
    for field in ("data.val_files = []", "run.val_every = 50", "rollout.top_p = 1.0",
                  "trainer.lr_schedule = 'constant'", "run.wandb = False", "run.worker_log_level = 'warning'"):
        assert field in text, field
    for verl, ours in VERL_ALIASES:
        assert f"{verl}" in text and ours in text


def test_print_config_prints_the_resolved_yaml_and_exits_0(capsys, tmp_path, monkeypatch):
    import yaml

    from bidirl.cli import main

    monkeypatch.chdir(tmp_path)  # no run directory (runs/...) is made
    assert main(["train", "--print-config", "actor_rollout_ref.rollout.n=4", "run.steps=7"]) == 0
    out = yaml.safe_load(capsys.readouterr().out)
    assert out["rollout"]["group_size"] == 4 and out["run"]["steps"] == 7
    assert not list(tmp_path.iterdir())


def test_algorithm_section_takes_verls_names_and_refuses_unknown_ones_in_one_line(tmp_path):
    from bidirl.runtime.config import ConfigError, load_config

    assert load_config(None, ["algorithm.adv_estimator=grpo"]) == load_config()
    config = tmp_path / "dapo.yaml"
    config.write_text(
        "algorithm:\n  adv_estimator: rloo\n  use_kl_in_reward: false\n  gamma: 1.0\n"
        "  rollout_correction:\n    rollout_is: token\n    rollout_is_threshold: 3.0\n"
        "actor_rollout_ref:\n  actor:\n    loss_agg_mode: seq-mean-token-sum-norm\n    clip_ratio_low: 0.2\n"
        "    clip_ratio_high: 0.28\n    entropy_coeff: 0.001\n    use_kl_loss: false\n    kl_loss_coef: 0.0\n"
        "    kl_loss_type: low_var_kl\n    policy_loss:\n      loss_mode: gspo\n"
        "reward_model:\n  overlong_buffer:\n    enable: true\n    len: 4\n    penalty_factor: 1.0\n"
        "data:\n  train_batch_size: 8\n")
    c = load_config(str(config))
    a = c.algorithm
    assert (a.adv_estimator, a.loss_agg_mode, a.policy_loss, a.kl_loss_type, a.use_kl_loss) == (
        "rloo", "seq-mean-token-sum-norm", "gspo", "low_var_kl", False)
    assert a.entropy_coeff == 0.001 and (c.trainer.clip_eps_low, c.trainer.clip_eps_high) == (0.2, 0.28)
    assert (a.rollout_correction.rollout_is, a.rollout_correction.rollout_is_threshold) == ("token", 3.0)
    assert (a.overlong_buffer.enable, a.overlong_buffer.len) == (True, 4)
    for key, value, field in (("algorithm.adv_estimator", "gae", "algorithm.adv_estimator"),
                              ("actor_rollout_ref.actor.loss_agg_mode", "seq-sum", "algorithm.loss_agg_mode"),
                              ("actor_rollout_ref.actor.policy_loss.loss_mode", "clip_cov", "algorithm.policy_loss"),
                              ("algorithm.kl_loss_type", "k4", "algorithm.kl_loss_type"),
                              ("algorithm.rollout_correction.rollout_is", "geometric",
                               "algorithm.rollout_correction.rollout_is")):
        with pytest.raises(ConfigError, match=f"^{field}: must be one of ") as e:
            load_config(None, [f"{key}={value}"])
        assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="^algorithm.gamma: 0.99 not allowed; allowed: 1.0"):
        load_config(None, ["algorithm.gamma=0.99"])
    with pytest.raises(ConfigError, match="^algorithm.overlong_buffer.len: must be set, and below"):
        load_config(None, ["algorithm.overlong_buffer.enable=true", "algorithm.overlong_buffer.len=16"])


def test_help_lists_every_algorithm_choice():
    from bidirl.algo import registry
    from bidirl.runtime.config import help_text

    text = help_text()
    for names in (registry.ADV_ESTIMATORS, registry.POLICY_LOSSES, registry.LOSS_AGG_MODES, registry.KL_LOSS_TYPES,
                  registry.ROLLOUT_IS_LEVELS):
        assert f"(one of {', '.join(names)})" in text
    assert "algorithm.norm_adv_by_std_in_grpo = True" in text and "algorithm.gamma = 1.0" in text


def test_the_dapo_example_in_verls_names_loads_as_dapo():
    """``examples/dapo_verl.yaml`` (veRL's DAPO recipe's names) means DAPO here: clip-higher,
    token-mean, overlong shaping, dynamic sampling on ``acc``."""
    from pathlib import Path

    from bidirl.runtime.config import load_config

    c = load_config(str(Path(__file__).resolve().parents[2] / "examples" / "dapo_verl.yaml"))
    a = c.algorithm
    assert (c.trainer.clip_eps_low, c.trainer.clip_eps_high, a.loss_agg_mode) == (0.2, 0.28, "token-mean")
    assert (a.filter_groups.enable, a.filter_groups.metric, a.filter_groups.max_num_gen_batches) == (True, "acc", 10)
    assert (a.overlong_buffer.enable, a.overlong_buffer.len, a.overlong_buffer.penalty_factor) == (True, 4, 1.0)
    assert (c.rollout.prompts_per_step, c.rollout.group_size, c.run.steps) == (8, 8, 40)
