"""A lost node's message names what went with it, whichever call's exception surfaced first
(the primary trainer's own, or a replica's whose input lived on that node): the one line a
user reads must say the trainer is gone, not only which node (no Ray: the session's
placement and trainer devices are set by hand)."""

from __future__ import annotations

from bidirl.runtime.placement import Node, Placement
from bidirl.runtime.session import TrainSession


def _session(device_node: tuple[int, ...], train_devices: tuple[int, ...]) -> TrainSession:
    s = TrainSession.__new__(TrainSession)  # no config, no Ray: only what the message reads
    nodes = tuple(Node(k, f"id{k}", f"10.0.0.{k + 1}", 2) for k in range(max(device_node) + 1))
    s.placement = Placement(nodes, device_node, 2, None)
    s.train_devices = train_devices
    return s


def test_the_trainers_node_is_named_as_the_primary_trainer():
    s = _session((0, 1), train_devices=(1,))
    assert s._lost_with([s.placement.nodes[1]]) == "and with it the primary trainer's devices [1]"


def test_a_rollout_node_names_its_rollout_devices():
    s = _session((0, 0, 1, 1), train_devices=(2, 3))
    assert s._lost_with([s.placement.nodes[0]]) == "and with it rollout devices [0, 1]"


def test_a_node_holding_both_names_both():
    s = _session((0, 0, 1), train_devices=(1, 2))
    msg = s._lost_with([s.placement.nodes[0]])
    assert msg == "and with it the primary trainer's devices [1] and rollout devices [0]"
