"""What the session hands down instead of having it looked up again or written into the
config: the policy (which roles are prewarmed is the scheduling policy's own answer) and
the Ray address of ``--ray-address`` (kept in the session; ``config.yaml`` and the config
object stay as written).  No Ray: the workers are stand-ins."""

from __future__ import annotations

from types import SimpleNamespace

from bidirl.runtime.config import load_config
from bidirl.runtime.placement import check_machine_fits, prewarm_hosts
from bidirl.runtime.run_dir import write_config
from bidirl.runtime.run_spec import build_spec
from bidirl.runtime.session import TrainSession


def _worker(d: int):
    return SimpleNamespace(host=SimpleNamespace(remote=lambda role, **kw: (d, role)))


def test_prewarm_asks_the_policy_it_is_given():
    spec = build_spec(load_config(None, []), steps=2, prompt_tokens=10)  # device 0 rollout, device 1 train
    workers = {d: _worker(d) for d in range(spec.devices)}

    def hosted(lends_train: bool, lends_rollout: bool) -> list:
        policy = SimpleNamespace(lends_train_devices=lends_train, lends_rollout_devices=lends_rollout)
        return [(role, ref) for _, role, ref in prewarm_hosts(spec, workers, {}, "model", {}, policy)]

    assert hosted(True, False) == [("rollout", (1, "rollout"))]
    assert hosted(False, True) == [("aux_train", (0, "aux_train"))]
    assert hosted(False, False) == []


def test_the_ray_address_is_the_sessions_not_the_configs(tmp_path):
    cfg = load_config(None, ["cluster.rollout_devices=8", "cluster.train_devices=8"])
    write_config(tmp_path, cfg)
    written = (tmp_path / "config.yaml").read_text()
    s = TrainSession(cfg, tmp_path, ray_address="10.0.0.1:6379")
    assert s.ray_address == "10.0.0.1:6379" and cfg.cluster.ray_address is None
    assert s._config_record()["cluster"]["ray_address"] == "10.0.0.1:6379"  # what Weights & Biases records
    assert (tmp_path / "config.yaml").read_text() == written
    check_machine_fits(cfg, cores=2, ray_address=s.ray_address)  # a joined cluster's devices are not this machine's
    assert TrainSession(load_config(None, ["cluster.ray_address=h:1"]), tmp_path).ray_address == "h:1"
