"""prof_ metrics from real profiles: nsys SQLite exports and torch traces made on the lent H100
(tests/fixtures/profiling/, see docs/profiling.md), checked against nsys' own CSV reports of the
same runs, and the interval arithmetic on hand-made timelines."""

from __future__ import annotations

import csv
import shutil
import sqlite3
from pathlib import Path

import pytest

from hopperlab.profiling import nsys_sqlite, torch_trace
from hopperlab.profiling.finish import available_reports, choose_reports
from hopperlab.profiling.timeline import (KERNEL, GpuOp, Range, Timeline, derive_metrics,
                                          idle_gaps, kernel_table, union)

FIX = Path(__file__).parents[1] / "fixtures" / "profiling"
W0, W4, MANAGED = (FIX / f"trainloop__loop__{n}-nsys.sqlite"
                   for n in ("w0-device", "w4-device", "w0-managed"))
MEMBENCH_H2D = FIX / "membench__copy-profiled__h2d-pinned.sqlite"
MEMBENCH_BIDIR = FIX / "membench__copy-profiled__bidir-pinned.sqlite"
MATMUL = FIX / "matmul-h200.sqlite"


def metrics_of(path: Path, threshold_us: float = 100.0) -> tuple[dict, dict]:
    return derive_metrics(nsys_sqlite.read_timeline(path), threshold_us)


def csv_rows(run: str, report: str) -> list[dict[str, str]]:
    with open(FIX / f"csv-trainloop-{run}" / f"{report}.csv", newline="") as fh:
        return list(csv.DictReader(fh))


# --------------------------------------------------------------------------- interval arithmetic
def test_union_and_gaps():
    assert union([(5, 7), (0, 2), (1, 3), (7, 8), (10, 10)]) == [(0, 3), (5, 8)]
    assert idle_gaps([(0, 3), (5, 8), (20, 21)], threshold_ns=2) == [12]
    assert idle_gaps([(0, 3), (5, 8), (20, 21)], threshold_ns=1) == [2, 12]


def test_derived_metrics_on_a_hand_made_timeline():
    us = 1000
    t = Timeline("nsys", 0, 1000 * us, ops=[
        GpuOp(0, 300 * us, KERNEL, "gemm"),
        GpuOp(100 * us, 200 * us, "memcpy_h2d", "HtoD", nbytes=5_000_000),  # overlaps gemm
        GpuOp(500 * us, 600 * us, KERNEL, "relu"),
        GpuOp(600 * us, 650 * us, "um_h2d", "Unified HtoD", nbytes=1_000_000),
        GpuOp(900 * us, 1100 * us, KERNEL, "gemm"),  # cut at the capture's end
    ], ranges=[Range(0, 400 * us, "step"), Range(400 * us, 1000 * us, "step"),
               Range(-50 * us, 10 * us, "before")], um_faults={"cpu": 3, "gpu": 7})
    m, tags = derive_metrics(t, gap_threshold_us=150)
    assert m["prof_capture_s"] == pytest.approx(1e-3)
    assert m["prof_gpu_busy_frac"] == pytest.approx((300 + 150 + 100) / 1000)
    assert tags["prof.top_kernel"] == "gemm"
    assert m["prof_top_kernel_share"] == pytest.approx(400 / 500)
    assert m["prof_memops_share"] == pytest.approx(150 / 650)
    assert m["prof_memcpy_h2d_bytes"] == 5_000_000
    assert m["prof_memcpy_h2d_gbps"] == pytest.approx(5e6 / 100e3)  # bytes/ns = GB/s
    assert m["prof_um_share"] == pytest.approx(50 / 650)
    assert m["prof_um_memops_share"] == pytest.approx(50 / 150)
    assert (m["prof_um_cpu_faults"], m["prof_um_gpu_faults"]) == (3, 7)
    assert m["prof_gpu_idle_gaps"] == 2  # 300->500 and 650->900 are over 150 us
    assert m["prof_gpu_idle_gap_s"] == pytest.approx(450e-6)
    assert m["prof_nvtx_step_count"] == 2 and m["prof_nvtx_step_s"] == pytest.approx(1e-3)
    assert m["prof_nvtx_before_s"] == pytest.approx(10e-6)  # clipped to the capture


