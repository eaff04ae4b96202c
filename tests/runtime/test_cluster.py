"""A private local Ray instance leaves nothing behind: its temp dir goes with it."""

import glob

import pytest

pytestmark = [pytest.mark.ray]


def test_private_ray_removes_its_temp_dir():
    pytest.importorskip("ray")
    from bidirl.runtime.cluster import ray_session

    before = set(glob.glob("/tmp/bidirl-ray-*"))
    with ray_session(num_cpus=1) as ray:
        assert ray.is_initialized()
        ours = set(glob.glob("/tmp/bidirl-ray-*")) - before
        assert len(ours) == 1
    assert not (set(glob.glob("/tmp/bidirl-ray-*")) & ours)
