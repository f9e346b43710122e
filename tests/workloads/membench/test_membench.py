"""membench on a node without a CUDA device: real host measurements into a real Recorder,
documented skips for what needs a GPU, and the managed-memory safety rule on numbers.

Every spec here asks for ``resources.gpus = 0``, so the tests describe a CPU-only node on any
machine (a GPU node runs the host path too).
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from hopperlab.core.rundir import Recorder, SkipRun, load_record, read_steps
from hopperlab.workloads import family_info
from hopperlab.workloads.base import fake_run
from hopperlab.workloads.membench import (FAMILY, HEADLINE_METRICS, MembenchParams,
                                          headline_metrics)
from hopperlab.workloads.membench import workload
from hopperlab.cuda.managed_policy import MANAGED_FREE_FRACTION, managed_bytes_allowed
from hopperlab.workloads.membench.common import inner_copies, plan_for

GB = 10**9
SIZES = (1, 4, 8)


def spec(gpus: int = 0, memory: str = "device", profiler: str = "none", scale: str = "smoke",
         allow: bool = False, **params):
    values = {"sizes_mb": SIZES, "repeats": 3, "warmup": 1, **params}
    return fake_run(MembenchParams(**values), scale=scale, gpus=gpus,
                    allow_oversubscription=allow, memory=memory, profiler=profiler)


def run_variant(tmp_path, s, *, use_torch: bool = True):
    """Run like the runner does: status ok, or skipped with the SkipRun's reason."""
    rec = Recorder(tmp_path / "run", identity={"family": "membench"})
    try:
        workload.run(s, rec, use_torch=use_torch)
    except SkipRun as exc:
        return rec.finish("skipped", str(exc)), tmp_path / "run"
    return rec.finish("ok"), tmp_path / "run"


def check_sweep(record, run_dir, prefix, per_size=("gbps",)):
    assert record["status"] == "ok", record["reason"]
    steps = read_steps(run_dir)
    assert [s["step"] for s in steps] == list(range(len(SIZES)))
    assert [s["metrics"]["size_mb"] for s in steps] == [float(x) for x in SIZES]
    lines = (run_dir / "steps.jsonl").read_text().splitlines()
    assert len(lines) == len(SIZES) and all(json.loads(line)["metrics"] for line in lines)
    metrics = record["metrics"]
    for size in SIZES:
        for name in per_size:
            assert metrics[f"{prefix}_{name}_{size}mb"] > 0
    assert (run_dir / "artifacts" / "sweep.csv").read_text().count("\n") == len(SIZES) + 1
    assert (run_dir / "artifacts" / "samples.csv").exists()
    assert load_record(run_dir)["status"] == "ok"
    return metrics


def plausible(value):
    assert 0.1 < value < 1000, value


# --------------------------------------------------------------------------- declarations
def test_family_declaration():
    assert family_info("membench") is FAMILY
    assert FAMILY.params is MembenchParams
    assert FAMILY.supported_knobs == {"memory": frozenset({"device", "managed", "system"}),
                                      "profiler": frozenset({"none", "nsys", "torch"})}
    for knob in ("num_workers", "offload", "precision"):
        assert knob not in FAMILY.supported_knobs
    assert FAMILY.load_entry() is workload.run
    assert FAMILY.headline_metrics == HEADLINE_METRICS
    assert set(headline_metrics("copy")) <= set(HEADLINE_METRICS)
    assert "alloc_ms_at_largest" in headline_metrics("alloc")


def test_params_defaults_and_validation():
    p = MembenchParams()
    assert (p.test, p.direction, p.host_memory, p.kind) == ("copy", "h2d", "pinned", "device")
    assert dataclasses.is_dataclass(p)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.test = "alloc"  # type: ignore[misc]
    assert MembenchParams(sizes_mb=[1, 2]).sizes_mb == (1, 2)  # lists from YAML become tuples
    with pytest.raises(ValueError, match="direction"):
        MembenchParams(direction="sideways")
    with pytest.raises(ValueError, match="kind"):
        MembenchParams(kind="unified")
    with pytest.raises(ValueError, match="sizes_mb"):
        MembenchParams(sizes_mb=(0,))
    with pytest.raises(ValueError, match="repeats"):
        MembenchParams(repeats=0)


