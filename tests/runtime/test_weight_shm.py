"""The ``shm`` transport (``runtime/weight_shm.py``, ``runtime/sync_driver.py``): the same bytes
as the object store; a delta writes what changed and nothing else; a segment laid out again for a
new set of tensors still delivers; the driver never writes over a sync being read; refused off
CPU and across nodes in one line; no segment left in /dev/shm once the run's sync objects close
(or the owner dies)."""

from __future__ import annotations

import os

import numpy as np
import pytest
from fake_sync_executor import FakeSyncExecutor

from bidirl.runtime.config import ConfigError, load_config
from bidirl.runtime.sync_driver import SyncDriver
from bidirl.runtime.weight_shm import PREFIX, SHM_DIR, check_one_node
from bidirl.runtime.weight_sync import check_transport

SHAPES = {"model.embed_tokens.weight": (300, 64), "model.layers.0.self_attn.q_proj.weight": (64, 64),
          "model.layers.0.self_attn.q_proj.lora_A.weight": (4, 64),
          "model.layers.0.self_attn.q_proj.lora_B.weight": (64, 4), "model.norm.weight": (64,)}
LORA = [k for k in SHAPES if "lora_" in k]


def _segments(pid: int | None = None) -> set[str]:
    mine = PREFIX if pid is None else f"{PREFIX}{pid}-"
    return {f for f in os.listdir(SHM_DIR) if f.startswith(mine)}


# -- refusals ---------------------------------------------------------------------------
def test_shm_is_refused_on_cuda_in_one_line():
    with pytest.raises(ValueError) as e:
        check_transport("shm", "cuda")
    msg = str(e.value)
    assert "\n" not in msg and "use cuda_ipc or collective" in msg
    assert check_transport("shm", "cpu") == "shm"
    assert load_config(None, ["rollout.weight_sync=shm"]).rollout.weight_sync == "shm"


def test_shm_is_refused_across_nodes_in_one_line():
    """A netns two-node cluster's devices are on nodes of their own ids: refused before any worker starts."""
    from bidirl.controller.cluster import ClusterSpec  # noqa: F401 (the spec's type)
    from bidirl.runtime.launch import check_sync_placement
    from bidirl.runtime.placement import Node, Placement

    check_one_node((0, 0, 0), 2)  # one node: fine
    with pytest.raises(ValueError) as e:
        check_one_node((0, 0, 1, 1), 2)
    assert "\n" not in str(e.value) and "devices [0, 1]" in str(e.value)
    nodes = (Node(0, "aa", "10.0.0.1", 2), Node(1, "bb", "10.0.0.2", 2))
    spec = type("S", (), {"train_devices": (2, 3)})()
    cfg = load_config(None, ["rollout.weight_sync=shm"])
    with pytest.raises(ConfigError) as e:
        check_sync_placement(cfg, spec, Placement(nodes, (0, 0, 1, 1), 2, None))
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("rollout.weight_sync 'shm' needs every device on the primary trainer")
    assert "10.0.0.1: devices [0, 1]" in msg and "use collective or object_store" in msg
    check_sync_placement(cfg, spec, Placement(nodes[:1], (0, 0, 0, 0), 4, None))
    check_sync_placement(load_config(None, []), spec, Placement(nodes, (0, 0, 1, 1), 2, None))  # not shm