def test_a_trace_without_gpu_work_gives_ranges_only():
    t = Timeline("torch", 0, 10, ranges=[Range(0, 5, "step")], missing=["unified memory",
                                                                           "GPU activity"])
    m, tags = derive_metrics(t)
    assert "prof_gpu_busy_frac" not in m and m["prof_nvtx_step_count"] == 1
    assert tags["prof.missing"] == "unified memory, GPU activity"


# --------------------------------------------------------------------------- nsys exports
def test_kernel_totals_match_nsys_own_report():
    for run, path in (("w0-managed-nsys", MANAGED), ("w4-device-nsys", W4)):
        rows = csv_rows(run, "cuda_gpu_kern_sum")
        m, _ = metrics_of(path)
        assert m["prof_kernels"] == sum(int(r["Instances"]) for r in rows)
        assert m["prof_kernel_s"] * 1e9 == pytest.approx(
            sum(float(r["Total Time (ns)"]) for r in rows), rel=1e-9)
        table = kernel_table(nsys_sqlite.read_timeline(path))
        top_csv = max(rows, key=lambda r: float(r["Total Time (ns)"]))
        assert table[0]["count"] == int(top_csv["Instances"])
        assert table[0]["total_ms"] * 1e6 == pytest.approx(float(top_csv["Total Time (ns)"]))


def test_memcpy_and_unified_memory_match_nsys_own_reports():
    m, _ = metrics_of(MANAGED)
    by_op = {r["Operation"]: r for r in csv_rows("w0-managed-nsys", "cuda_gpu_mem_time_sum")}
    sizes = {r["Operation"]: r for r in csv_rows("w0-managed-nsys", "cuda_gpu_mem_size_sum")}
    um_h2d = "[CUDA memcpy Unified Host-to-Device]"
    um_d2h = "[CUDA memcpy Unified Device-to-Host]"
    assert m["prof_um_h2d_s"] * 1e9 == pytest.approx(float(by_op[um_h2d]["Total Time (ns)"]))
    assert m["prof_um_d2h_s"] * 1e9 == pytest.approx(float(by_op[um_d2h]["Total Time (ns)"]))
    assert m["prof_um_bytes"] / 1e6 == pytest.approx(
        float(sizes[um_h2d]["Total (MB)"]) + float(sizes[um_d2h]["Total (MB)"]), abs=2e-3)
    total = csv_rows("w0-managed-nsys", "um_total_sum")[0]
    assert m["prof_um_cpu_faults"] == int(total["Total CPU Page Faults"])
    # the fixture was trimmed before numberOfPageFaults was kept: one per GPU fault record
    assert m["prof_um_gpu_faults"] > 0
    assert 0 < m["prof_um_share"] < m["prof_memops_share"] <= 1
    assert m["prof_um_memops_share"] > 0.9  # the staged batches are the only large traffic


def test_nvtx_ranges_match_nsys_nvtx_sum():
    m, _ = metrics_of(W0)
    for row in csv_rows("w0-device-nsys", "nvtx_sum"):
        name = row["Range"].lstrip(":")
        key = name.replace(".", ".")
        assert m[f"prof_nvtx_{key}_count"] == int(row["Instances"])
        assert m[f"prof_nvtx_{key}_s"] * 1e9 == pytest.approx(float(row["Total Time (ns)"]),
                                                               rel=1e-6)
    for name in ("step", "forward", "backward", "optimizer", "data.wait"):
        assert m[f"prof_nvtx_{name}_count"] == 20


def test_data_loader_workers_close_the_gpu_gaps():
    """The source talk's num_workers 0 -> 4: fewer and much shorter GPU idle gaps."""
    m0, _ = metrics_of(W0)
    m4, _ = metrics_of(W4)
    assert m4["prof_gpu_idle_gap_s"] < m0["prof_gpu_idle_gap_s"] / 10
    assert m4["prof_gpu_busy_frac"] > 5 * m0["prof_gpu_busy_frac"]
    assert m4["prof_nvtx_data.wait_s"] < m0["prof_nvtx_data.wait_s"] / 10
    assert "prof_um_share" not in m0  # no unified-memory tracing asked for