def test_the_plan_is_the_params_whatever_the_scale():
    """Scale is decided once, in experiments/membench.yaml's ``scales:`` (issue 31): a run reads
    its params only; the defaults are the smoke scale's."""
    smoke = plan_for(MembenchParams())
    assert (smoke.sizes_mb, smoke.repeats, smoke.warmup, smoke.sample_bytes) == \
        ((1, 8, 32), 3, 1, 16 << 20)
    explicit = plan_for(MembenchParams(sizes_mb=(2,), repeats=7, warmup=0, sample_mb=256))
    assert (explicit.sizes_mb, explicit.repeats, explicit.warmup, explicit.sample_bytes) == \
        ((2,), 7, 0, 256 << 20)
    assert inner_copies(1 << 20, 16 << 20) == 16
    assert inner_copies(1 << 30, 16 << 20) == 1


# --------------------------------------------------------------------------- safety rule
def test_managed_bytes_allowed_numbers():
    free = 80 * GB
    assert MANAGED_FREE_FRACTION == 0.5
    assert managed_bytes_allowed(1 * GB, free, False, False)
    assert managed_bytes_allowed(40 * GB, free, False, False)  # exactly half
    assert not managed_bytes_allowed(40 * GB + 1, free, False, False)
    assert not managed_bytes_allowed(80 * GB, free, False, False)
    assert not managed_bytes_allowed(200 * GB, free, False, False)
    # Grace Hopper, or a site that allows it: oversubscription is fine
    assert managed_bytes_allowed(200 * GB, free, True, False)
    assert managed_bytes_allowed(200 * GB, free, False, True)
    # unknown free memory: refuse unless GH / allowed
    assert not managed_bytes_allowed(1, None, False, False)
    assert managed_bytes_allowed(1, None, True, False)
    assert managed_bytes_allowed(0, 0, False, False)
    with pytest.raises(ValueError):
        managed_bytes_allowed(-1, free, False, False)


# --------------------------------------------------------------------------- host measurements
@pytest.mark.parametrize("use_torch", [True, False], ids=["torch", "numpy"])
@pytest.mark.parametrize("direction", ["h2d", "d2h"])
def test_pageable_copy_measures_host_memcpy(tmp_path, direction, use_torch):
    if use_torch:
        pytest.importorskip("torch")
    record, run_dir = run_variant(tmp_path, spec(test="copy", direction=direction,
                                                 host_memory="pageable"), use_torch=use_torch)
    metrics = check_sweep(record, run_dir, "memcpy")
    assert not any(k.startswith(("h2d_", "d2h_")) for k in metrics)  # no device involved
    tags = record["tags"]
    assert tags["membench.target"] == "host"
    assert tags["membench.host_backend"] == "numpy"  # with or without torch
    assert "host memcpy" in tags["membench.stand_in"]
    for size in SIZES:
        assert metrics[f"memcpy_gbps_{size}mb"] < 1000
    plausible(metrics["gbps_peak"])
    assert metrics["gbps_at_largest"] == metrics[f"memcpy_gbps_{SIZES[-1]}mb"]
    assert set(headline_metrics("copy")) <= set(metrics)
    step = read_steps(run_dir)[0]["metrics"]
    assert step["gbps_min"] <= step["gbps"] <= step["gbps_max"]


def test_bidir_pageable_runs_two_host_copies_at_once(tmp_path):
    record, run_dir = run_variant(tmp_path, spec(test="copy", direction="bidir",
                                                 host_memory="pageable"))
    metrics = check_sweep(record, run_dir, "memcpy_x2")
    plausible(metrics["gbps_peak"])


@pytest.mark.parametrize("use_torch", [True, False], ids=["torch", "numpy"])
def test_host_alloc_first_touch(tmp_path, use_torch):
    if use_torch:
        pytest.importorskip("torch")
    record, run_dir = run_variant(tmp_path, spec(test="alloc", kind="host"), use_torch=use_torch)
    metrics = check_sweep(record, run_dir, "host",
                          per_size=("alloc_ms", "first_touch_gbps", "write_gbps", "free_ms"))
    assert record["tags"]["membench.target"] == "host"
    plausible(metrics["gbps_peak"])
    assert 0 < metrics["alloc_ms_at_largest"] < 1000
    assert set(headline_metrics("alloc")) <= set(metrics)


