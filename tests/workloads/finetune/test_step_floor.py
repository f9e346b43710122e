"""The sharded fine-tune's per-step floor from the hardware's measured rates (issue 35): FLOPs
at the matmul rate, the host link's bytes at the pinned rates (overlapping compute), the CPU
AdamW's bytes at the node's triad (added, or overlapped by design)."""

from __future__ import annotations

import pytest

from hopperlab.workloads.finetune.sharded import step_floor as sf

# the 13B shape's parameters (embedding + 40 layers + norm + head), bf16
PARAMS_13B = 13_015_864_320


def _x(**kw):
    base = dict(mode="fsdp2-cpu-offload", params=PARAMS_13B, elt_bytes=2, world=2,
                flops=3.4e15, matmul_tflops=680.0, host_gbps=120.0, ranks_on_host=2,
                h2d_gbps=52.0, d2h_gbps=50.0)
    return sf.FloorInputs(**{**base, **kw})


def test_fsdp2_offload_on_two_gpus_is_compute_plus_both_ranks_adamw_at_the_node_triad():
    """Issue 35: every part from a rate the node measured, none from the run's own parts."""
    f = sf.step_floor(_x())
    share = PARAMS_13B * 2 / 2
    compute = 3.4e15 / 680e12
    assert f["floor_compute_s"] == pytest.approx(compute) and f["step_tflop"] == 3400
    assert f["h2d_gb_per_step"] == pytest.approx(2 * share / 1e9)
    assert f["d2h_gb_per_step"] == pytest.approx(share / 1e9)
    link = max(2 * share / 52e9, share / 50e9)  # 0.50 s: below the compute
    assert f["link_floor_s"] == pytest.approx(link)
    cpu = 7 * share * 2 / 120e9  # both ranks' AdamW traffic at the node's rate
    assert f["optimizer_floor_s"] == f["floor_optimizer_s"] == pytest.approx(cpu)
    assert f["step_floor_s"] == pytest.approx(compute + cpu) and f["floor_overlapped"] == 0
    over = sf.over_floor(11.0, f)
    assert over["step_over_floor"] == pytest.approx(11.0 / (compute + cpu))
    assert over["step_over_link_floor"] == pytest.approx(11.0 / link)


def test_an_optimizer_overlapped_by_design_makes_the_longest_part_the_floor():
    f = sf.step_floor(_x(overlapped=True))
    assert f["step_floor_s"] == pytest.approx(max(3.4e15 / 680e12, f["optimizer_floor_s"]))
    assert f["floor_overlapped"] == 1
    slow_host = sf.step_floor(_x(overlapped=True, host_gbps=10.0))
    assert slow_host["step_floor_s"] == pytest.approx(slow_host["optimizer_floor_s"])


def test_a_slow_link_sets_the_floor_over_the_compute():
    f = sf.step_floor(_x(world=1, ranks_on_host=1, flops=1e15, h2d_gbps=10.0, d2h_gbps=12.0))
    cpu = 7 * PARAMS_13B * 2 / 120e9
    assert f["step_floor_s"] == pytest.approx(2 * PARAMS_13B * 2 / 10e9 + cpu)


def test_layers_kept_gathered_for_backward_come_over_the_link_once():
    """FSDP2 offload with ``reshard_after_forward`` false copies each weight in once a step."""
    f = sf.step_floor(_x(world=1, ranks_on_host=1, reshard_after_forward=False))
    assert f["h2d_gb_per_step"] == pytest.approx(PARAMS_13B * 2 / 1e9)
    assert f["d2h_gb_per_step"] == pytest.approx(PARAMS_13B * 2 / 1e9)
    assert sf.link_bytes("fsdp2-cpu-offload", 10, 2, 1) == (40, 20)


def test_torchao_moves_the_whole_model_once_each_way():
    f = sf.step_floor(_x(mode="torchao-cpu-offload", params=1_000_000_000, flops=1e12,
                         world=1, ranks_on_host=1, h2d_gbps=40.0, d2h_gbps=20.0))
    assert f["h2d_gb_per_step"] == f["d2h_gb_per_step"] == pytest.approx(2.0)
    assert f["step_floor_s"] == pytest.approx(2e9 / 20e9 + 7 * 2e9 / 120e9)


def test_no_offload_or_no_measured_link_leaves_compute_and_the_cpu_optimizer():
    on_gpu = sf.step_floor(_x(mode="fsdp2", flops=3.4e15))
    assert on_gpu["step_floor_s"] == pytest.approx(3.4e15 / 680e12)
    assert "link_floor_s" not in on_gpu and "h2d_gb_per_step" not in on_gpu
    assert on_gpu["floor_optimizer_s"] == 0  # AdamW on the GPU: not in this lower bound
    cpu = sf.step_floor(_x(params=1000, elt_bytes=4, world=1, ranks_on_host=1, flops=3e11,
                           matmul_tflops=1.0, h2d_gbps=None, d2h_gbps=None, host_gbps=1.0))
    assert cpu["step_floor_s"] == pytest.approx(0.3 + 7 * 4000 / 1e9)
    assert "link_floor_s" not in cpu
    assert sf.over_floor(0.6, cpu) == {"step_over_floor": pytest.approx(0.6 / cpu["step_floor_s"])}


def test_no_measured_matmul_rate_no_floor():
    """A floor without its compute part would flatter the step: none at all."""
    assert sf.step_floor(_x(matmul_tflops=None)) == {}
    assert sf.over_floor(5.0, {}) == {}


def test_step_flops_count_recompute_under_checkpointing():
    plain = sf.step_flops(1000, 100, 2, 8, 16, 10, checkpointing=False)
    attn = 2.0 * 2 * 8 * 16
    assert plain == pytest.approx((6 * 1000 + 3 * attn) * 10)
    ckpt = sf.step_flops(1000, 100, 2, 8, 16, 10, checkpointing=True)
    assert ckpt - plain == pytest.approx((2 * 900 + attn) * 10)


def test_forty_layers_from_probes_of_two_and_four():
    assert sf.extrapolate_layers(1.0, 1.5, 2, 4, 40) == pytest.approx(1.0 + 38 * 0.25)
    assert sf.extrapolate_layers(1.0, 1.5, 2, 4, 4) == 1.5
    assert sf.extrapolate_layers(1.0, 0.9, 2, 4, 40) == 1.0  # noise never makes layers free


def test_the_model_flops_per_token_are_the_torch_backends_formula():
    """The sharded run's ``flops_per_token`` (energy's plausibility gate) is 6 per matmul
    parameter plus causal attention, the convention of ``finetune.metrics.flops_per_token``:
    its attention term 12 x layers x hidden x seq over 2 (causal) is this one's 3 x 2 x ..."""
    import torch

    from hopperlab.workloads.finetune.sharded import llama, engine as sharded

    shape = llama.Shape(hidden=32, heads=4, ffn=64, vocab=64, layers=3)
    model = llama.build_model(shape, torch.float32, "cpu", seed=5, checkpointing=True)
    plan = sharded.Plan(mode="fsdp2", shape=shape, seq_len=8, micro_batch=2, global_batch=2,
                        steps=1, warmup=0, dtype=torch.float32, lr=1e-3, weight_decay=0.0,
                        seed=5, checkpointing=True)
    matmul = 3 * (32 * 96 + 32 * 32 + 32 * 128 + 64 * 32) + 64 * 32
    assert sharded.model_flops_per_token(model, plan) == pytest.approx(
        6 * matmul + 6 * 3 * 32 * 8)