# -- the driver's order -------------------------------------------------------------------
def test_reads_follow_their_write_and_the_next_write_every_read():
    """A replica is told to read only once the write returned; a second sync pushed meanwhile
    is written only after every read of the first (the segment holds one sync); a lost replica
    counts as read."""
    from bidirl.runtime.weight_shm import ShmTicket
    from bidirl.runtime.weight_sync import SyncRecord

    ex, got = FakeSyncExecutor(), []
    d = SyncDriver(ex, "shm", True)
    assert d.push([0, 1], 1, got.append) and d.push([0, 1], 2, got.append)
    assert [(c[0], c[1]) for c in ex.calls.issued] == [(9, "write_weights")]
    assert ex.calls.issued[0][2] == (1, True)
    ticket = ShmTicket("seg", 1, 1, 100, 2)
    ex.calls.issued[0][3]((ticket, SyncRecord("shm", 1, 100, 400, 2, 0.01)))
    reads = ex.calls.issued[1:]
    assert [(c[0], c[1], c[2]) for c in reads] == [(0, "read_weights", (ticket,)), (1, "read_weights", (ticket,))]
    reads[0][3]((0.5, 100))
    assert len(ex.calls.issued) == 3, "the second write waits for the first sync's last read"
    reads[1][4]()  # replica 1 was lost before it read
    assert got == [(0.5, 100), None]
    assert ex.calls.issued[3][:3] == (9, "write_weights", (2, True))
    rec = d.records[0]
    assert (rec["transport"], rec["bytes_moved"], rec["full_bytes"], rec["replicas"]) == ("shm", 100, 400, 2)
    assert rec["wall_s"] is not None and rec["rebuilt"]
    assert not SyncDriver(ex, "shm").push([], 3, got.append)


# -- one process ----------------------------------------------------------------------------
def test_a_writer_and_a_reader_in_one_process_zero_copy_and_bf16():
    torch = pytest.importorskip("torch")
    from bidirl.runtime.weight_shm import ShmReader, ShmWriter

    named = {"w": torch.randn(8, 4), "h": torch.randn(6).to(torch.bfloat16), "i": np.arange(5)}
    w, r = ShmWriter(), ShmReader()
    ticket, rec = w.write(named, 7)
    version, views, n = r.read(ticket)
    assert version == 7 and n == rec.bytes_moved == rec.full_bytes
    assert np.array_equal(views["w"], named["w"].numpy()) and torch.equal(views["h"], named["h"])
    assert np.array_equal(views["i"], named["i"]) and views["w"].flags.writeable  # the engine takes it as is
    with torch.no_grad():
        named["w"].add_(1.0)
    ticket, rec = w.write(named, 8, delta=True)  # a numpy array in the set: a whole write leaves no marks
    assert rec.bytes_moved == rec.full_bytes
    ticket, rec = w.write(named, 9, delta=True)
    assert rec.bytes_moved == 0 and r.read(ticket)[0] == 9
    stale = ticket
    w.write(named, 10)
    with pytest.raises(RuntimeError, match="not the sync's layout .* version 9"):
        r.read(stale)
    w.close()
    assert _segments(os.getpid()) == set()


# -- real Ray, two and three processes ------------------------------------------------------
@pytest.fixture(scope="module")
def endpoints(ray_local):
    pytest.importorskip("torch")
    from bidirl.runtime.weight_shm import ShmEndpoint

    E = ray_local.remote(num_cpus=0.5)(ShmEndpoint)
    trainer, a, b = E.remote(), E.remote(), E.remote()
    ray_local.get(trainer.make.remote(SHAPES, seed=5))
    return ray_local, trainer, a, b


def _shm(ray, sender, receivers, version, delta=False):
    ticket, rec = ray.get(sender.write.remote(version, delta))  # the driver's order: write, then reads
    return rec, ray.get([r.read.remote(ticket) for r in receivers])


@pytest.mark.ray
@pytest.mark.slow
def test_shm_delivers_the_object_stores_bytes_and_a_delta_only_what_changed(endpoints):
    ray, trainer, a, b = endpoints
    rec, got = _shm(ray, trainer, [a], 1)
    assert rec.transport == "shm" and rec.bytes_moved == rec.full_bytes and rec.tensors == len(SHAPES)
    assert got == [(1, rec.full_bytes)]
    ray.get(b.load.remote([trainer.pack.remote(1)]))  # object_store
    want = ray.get(trainer.digest.remote())
    assert ray.get(a.digest.remote()) == want == ray.get(b.digest.remote())

    rec, got = _shm(ray, trainer, [a], 3, delta=True)  # torch's marks were taken by the full write
    assert rec.bytes_moved == 0 and rec.tensors == 0 and got == [(3, 0)]
    ray.get(trainer.touch.remote(LORA))
    _shm(ray, trainer, [a], 4)  # a whole write between two deltas
    ray.get(trainer.touch.remote(LORA[:1]))
    rec, got = _shm(ray, trainer, [a, b], 5, delta=True)  # b never read shm before: it still gets the whole set
    assert rec.tensors == 1 and rec.bytes_moved == 4 * np.prod(SHAPES[LORA[0]])
    assert [v for v, _ in got] == [5, 5]
    want = ray.get(trainer.digest.remote())
    assert ray.get(a.digest.remote()) == want == ray.get(b.digest.remote())
    ray.get(trainer.touch.remote(LORA))
    rec, _ = _shm(ray, trainer, [a, b], 6, delta=True)
    assert rec.tensors == len(LORA) and rec.bytes_moved == sum(4 * np.prod(SHAPES[k]) for k in LORA)
    want = ray.get(trainer.digest.remote())
    assert ray.get(a.digest.remote()) == want
    ray.get(b.load.remote([trainer.pack.remote(6)]))  # and the object store agrees
    assert ray.get(b.digest.remote()) == want


