"""Small random scenarios for the simulator's property tests."""

from __future__ import annotations

from hypothesis import strategies as st

from bidirl.sim.scenario import from_dict


@st.composite
def small_scenarios(draw) -> dict:
    """A valid scenario dict: 2-8 devices, 1-4 steps, a few tiny groups, random costs."""
    rollout_tp = draw(st.sampled_from([1, 1, 2]))
    replicas = draw(st.integers(1, 3))
    rollout = replicas * rollout_tp
    train_tp = draw(st.sampled_from([1, 2]))
    dp = draw(st.integers(1, 3))
    dist = draw(st.sampled_from(["lognormal", "constant", "uniform"]))
    hi = draw(st.integers(16, 600))
    cost = st.one_of(st.none(), st.floats(0.0, 20.0))
    return {
        "name": "prop", "hardware": draw(st.sampled_from(["H100-80GB", "A6000-48GB"])),
        "model": "Qwen3-4B", "devices": rollout + dp * train_tp,
        "staleness": draw(st.integers(0, 2)), "steps": draw(st.integers(1, 4)),
        "seed": draw(st.integers(0, 2**16)),
        "workload": {
            "prompts_per_step": draw(st.integers(1, 6)), "group_size": draw(st.integers(1, 4)),
            "prompt_tokens": draw(st.integers(1, 256)),
            "response_length": {"dist": dist, "median": max(1, hi // 3), "sigma": 1.0,
                                "min": 1, "max": hi}},
        "pools": {"rollout_devices": rollout, "train_devices": dp * train_tp,
                  "rollout_tp": rollout_tp, "train": {"dp": dp, "tp": train_tp}},
        "costs": {"roll_on_train_c_in_s": draw(cost), "roll_on_train_c_out_s": draw(cost),
                  "train_on_roll_c_in_s": draw(cost), "train_on_roll_c_out_s": draw(cost),
                  "weight_sync_s": draw(cost), "colocated_switch_s": draw(cost)},
        "sim": {"allow_oversubscribe": True,  # the scheduler's invariants, on any memory
                "timing_noise_cv": draw(st.sampled_from([0.0, 0.05])),
                "prior_scale": draw(st.sampled_from([0.7, 1.0, 1.5])),
                "micro_batch_tokens": draw(st.sampled_from([256, 2048, 16384]))},
    }


def build(d: dict):
    return from_dict(d)


@st.composite
def busy_scenarios(draw) -> dict:
    """8 H100s with enough queued work that the guided policies do borrow."""
    rollout = draw(st.integers(2, 6))
    median = draw(st.sampled_from([300, 600, 1200]))
    return {
        "name": "busy", "hardware": "H100-80GB", "model": "Qwen3-8B", "devices": 8,
        "staleness": draw(st.integers(0, 2)), "steps": draw(st.integers(2, 4)),
        "seed": draw(st.integers(0, 2**16)),
        "workload": {"prompts_per_step": 64, "group_size": 8, "prompt_tokens": 256,
                     "response_length": {"median": median, "sigma": 0.8, "max": 4096}},
        "pools": {"rollout_devices": rollout, "train_devices": 8 - rollout,
                  "train": {"dp": 8 - rollout}},
        "sim": {"timing_noise_cv": draw(st.sampled_from([0.0, 0.03])), "allow_oversubscribe": True},
    }


@st.composite
def no_train_unit_scenarios(draw) -> dict:
    """A small scenario whose train pool is too small to host a borrowed replica.

    Only the trainer-on-rollout direction can lend here, so a replica lent as an
    auxiliary trainer can leave the batch the trainer waits for with nowhere to roll out.
    """
    d = draw(small_scenarios())
    tp = draw(st.sampled_from([2, 4]))
    replicas = draw(st.integers(1, 3))
    dp = draw(st.integers(1, tp - 1))
    d["devices"] = replicas * tp + dp
    d["steps"] = draw(st.integers(2, 4))  # a replica is lent mid-step for a later one
    d["pools"] = {"rollout_devices": replicas * tp, "train_devices": dp, "rollout_tp": tp,
                  "train": {"dp": dp, "tp": 1}}
    return d
