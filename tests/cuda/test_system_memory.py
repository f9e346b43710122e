"""System-allocated memory (issue 21, part 1): the capability is read from the CUDA attributes
(a stand-in libcudart whose attributes the test sets), and membench's and the database's
``system`` variants skip with that reason, recorded, where the device does not report
pageableMemoryAccess; on a CPU node they skip before anything is allocated."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from hopperlab.core.rundir import Recorder, SkipRun
from hopperlab.cuda import runtime as cr
from hopperlab.cuda.system_memory import system_memory_support
from hopperlab.workloads.base import Contradiction, Knobs, fake_run
from hopperlab.workloads.database import DatabaseParams
from hopperlab.workloads.database import check as database_check
from hopperlab.workloads.database import workload as db_workload
from hopperlab.workloads.membench import MembenchParams
from hopperlab.workloads.membench import check as membench_check
from hopperlab.workloads.membench import allocation, workload
from hopperlab.workloads.membench.common import Env, HostBackend, Plan

FAKE = (Path(__file__).parents[1] / "memory_fake_cuda") / "fake_cudart.c"


@pytest.fixture(scope="module")
def fake_cudart(tmp_path_factory) -> str:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler for the stand-in libcudart")
    out = tmp_path_factory.mktemp("fakecuda") / "libcudart.so.13"
    subprocess.run([cc, "-shared", "-fPIC", "-O0", "-o", str(out), str(FAKE)], check=True)
    return str(out)


def _attrs(monkeypatch, pageable: int, ats: int = 0) -> None:
    monkeypatch.setenv(f"FAKE_CUDA_ATTR_{cr.ATTR_PAGEABLE_MEMORY_ACCESS}", str(pageable))
    monkeypatch.setenv(
        f"FAKE_CUDA_ATTR_{cr.ATTR_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES}", str(ats))


@pytest.mark.parametrize("pageable,ats,mechanism", [(0, 0, "none"), (1, 0, "HMM"),
                                                    (1, 1, "ATS (host page tables)")])
def test_capability_from_the_attributes(fake_cudart, monkeypatch, pageable, ats, mechanism):
    _attrs(monkeypatch, pageable, ats)
    support = system_memory_support(cr.CudaRuntime(fake_cudart), 0)
    assert support.pageable_memory_access is bool(pageable)
    assert support.mechanism == mechanism
    assert (support.reason is None) is bool(pageable)
    if not pageable:
        assert "pageableMemoryAccess" in support.reason


def test_advise_binding_takes_the_location_form_on_cuda13(fake_cudart):
    rt = cr.CudaRuntime(fake_cudart)
    assert rt.advise_api == "location"
    before = rt.lib.fake_calls()
    rt.advise(0x1000, 4096, cr.ADVISE_SET_PREFERRED_LOCATION, 0)
    rt.advise(0x1000, 4096, cr.ADVISE_SET_ACCESSED_BY, None)
    assert rt.lib.fake_calls() == before + 2
    with pytest.raises(cr.CudaError, match="cudaMemAdvise"):
        rt.advise(0x1000, 4096, 99, 0)


def _ctx(tmp_path, monkeypatch, fake_cudart):
    real = cr.CudaRuntime
    monkeypatch.setattr(allocation.cr, "CudaRuntime", lambda: real(fake_cudart))
    torch = pytest.importorskip("torch")
    env = Env(target="cuda", torch=torch, device=0, gpu_name="Fake GPU", host=HostBackend())
    rec = Recorder(tmp_path / "run", identity={"family": "membench"})
    return allocation._Ctx(env, Plan((1,), 1, 0, 1 << 20), rec, False), rec


def test_membench_system_skips_without_pageable_access(tmp_path, monkeypatch, fake_cudart):
    _attrs(monkeypatch, 0)
    ctx, rec = _ctx(tmp_path, monkeypatch, fake_cudart)
    with pytest.raises(SkipRun, match="pageableMemoryAccess"):
        allocation._prepare_system(ctx)
    assert rec.tags["system_memory.pageable_memory_access"] == "false"


def test_membench_system_prepares_where_pageable_access(tmp_path, monkeypatch, fake_cudart):
    _attrs(monkeypatch, 1, 1)
    ctx, rec = _ctx(tmp_path, monkeypatch, fake_cudart)
    rt = allocation._prepare_system(ctx)
    assert rt.path == fake_cudart
    assert rec.tags["system_memory.mechanism"] == "ATS (host page tables)"


def _membench_spec(memory: str, kind: str):
    return fake_run(MembenchParams(test="alloc", kind=kind, sizes_mb=(1,), repeats=1, warmup=0),
                    memory=memory)


def test_membench_system_on_a_cpu_node_skips(tmp_path):
    rec = Recorder(tmp_path / "run", identity={"family": "membench"})
    with pytest.raises(SkipRun, match="CUDA device"):
        workload.run(_membench_spec("system", "system"), rec, use_torch=False)


@pytest.mark.parametrize("memory,kind", [("system", "host"), ("device", "system")])
def test_membench_system_knob_and_kind_go_together(memory, kind):
    with pytest.raises(Contradiction, match="kind: system goes with memory: system"):
        membench_check(Knobs(memory=memory), MembenchParams(test="alloc", kind=kind))


def test_database_system_skips_without_pageable_access(tmp_path, monkeypatch, fake_cudart):
    _attrs(monkeypatch, 0)
    monkeypatch.setattr(db_workload, "CudaRuntime", lambda: cr.CudaRuntime(fake_cudart))
    rec = Recorder(tmp_path / "run", identity={"family": "database"})
    with pytest.raises(SkipRun, match="placement system: .*pageableMemoryAccess"):
        db_workload.check_system_memory(SimpleNamespace(index=0), rec)
    assert rec.tags["system_memory.pageable_memory_access"] == "false"
    _attrs(monkeypatch, 1, 0)
    db_workload.check_system_memory(SimpleNamespace(index=0), rec)  # HMM: allowed
    assert rec.tags["system_memory.mechanism"] == "HMM"


@pytest.mark.parametrize("memory,placement", [("system", "zero-copy"), ("device", "system")])
def test_database_system_knob_and_placement_go_together(memory, placement):
    with pytest.raises(Contradiction, match="memory: system goes with placement: system"):
        database_check(Knobs(memory=memory), DatabaseParams(placement=placement))
