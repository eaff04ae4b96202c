"""Weight sync transports (``runtime/weight_sync.py``, ``runtime/sync_driver.py``): the same
bytes arrive whichever transport carries them; a delta sends what changed and nothing else; a
group rebuilt for a new replica set still delivers; bad names and ``cuda_ipc`` off CUDA are
refused in one line."""

from __future__ import annotations

import numpy as np
import pytest
from fake_sync_executor import FakeSyncExecutor

from bidirl.runtime.config import ConfigError, load_config
from bidirl.runtime.sync_driver import SyncDriver
from bidirl.runtime.weight_sync import TRANSPORTS, DeltaTracker, check_transport, plan_buckets

SHAPES = {"model.embed_tokens.weight": (300, 64), "model.layers.0.self_attn.q_proj.weight": (64, 64),
          "model.layers.0.self_attn.q_proj.lora_A.weight": (4, 64),
          "model.layers.0.self_attn.q_proj.lora_B.weight": (64, 4), "model.norm.weight": (64,)}
LORA = [k for k in SHAPES if "lora_" in k]


# -- refusals ---------------------------------------------------------------------------
def test_an_unknown_transport_is_refused_in_one_line_listing_the_choices():
    with pytest.raises(ValueError) as e:
        check_transport("carrier_pigeon")
    msg = str(e.value)
    assert "\n" not in msg and all(t in msg for t in TRANSPORTS)
    with pytest.raises(ConfigError, match="rollout.weight_sync 'nccl' is not a transport; choose one of"):
        load_config(None, ["rollout.weight_sync=nccl"])


def test_cuda_ipc_is_refused_on_cpu_in_one_line():
    with pytest.raises(ValueError) as e:
        check_transport("cuda_ipc", "cpu")
    assert "\n" not in str(e.value) and "one CUDA device" in str(e.value)
    with pytest.raises(ConfigError, match="cuda_ipc' needs the trainer and the replica on one CUDA device"):
        load_config(None, ["rollout.weight_sync=cuda_ipc"])
    assert load_config(None, ["rollout.weight_sync=collective"]).rollout.weight_sync == "collective"


# -- pure pieces --------------------------------------------------------------------------
def test_buckets_hold_every_tensor_aligned_and_a_large_one_alone():
    named = {"a": np.zeros(10, np.float32), "b": np.zeros((3, 3), np.float16), "big": np.zeros(1000, np.float32)}
    entries, sizes = plan_buckets(named, bucket_bytes=512)
    assert [e[0] for e in entries] == ["a", "b", "big"]
    assert all(off % 64 == 0 and off + n <= sizes[b] for _, _, _, b, off, n in entries)
    assert entries[2][3] != entries[0][3] and sizes[entries[2][3]] == 4000


def test_delta_marks_nothing_when_nothing_changed_and_only_what_changed():
    torch = pytest.importorskip("torch")
    named = {k: torch.randn(s) for k, s in SHAPES.items()}
    tr = DeltaTracker()
    changed, marks = tr.changed(named)
    assert changed == list(named)  # nothing held yet: everything
    tr.sent(marks)
    assert tr.changed(named)[0] == []
    with torch.no_grad():
        for k in LORA:
            named[k].add_(1.0)
    assert tr.changed(named)[0] == LORA
    arrays = {k: v.numpy().copy() for k, v in named.items()}  # no version counter: bytes are compared
    tr2 = DeltaTracker()
    tr2.sent(tr2.changed(arrays)[1])
    arrays[LORA[0]] = arrays[LORA[0]] + 1
    assert tr2.changed(arrays)[0] == [LORA[0]]


