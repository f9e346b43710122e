"""Issue 35's diagnostic: one profiled step reduced to where the GPU's time went (busy, idle,
kernels by kind, copies and the rate they reached)."""

from __future__ import annotations

import pytest

from hopperlab.workloads.finetune.sharded import step_profile


def _ev(cat: str, name: str, ts: float, dur: float, **args) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "args": args}


def test_overlapping_spans_count_once():
    assert step_profile.union_s([(0, 1e6), (5e5, 2e6), (3e6, 4e6)]) == pytest.approx(3.0)
    assert step_profile.union_s([]) == 0.0
    assert step_profile.union_s([(0, 4e6), (1e6, 2e6)]) == pytest.approx(4.0)


def test_kernels_are_sorted_by_kind():
    assert step_profile.kind_of("sm90_xmma_gemm_bf16bf16_bf16f32") == "matmul"
    assert step_profile.kind_of("nvjet_tst_128x256_64x4_2x1_v_bz_coopA_TNN") == "matmul"
    assert step_profile.kind_of("pytorch_flash::flash_fwd_kernel<...>") == "attention"
    assert step_profile.kind_of("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL") == "nccl"
    assert step_profile.kind_of("triton_per_fused__to_copy_add_mean_mul_pow_rsqrt_0") == "triton"
    assert step_profile.kind_of("void at::native::vectorized_elementwise_kernel<4, ...>") == "other"


def test_a_step_s_trace_reduces_to_busy_idle_kernel_kinds_and_copy_rates():
    """10 s of wall: a 4 s GEMM, a 1 s element-wise kernel, NCCL 1 s of which 0.5 s beside
    compute, 2 GB host->device in 1 s (0.5 s beside compute), 1 GB device->host in 0.5 s."""
    s = 1e6
    trace = {"traceEvents": [
        _ev("kernel", "sm90_xmma_gemm", 0, 4 * s),
        _ev("kernel", "vectorized_elementwise_kernel", 4 * s, 1 * s),
        _ev("kernel", "ncclDevKernel_AllGather", 4.5 * s, 1 * s),
        _ev("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 4.5 * s, 1 * s, bytes=2e9),
        _ev("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", 7 * s, 0.5 * s, bytes=1e9),
        _ev("gpu_memset", "Memset (Device)", 9 * s, 0.1 * s),
        _ev("cpu_op", "aten::mm", 0, 9 * s),            # not the GPU's
        {"ph": "i", "cat": "kernel", "name": "marker", "ts": 0},  # not a span
    ]}
    d = step_profile.summarize(trace, wall_s=10.0)
    assert d["diag_step_s"] == 10.0
    assert d["diag_compute_s"] == pytest.approx(5.0)
    assert d["diag_no_compute_s"] == pytest.approx(5.0)
    assert d["diag_gpu_busy_s"] == pytest.approx(5.5 + 0.5 + 0.1)  # 0-5.5, 7-7.5, 9-9.1
    assert d["diag_gpu_idle_s"] == pytest.approx(10 - 6.1)
    assert d["diag_matmul_kernel_s"] == pytest.approx(4.0)
    assert d["diag_other_kernel_s"] == pytest.approx(1.0)
    assert d["diag_nccl_kernel_s"] == pytest.approx(1.0)
    assert d["diag_nccl_exposed_s"] == pytest.approx(0.5)
    assert d["diag_kernels"] == 3
    assert d["diag_h2d_gb"] == pytest.approx(2.0) and d["diag_h2d_gbps"] == pytest.approx(2.0)
    assert d["diag_h2d_exposed_s"] == pytest.approx(0.5)
    assert d["diag_d2h_gbps"] == pytest.approx(2.0) and d["diag_d2h_exposed_s"] == pytest.approx(0.5)


def test_an_empty_trace_says_the_gpu_was_idle():
    d = step_profile.summarize({"traceEvents": []}, wall_s=2.0)
    assert d["diag_gpu_idle_s"] == 2.0 and d["diag_gpu_busy_s"] == 0.0
    assert "diag_h2d_gbps" not in d


@pytest.mark.integration  # the profiler's start and trace export, ~2 s
def test_a_profiled_step_runs_once_and_returns_its_figures():
    import torch

    calls = []
    a = torch.randn(64, 64)

    def step():
        calls.append(1)
        return float((a @ a).sum())

    result, figures, why = step_profile.profile_step(step, lambda: None, cuda=False)
    assert why is None and len(calls) == 1 and result == pytest.approx(float((a @ a).sum()))
    assert figures["diag_step_s"] > 0 and figures["diag_kernels"] == 0  # a CPU trace: no kernels
