"""Collective latency in the tensor- and data-parallel costs."""

import dataclasses

import pytest

from bidirl.perf.profiles import HARDWARE, MODELS, collective_hops
from bidirl.perf.stage_models import TrainStageModel, decode_prior, train_prior

H200, M14 = HARDWARE["H200-141GB"], MODELS["Qwen3-14B"]


def test_an_all_reduce_pays_latency_per_collective_and_bytes_over_bandwidth():
    hw = H200
    assert hw.all_reduce_s(1e9, 1, False) == 0.0
    assert hw.all_reduce_s(0.0, 8, False, calls=10) == pytest.approx(10 * collective_hops(8) * 5e-6)
    bw_only = dataclasses.replace(hw, intra_node_latency_us=0.0)
    assert bw_only.all_reduce_s(1e9, 8, False) == pytest.approx(2 * 7 / 8 * 1e9 / (450e9))
    assert hw.all_reduce_s(1e9, 8, True) > hw.all_reduce_s(1e9, 8, False)  # the network is slower
    assert collective_hops(2) == 2 and collective_hops(512) == 18  # a tree beyond a handful of ranks


def test_tensor_parallel_decode_and_training_pay_their_all_reduces():
    """tp8 for a 14B model on H200 is not free: each decode step waits for 2 all-reduces per
    layer, each micro-batch for 4; at tp1 nothing changes with the latency."""
    slow = dataclasses.replace(H200, intra_node_latency_us=50.0)
    for prior in (decode_prior, train_prior):
        assert prior(slow, M14, 1) == prior(H200, M14, 1)
        assert prior(slow, M14, 8)[0] > prior(H200, M14, 8)[0]
    a1, a8 = decode_prior(H200, M14, 1)[0], decode_prior(H200, M14, 8)[0]
    latency = 2 * M14.layers * collective_hops(8) * 5e-6
    weights = M14.weights_bytes / (H200.hbm_gbps * 1e9 * H200.decode_efficiency)
    assert a8 - (weights / 8 + 1.5e-3) == pytest.approx(latency)
    assert a8 > a1 / 8 * 3  # 8 devices give far less than 8x the per-step speed


def test_data_parallel_sync_pays_latency_per_bucket_and_grows_across_nodes():
    t = TrainStageModel(HARDWARE["H100-80GB"], MODELS["Qwen3-8B"])
    assert t.grad_wire_s(1, True) == 0.0
    assert t.grad_wire_s(8, True) > t.grad_wire_s(8, False)
    assert t.grad_wire_s(64, True) > t.grad_wire_s(8, True)
    no_lat = TrainStageModel(dataclasses.replace(HARDWARE["H100-80GB"], inter_node_latency_us=0.0),
                             MODELS["Qwen3-8B"])
    assert t.grad_wire_s(64, True) > no_lat.grad_wire_s(64, True)
