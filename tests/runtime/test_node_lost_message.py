"""A lost node's message names what went with it, whichever call's exception surfaced first
(the primary trainer's own, or a replica's whose input lived on that node): the one line a
user reads must say the trainer is gone, not only which node (no Ray: the placement and the
trainer devices are given by hand)."""

from __future__ import annotations

from bidirl.runtime.launch import lost_with
from bidirl.runtime.placement import Node, Placement


def _placement(device_node: tuple[int, ...]) -> Placement:
    nodes = tuple(Node(k, f"id{k}", f"10.0.0.{k + 1}", 2) for k in range(max(device_node) + 1))
    return Placement(nodes, device_node, 2, None)


def test_the_trainers_node_is_named_as_the_primary_trainer():
    p = _placement((0, 1))
    assert lost_with(p, [p.nodes[1]], train_devices=(1,)) == "and with it the primary trainer's devices [1]"


def test_a_rollout_node_names_its_rollout_devices():
    p = _placement((0, 0, 1, 1))
    assert lost_with(p, [p.nodes[0]], train_devices=(2, 3)) == "and with it rollout devices [0, 1]"


def test_a_node_holding_both_names_both():
    p = _placement((0, 0, 1))
    msg = lost_with(p, [p.nodes[0]], train_devices=(1, 2))
    assert msg == "and with it the primary trainer's devices [1] and rollout devices [0]"
