"""A local CPU cluster larger than the machine is refused before anything starts."""

import pytest

from bidirl.runtime.config import ConfigError, load_config
from bidirl.runtime.placement import check_machine_fits


def test_more_devices_than_cores_is_refused_naming_the_numbers():
    cfg = load_config(None, ["cluster.rollout_devices=8", "cluster.train_devices=8"])
    with pytest.raises(ConfigError) as e:
        check_machine_fits(cfg, cores=2)
    msg = str(e.value)
    assert msg.startswith("cluster: 16 devices") and "2 CPU cores" in msg and "cluster.oversubscribe=true" in msg


@pytest.mark.parametrize("override", ["cluster.oversubscribe=true", "cluster.ray_address=127.0.0.1:6379",
                                      "cluster.device=cuda"])
def test_oversubscribing_is_a_choice_and_other_clusters_are_not_counted(override):
    cfg = load_config(None, ["cluster.rollout_devices=8", "cluster.train_devices=8", override])
    check_machine_fits(cfg, cores=2)


def test_a_cluster_that_fits_starts():
    check_machine_fits(load_config(None, []), cores=2)
