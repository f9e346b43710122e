"""The sharded fine-tune's per-step floor from recorded inputs: compute measured alone, the
host link's bytes at the measured pinned rates (overlapping compute), the optimizer step."""

from __future__ import annotations

import pytest

from hopperlab.workloads.finetune import step_floor as sf

# the 13B shape's parameters (embedding + 40 layers + norm + head), bf16
PARAMS_13B = 13_015_864_320


def test_fsdp2_offload_on_two_gpus_is_bound_by_its_link_and_the_cpu_step():
    """Recorded on a 2-GPU node: each rank moves its half in twice and its gradients out."""
    x = sf.FloorInputs(mode="fsdp2-cpu-offload", params=PARAMS_13B, elt_bytes=2, world=2,
                       compute_s=4.1, optimizer_s=6.0, h2d_gbps=52.0, d2h_gbps=50.0)
    f = sf.step_floor(x)
    share = PARAMS_13B * 2 / 2
    assert f["h2d_gb_per_step"] == pytest.approx(2 * share / 1e9)
    assert f["d2h_gb_per_step"] == pytest.approx(share / 1e9)
    link = max(2 * share / 52e9, share / 50e9)  # 0.50 s: below the compute
    assert f["link_floor_s"] == pytest.approx(link)
    assert f["step_floor_s"] == pytest.approx(4.1 + 6.0)
    over = sf.over_floor(11.0, f)
    assert over["step_over_floor"] == pytest.approx(11.0 / 10.1)
    assert over["step_over_link_floor"] == pytest.approx(11.0 / link)


def test_a_slow_link_sets_the_floor_over_the_compute():
    x = sf.FloorInputs(mode="fsdp2-cpu-offload", params=PARAMS_13B, elt_bytes=2, world=1,
                       compute_s=3.0, optimizer_s=2.0, h2d_gbps=10.0, d2h_gbps=12.0)
    f = sf.step_floor(x)
    assert f["step_floor_s"] == pytest.approx(2 * PARAMS_13B * 2 / 10e9 + 2.0)


def test_torchao_moves_the_whole_model_once_each_way():
    x = sf.FloorInputs(mode="torchao-cpu-offload", params=1_000_000_000, elt_bytes=2, world=1,
                       compute_s=0.01, optimizer_s=0.5, h2d_gbps=40.0, d2h_gbps=20.0)
    f = sf.step_floor(x)
    assert f["h2d_gb_per_step"] == f["d2h_gb_per_step"] == pytest.approx(2.0)
    assert f["step_floor_s"] == pytest.approx(2e9 / 20e9 + 0.5)  # d2h is the slower way


def test_no_offload_or_no_measured_link_leaves_compute_and_optimizer():
    on_gpu = sf.step_floor(sf.FloorInputs(mode="fsdp2", params=PARAMS_13B, elt_bytes=2,
                                          world=2, compute_s=5.0, optimizer_s=0.2,
                                          h2d_gbps=50.0, d2h_gbps=50.0))
    assert on_gpu["step_floor_s"] == pytest.approx(5.2) and "link_floor_s" not in on_gpu
    assert "h2d_gb_per_step" not in on_gpu
    cpu = sf.step_floor(sf.FloorInputs(mode="fsdp2-cpu-offload", params=1000, elt_bytes=4,
                                       world=1, compute_s=0.3, optimizer_s=0.1))
    assert cpu["step_floor_s"] == pytest.approx(0.4) and "link_floor_s" not in cpu
    assert sf.over_floor(0.8, cpu) == {"step_over_floor": pytest.approx(2.0)}


def test_forty_layers_from_probes_of_two_and_four():
    assert sf.extrapolate_layers(1.0, 1.5, 2, 4, 40) == pytest.approx(1.0 + 38 * 0.25)
    assert sf.extrapolate_layers(1.0, 1.5, 2, 4, 4) == 1.5
    assert sf.extrapolate_layers(1.0, 0.9, 2, 4, 40) == 1.0  # noise never makes layers free