@pytest.mark.ray
@pytest.mark.slow
def test_a_new_set_of_tensors_is_laid_out_again_and_nothing_is_left_in_dev_shm(endpoints):
    ray, trainer, a, b = endpoints
    _shm(ray, trainer, [a, b], 10, delta=True)
    before = _segments()
    shapes = {**SHAPES, "model.layers.0.mlp.up_proj.lora_A.weight": (4, 64)}  # an adapter added
    ray.get(trainer.make.remote(shapes, seed=6))
    rec, got = _shm(ray, trainer, [a, b], 11, delta=True)
    assert rec.bytes_moved == rec.full_bytes and rec.tensors == len(shapes) and [v for v, _ in got] == [11, 11]
    want = ray.get(trainer.digest.remote())
    assert ray.get(a.digest.remote()) == want == ray.get(b.digest.remote())
    after = _segments()
    assert len(after) == len(before) and after != before, "the old layout's segment was unlinked"
    ray.get([e.close_shm.remote() for e in (a, b, trainer)])
    assert _segments() == set()


@pytest.mark.ray
@pytest.mark.slow
def test_a_dead_owners_segment_is_unlinked_by_the_driver_at_the_end_of_the_run(ray_local):
    """The trainer's process killed outright runs no finaliser (and Ray takes its resource
    tracker with it): the driver, which saw the segment's name in its ticket, unlinks it."""
    pytest.importorskip("torch")
    from bidirl.runtime.weight_shm import ShmEndpoint

    owner = ray_local.remote(num_cpus=0.5)(ShmEndpoint).remote()
    ray_local.get(owner.make.remote(SHAPES))
    ex = FakeSyncExecutor()

    def dead(*_a, **_k):
        raise RuntimeError("the trainer is gone")

    ex.backend = type("B", (), {"submit": staticmethod(dead)})()
    d = SyncDriver(ex, "shm")
    d.push([0], 1, lambda _: None)
    out = ray_local.get(owner.write.remote(1))  # what the driver's write_weights call returns
    ex.calls.issued[0][3](out)
    assert out[0].segment in _segments()
    ray_local.kill(owner)
    d.close()
    assert out[0].segment not in _segments()


@pytest.mark.ray
@pytest.mark.vllm
@pytest.mark.slow
def test_a_real_run_syncs_over_shm_and_leaves_no_segment(tmp_path, real_runtime_available):
    """``bidirl train`` with bidirl's lends both ways, its weights by shm a delta at a time: the
    replicas load the segment's views into vLLM, the run audits clean, /dev/shm is left as found."""
    import json
    import threading

    from runtime_cli_helpers import SMALL, run_cli

    before, seen, done = _segments(), set(), threading.Event()

    def watch() -> None:  # the segment lives from the first sync to the run's end
        while not done.wait(0.1):
            seen.update(_segments() - before)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    run = tmp_path / "run"
    out = run_cli("train", "--run-dir", str(run), *SMALL, "run.steps=3", "scheduler.policy=bidirl",
                  "run.plot=false", "run.tensorboard=false", "rollout.weight_sync=shm",
                  "rollout.weight_sync_delta=true")
    done.set()
    watcher.join()
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["audit"]["ok"], summary["audit"]
    assert seen, "the weights went through a /dev/shm segment"
    assert _segments() - before == set()
    assert "leaked shared_memory" not in out.stderr