def test_membench_copies_by_direction():
    h2d, _ = metrics_of(MEMBENCH_H2D)
    bidir, tags = metrics_of(MEMBENCH_BIDIR)
    assert h2d["prof_memcpy_h2d_share"] > 0.9 and h2d["prof_memcpy_h2d_bytes"] > 1e9
    assert bidir["prof_memcpy_h2d_bytes"] == pytest.approx(bidir["prof_memcpy_d2h_bytes"])
    assert 10 < bidir["prof_memcpy_h2d_gbps"] < 100  # PCIe Gen5 x16, one direction
    assert "spin_kernel" in tags["prof.top_kernel"]  # membench's stream-holding kernel


def test_whole_process_capture_uses_the_analysis_window():
    m, tags = metrics_of(MATMUL)
    assert m["prof_capture_s"] == pytest.approx(4.585, abs=1e-3)
    assert m["prof_kernels"] == 21 and m["prof_nvtx_step_count"] == 20
    assert m["prof_top_kernel_share"] > 0.99 and "gemm" in tags["prof.top_kernel"]
    assert m["prof_gpu_busy_frac"] < 0.05  # most of a whole-process profile is start-up


def test_capture_range_window_is_the_recorded_activity():
    db = sqlite3.connect(W0)
    span = nsys_sqlite.activity_span(db)
    window = nsys_sqlite.capture_window(db)
    db.close()
    assert window == span  # ANALYSIS_DETAILS is at another origin under a capture range
    m, _ = metrics_of(W0)
    assert m["prof_nvtx_step_s"] <= m["prof_capture_s"]


def test_gap_threshold_changes_the_count():
    loose, _ = metrics_of(W0, threshold_us=10)
    strict, _ = metrics_of(W0, threshold_us=10_000)
    assert loose["prof_gpu_idle_gaps"] > strict["prof_gpu_idle_gaps"] >= 1


def test_trim_keeps_the_metrics(tmp_path):
    again = nsys_sqlite.trim(MANAGED, tmp_path / "again.sqlite")
    assert metrics_of(again) == metrics_of(MANAGED)
    assert again.stat().st_size <= MANAGED.stat().st_size


def test_not_an_export(tmp_path):
    bad = tmp_path / "x.sqlite"
    sqlite3.connect(bad).execute("CREATE TABLE t (a)").connection.commit()
    with pytest.raises(nsys_sqlite.NotAnExport):
        nsys_sqlite.read_timeline(bad)
    with pytest.raises(nsys_sqlite.NotAnExport):
        nsys_sqlite.read_timeline(tmp_path / "missing.sqlite")


@pytest.mark.parametrize("label, kind", [
    ("Host-to-Device", "memcpy_h2d"), ("Device-to-Host", "memcpy_d2h"),
    ("Device-to-Device", "memcpy_d2d"), ("Peer-to-Peer", "memcpy_p2p"),
    ("Unified Host-to-Device", "um_h2d"), ("Unified Device-to-Host", "um_d2h"),
    ("Unified Device-to-Device", "um_other"), ("Array-to-Array", "memcpy_other")])
def test_copy_directions(label, kind):
    assert nsys_sqlite.copy_direction(label) == kind


# --------------------------------------------------------------------------- nsys stats reports
def test_reports_offered_by_nsys_2025_3():
    offered = available_reports((FIX / "nsys-2025.3.1-help-reports.txt").read_text())
    chosen, missing = choose_reports(offered)
    assert missing == []
    assert chosen["cuda_gpu_kern_sum"] == "cuda_gpu_kern_sum" and "um_total_sum" in chosen


def test_old_report_names_are_found_and_absent_ones_reported():
    chosen, missing = choose_reports({"gpukernsum", "cudaapisum", "nvtxppsum"})
    assert chosen == {"cuda_gpu_kern_sum": "gpukernsum", "cuda_api_sum": "cudaapisum",
                      "nvtx_sum": "nvtxppsum"}
    assert "cuda_gpu_mem_time_sum" in missing and "um_sum" in missing