def test_the_group_follows_the_replica_set():
    """A sync to the same replicas reuses the group; one whose targets differ (a lend, a
    reclaim) joins every member to a new generation first; a lost device forces one."""
    ex = FakeSyncExecutor()
    d = SyncDriver(ex, "collective", True, rendezvous=lambda: ("127.0.0.1", 1234))
    assert d.push([0, 1], 1, lambda _: None)
    joins = [c for c in ex.calls.issued if c[1] == "join_weights"]
    assert sorted((c[0], c[2][3]) for c in joins) == [(0, 1), (1, 2), (9, 0)]
    ex.calls.issued.clear()
    d.push([0, 1], 2, lambda _: None)
    assert [c[1] for c in ex.calls.issued] == ["send_weights", "recv_weights", "recv_weights"]
    ex.calls.issued.clear()
    d.push([0, 1, 2], 3, lambda _: None)  # a trainer unit lent as a replica
    assert sum(c[1] == "join_weights" for c in ex.calls.issued) == 4 and d.generation == 1
    d.forget()
    ex.calls.issued.clear()
    d.push([0, 1, 2], 4, lambda _: None)
    assert d.generation == 2
    assert not SyncDriver(ex).push([0], 1, lambda _: None)  # object_store: the executor's own path


# -- real Ray, two and three processes ------------------------------------------------------
@pytest.fixture(scope="module")
def endpoints(ray_local):
    pytest.importorskip("torch")
    from bidirl.runtime.weight_sync import SyncEndpoint

    E = ray_local.remote(num_cpus=0.5)(SyncEndpoint)
    trainer, a, b = E.remote(), E.remote(), E.remote()
    ray_local.get(trainer.make.remote(SHAPES, seed=3))
    return ray_local, trainer, a, b


def _join(ray, gen, sender, receivers):
    from bidirl.runtime.placement import free_port

    port = free_port()
    ray.get([sender.join.remote(gen, "127.0.0.1", port, 0, len(receivers) + 1)]
            + [r.join.remote(gen, "127.0.0.1", port, i, len(receivers) + 1) for i, r in enumerate(receivers, 1)])


def _collective(ray, sender, receivers, version, delta=False):
    rec = sender.send.remote(version, delta)
    got = ray.get([r.recv.remote() for r in receivers])
    return ray.get(rec), got


@pytest.mark.ray
@pytest.mark.slow
def test_transports_deliver_identical_bytes_and_delta_only_what_changed(endpoints):
    ray, trainer, a, b = endpoints
    _join(ray, 0, trainer, [a])
    rec, _ = _collective(ray, trainer, [a], 1)
    assert rec.bytes_moved == rec.full_bytes and rec.tensors == len(SHAPES)
    ray.get(b.load.remote([trainer.pack.remote(1)]))  # object_store
    want = ray.get(trainer.digest.remote())
    assert ray.get(a.digest.remote()) == want == ray.get(b.digest.remote())

    rec, got = _collective(ray, trainer, [a], 2, delta=True)  # the group's first delta is whole
    assert rec.bytes_moved == rec.full_bytes
    rec, got = _collective(ray, trainer, [a], 3, delta=True)
    assert rec.bytes_moved == 0 and rec.tensors == 0 and got == [(3, 0)]
    assert ray.get(a.digest.remote()) == want
    ray.get(trainer.touch.remote(LORA))
    rec, _ = _collective(ray, trainer, [a], 4, delta=True)
    assert rec.tensors == len(LORA) and rec.bytes_moved == sum(4 * np.prod(SHAPES[k]) for k in LORA)
    ray.get(b.load.remote([trainer.pack.remote(4)]))
    want = ray.get(trainer.digest.remote())
    assert ray.get(a.digest.remote()) == want == ray.get(b.digest.remote())


@pytest.mark.ray
@pytest.mark.slow
def test_a_group_rebuilt_for_a_new_replica_set_still_delivers(endpoints):
    ray, trainer, a, b = endpoints
    _join(ray, 10, trainer, [a])
    _collective(ray, trainer, [a], 5, delta=True)
    ray.get(trainer.touch.remote(LORA))
    _join(ray, 11, trainer, [a, b])  # a replica joins (a lend): the next send is whole again
    rec, got = _collective(ray, trainer, [a, b], 6, delta=True)
    assert rec.bytes_moved == rec.full_bytes and [v for v, _ in got] == [6, 6]
    want = ray.get(trainer.digest.remote())
    assert ray.get(a.digest.remote()) == want == ray.get(b.digest.remote())
    _join(ray, 12, trainer, [b])  # and leaves (a reclaim)
    ray.get(trainer.touch.remote(LORA[:1]))
    _collective(ray, trainer, [b], 7, delta=True)
    assert ray.get(b.digest.remote()) == ray.get(trainer.digest.remote())