# --------------------------------------------------------------------------- what needs a GPU
@pytest.mark.parametrize("params,memory,needle", [
    ({"test": "copy", "direction": "h2d", "host_memory": "pinned"}, "device", "pinned host memory"),
    ({"test": "copy", "direction": "bidir", "host_memory": "pinned"}, "device", "pinned host memory"),
    ({"test": "copy", "direction": "h2d", "host_memory": "pageable"}, "managed", "memory=managed"),
    ({"test": "alloc", "kind": "device"}, "device", "device allocations"),
    ({"test": "alloc", "kind": "pinned"}, "device", "pinned allocations"),
    ({"test": "alloc", "kind": "managed"}, "managed", "managed allocations"),
])
def test_gpu_variants_skip_with_reason(tmp_path, params, memory, needle):
    record, run_dir = run_variant(tmp_path, spec(memory=memory, **params))
    assert record["status"] == "skipped"
    assert needle in record["reason"] and "CUDA device" in record["reason"]
    # the reason names what is missing on this node
    assert any(w in record["reason"] for w in ("torch", "resources.gpus", "CUDA"))
    assert record["metrics"] == {}
    assert read_steps(run_dir) == []


def test_skip_reason_without_torch(tmp_path):
    record, _ = run_variant(tmp_path, spec(test="alloc", kind="managed", memory="managed"),
                            use_torch=False)
    assert record["status"] == "skipped" and "torch is not" in record["reason"]


def test_managed_knob_contradicting_kind_is_an_error():
    from hopperlab.workloads.base import Contradiction, Knobs

    with pytest.raises(Contradiction, match="contradicts"):
        FAMILY.check(Knobs(memory="managed"), MembenchParams(test="alloc", kind="device"))


def test_torch_profiler_writes_a_trace(tmp_path):
    pytest.importorskip("torch")
    record, run_dir = run_variant(tmp_path, spec(test="copy", direction="h2d",
                                                 host_memory="pageable", profiler="torch",
                                                 sizes_mb=(1,), repeats=1, warmup=0))
    assert record["status"] == "ok"
    assert (run_dir / "artifacts" / "profile" / "torch_trace.json").stat().st_size > 0


# --------------------------------------------------------------------------- helpers
def test_loaded_cudart_paths():
    from hopperlab.cuda.runtime import loaded_cudart_paths

    maps = (
        "7f00-7f01 r-xp 00000000 08:01 1 /usr/lib/x86_64-linux-gnu/libc.so.6\n"
        "7f02-7f03 r-xp 00000000 08:01 2 /venv/lib/python3.12/site-packages/nvidia/cu13/lib/"
        "libcudart.so.13\n"
        "7f04-7f05 r--p 00010000 08:01 2 /venv/lib/python3.12/site-packages/nvidia/cu13/lib/"
        "libcudart.so.13\n"
        "7f06-7f07 r-xp 00000000 08:01 3 /opt/torch/lib/libcudart-9335f6a2.so.12\n"
        "7f08-7f09 rw-p 00000000 00:00 0 \n"
        "7f0a-7f0b r-xp 00000000 08:01 4 /opt/lib/libcudart_static_helper.so\n")
    assert loaded_cudart_paths(maps) == [
        "/venv/lib/python3.12/site-packages/nvidia/cu13/lib/libcudart.so.13",
        "/opt/torch/lib/libcudart-9335f6a2.so.12",
    ]