# --------------------------------------------------------------------------- torch traces
def test_torch_trace_from_the_gpu(tmp_path):
    m, tags = derive_metrics(torch_trace.read_timeline(
        FIX / "membench-h2d-pinned-torch_trace.json.gz"))
    nsys_m, _ = metrics_of(MEMBENCH_H2D)
    assert m["prof_memcpy_h2d_share"] == pytest.approx(nsys_m["prof_memcpy_h2d_share"], abs=0.05)
    assert m["prof_memcpy_h2d_bytes"] == nsys_m["prof_memcpy_h2d_bytes"]
    assert tags["prof.missing"] == "unified memory" and "prof_um_share" not in m
    assert torch_trace.copy_direction("Memcpy DtoH (Device -> Pinned)") == "memcpy_d2h"


def test_torch_trace_on_this_machine(tmp_path):
    torch = pytest.importorskip("torch")
    from hopperlab.cuda import nvtx
    from hopperlab.core.rundir import Recorder

    rec = Recorder(tmp_path)
    with nvtx.profiled_region("torch", rec):
        for _ in range(3):
            with nvtx.nvtx_range(nvtx.STEP):
                with nvtx.nvtx_range(nvtx.FORWARD):
                    torch.ones(64, 64) @ torch.ones(64, 64)
    rec.finish("ok")
    timeline = torch_trace.read_timeline(tmp_path / "artifacts" / nvtx.TORCH_TRACE)
    m, _ = derive_metrics(timeline)
    assert m["prof_nvtx_step_count"] == 3 and m["prof_nvtx_forward_count"] == 3
    if not torch.cuda.is_available():
        assert "prof_gpu_busy_frac" not in m
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    with pytest.raises(torch_trace.NotATrace):
        torch_trace.read_timeline(bad)
    shutil.rmtree(tmp_path / "artifacts")


# --------------------------------------------------------------------------- LoRA-7B on the H200
#: the async activation offload's own counter in that run's record: bytes to host per step
LORA_OFFLOAD_BYTES_PER_STEP = 45_239_762_950


def _lora_fixture(name: str, tmp_path: Path) -> Path:
    """finetune/lora-llama2-7b/<name> under nsys through the workflow on the lent H200 (docs/
    profiling.md), cut to its first two measured steps and gzipped to keep the fixture small."""
    import gzip

    out = tmp_path / f"{name}.sqlite"
    out.write_bytes(gzip.decompress(
        (FIX / f"finetune__lora-llama2-7b__{name}__2steps.sqlite.gz").read_bytes()))
    return out


def test_lora_offload_profile_sees_exactly_the_bytes_the_offload_counted(tmp_path):
    m, _ = metrics_of(_lora_fixture("offload-activations", tmp_path))
    assert m["prof_nvtx_step_count"] == 2 and m["prof_nvtx_forward_count"] == 2
    # nsys' device->host copies over two steps are the offload's own count, to the byte
    assert m["prof_memcpy_d2h_bytes"] == 2 * LORA_OFFLOAD_BYTES_PER_STEP
    # every byte comes back (plus the step's few small host->device copies)
    assert m["prof_memcpy_h2d_bytes"] == pytest.approx(m["prof_memcpy_d2h_bytes"], rel=1e-4)
    # the copies run at the link's speed (55.4 GB/s pinned, measured by membench on that node)
    assert 50 < m["prof_memcpy_d2h_gbps"] < 58 and 50 < m["prof_memcpy_h2d_gbps"] < 58
    assert m["prof_nvtx_offload.copy_count"] > 100 and m["prof_nvtx_offload.prefetch_count"] > 10


@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
def test_lora_offload_vs_none_the_talks_comparison(tmp_path):
    """More memory operations and a busier link with activation offload; the baseline is
    kernels (the talk: memory operations 0.5% of GPU time without offload)."""
    base, base_tags = metrics_of(_lora_fixture("baseline", tmp_path))
    off, _ = metrics_of(_lora_fixture("offload-activations", tmp_path))
    assert base["prof_memops_share"] < 0.01 and base["prof_kernel_share"] > 0.99
    assert off["prof_memops_share"] > 0.7
    assert base_tags["prof.top_kernel"].startswith("nvjet_sm90")  # a cuBLAS GEMM
    assert off["prof_nvtx_step_mean_ms"] > 2 * base["prof_nvtx_step_mean_ms"]
