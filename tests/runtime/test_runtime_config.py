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
])
def test_bad_values_name_the_field(override, field):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    msg = str(e.value)
    # "field: what is wrong", or, for an override that is not key=value, the override quoted
    assert msg.startswith(f"{field}: ") or msg.startswith(f"override '{field}'"), msg


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
    cfg, device, seed = from_wire(trainer_wire(c.trainer, device="cpu", seed=7), threads=2)
    assert cfg == TrainerConfig(lr=3e-4, betas=(0.8, 0.95), threads=2) and (device, seed) == ("cpu", 7)


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
    from bidirl.runtime.train import response_cap

    cfg = load_config(None, ["rollout.max_new_tokens=128", "rollout.max_new_tokens_start=32",
                             "rollout.prompts_per_step=4", "run.steps=5"])
    cap = response_cap(cfg)
    assert [cap(g) for g in (0, 3, 4, 8, 12, 16, 19, 400)] == [32, 32, 56, 80, 104, 128, 128, 128]
    assert response_cap(load_config(None, [])) is None  # no curriculum: the constant cap
    store = GroupStore(2, 128, 1.0, 0, cap_for=cap)
    store.add(9, "u", [1, 2], "copy", "x")
    assert {r.max_new_tokens for r in store.requests_for(9)} == {80}