# --------------------------------------------------------------------------- energy's work done
@pytest.mark.parametrize("use_torch", [True, False], ids=["torch", "numpy"])
@pytest.mark.parametrize("direction, ways", [("h2d", 1), ("bidir", 2)])
def test_a_copy_run_counts_every_byte_its_window_copied(tmp_path, direction, ways, use_torch):
    """Issue 36: J per TB copied = the window's joules / the bytes copied inside it (every size,
    warm-up samples too), not the mean power over the largest size's rate."""
    if use_torch:
        pytest.importorskip("torch")
    from hopperlab.config.energy import energy_basis, energy_figures
    from hopperlab.core import energy_names as N
    from hopperlab.workloads.membench.copies import MEASURED_GB_COPIED

    record, run_dir = run_variant(tmp_path, spec(test="copy", direction=direction,
                                                 host_memory="pageable"), use_torch=use_torch)
    assert record["status"] == "ok", record["reason"]
    plan = plan_for(MembenchParams(sizes_mb=SIZES, repeats=3, warmup=1))
    expected = sum(mb * 2**20 * inner_copies(mb * 2**20, plan.sample_bytes) * ways * (1 + 3)
                   for mb in SIZES)
    # the steps' own inner counts agree with the plan's
    assert [s["metrics"]["inner"] for s in read_steps(run_dir)] == \
        [inner_copies(mb * 2**20, plan.sample_bytes) for mb in SIZES]
    copied = record["metrics"][MEASURED_GB_COPIED]
    assert copied == pytest.approx(expected / GB)
    units = FAMILY.work_units
    metrics = {**record["metrics"], N.ENERGY_GPU_J: 100.0, N.ENERGY_WINDOW_S: 2.0}
    assert energy_basis(metrics, units).startswith(f"work done: {copied:.6g}")
    # 100 J over `copied` GB: J per TB = 100 / copied x 1000, whatever gbps_at_largest says
    figures = energy_figures(metrics, units)
    assert figures["energy_per_tb_copied_j"] == pytest.approx(100.0 / copied * 1000)
    assert figures["gb_copied_per_j"] == pytest.approx(copied / 100.0)


def test_an_alloc_run_says_why_its_energy_is_by_the_rate(tmp_path):
    from hopperlab.config.energy import energy_basis
    from hopperlab.core import energy_names as N

    record, _ = run_variant(tmp_path, spec(test="alloc", kind="host"))
    assert record["status"] == "ok", record["reason"]
    why = record["tags"][N.TAG_WORK_NOT_COUNTED]
    assert "copies nothing" in why
    assert "measured_gb_copied" not in record["metrics"]
    metrics = {**record["metrics"], N.ENERGY_GPU_J: 100.0, N.ENERGY_WINDOW_S: 2.0}
    basis = energy_basis(metrics, FAMILY.work_units, None, why)
    assert basis.startswith("rate: ") and basis.endswith("work done not counted: " + why)


@pytest.mark.parametrize("use_torch", [True, False], ids=["torch", "numpy"])
@pytest.mark.parametrize("direction", ["h2d", "bidir"])
def test_the_bytes_counted_are_the_bytes_copied_inside_the_energy_window(
        tmp_path, monkeypatch, direction, use_torch):
    """Issue 36: every copy the run makes is counted, and only inside the measured window (the
    energy meter's): its joules over ``measured_gb_copied`` are joules per byte it moved. Without
    torch the run opens the window too (it used to leave the meter the whole workload call)."""
    if use_torch:
        pytest.importorskip("torch")
    from hopperlab.config.energy import energy_figures
    from hopperlab.core import energy_names as N
    from hopperlab.core.window import MEASURED, listening
    from hopperlab.workloads.membench.common import HostBackend
    from hopperlab.workloads.membench.copies import MEASURED_GB_COPIED

    events: list[str] = []
    inside: list[int] = []     # list.append: the bidir copies come from two threads
    outside: list[int] = []
    real_copy = HostBackend.copy

    def counting_copy(self, dst, src):
        (inside if events and events[-1] == "start" else outside).append(int(dst.nbytes))
        real_copy(self, dst, src)

    monkeypatch.setattr(HostBackend, "copy", counting_copy)
    with listening(lambda event, name: events.append(event) if name == MEASURED else None):
        record, _ = run_variant(tmp_path, spec(test="copy", direction=direction,
                                               host_memory="pageable"), use_torch=use_torch)
    assert record["status"] == "ok", record["reason"]
    assert events == ["start", "end"]            # one measured window
    assert inside and not outside
    copied = record["metrics"][MEASURED_GB_COPIED]
    assert copied * GB == pytest.approx(sum(inside))
    joules = 50.0
    metrics = {**record["metrics"], N.ENERGY_GPU_J: joules, N.ENERGY_WINDOW_S: 1.0}
    figures = energy_figures(metrics, FAMILY.work_units)
    assert figures["energy_per_tb_copied_j"] == pytest.approx(joules / (sum(inside) / 1e12))
    assert figures["gb_copied_per_j"] == pytest.approx(sum(inside) / GB / joules)
