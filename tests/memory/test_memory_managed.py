"""The managed-memory allocator (hopperlab.memory.managed_allocator): the cap policy as pure
functions, and the C++ allocator itself compiled here against a stand-in CUDA header (host
malloc for managed memory) and driven the way PyTorch's pluggable allocator drives it."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from hopperlab.memory.managed_allocator import (
    ManagedAllocatorError, SOURCE, advice_flags, compile_command, managed_cap_bytes,
    oversubscription_allowed, round_block)

GiB = 1 << 30
FAKE = (Path(__file__).parents[1] / "memory_fake_cuda")


def test_cap_is_free_memory_minus_margin():
    assert managed_cap_bytes(70 * GiB, 80 * GiB, oversubscription=False) == 70 * GiB - int(80 * GiB * 0.03)
    assert managed_cap_bytes(10 * GiB, 16 * GiB, oversubscription=False) == 9 * GiB   # 1 GiB floor
    assert managed_cap_bytes(10 * GiB, 80 * GiB, oversubscription=False, margin_bytes=0) == 10 * GiB


def test_no_cap_where_oversubscription_is_allowed():
    assert managed_cap_bytes(1 * GiB, 96 * GiB, oversubscription=True) is None


def test_refuses_when_nothing_is_free():
    with pytest.raises(ManagedAllocatorError, match="margin"):
        managed_cap_bytes(GiB // 2, 80 * GiB, oversubscription=False)
    with pytest.raises(ValueError):
        managed_cap_bytes(90 * GiB, 80 * GiB, oversubscription=False)


@pytest.mark.parametrize("arch,gpu,site,allowed", [
    ("aarch64", "NVIDIA GH200 480GB", False, True),
    ("aarch64", "NVIDIA H100 96GB HBM3", False, True),     # Grace + H100: a Grace Hopper
    ("x86_64", "NVIDIA H100 80GB HBM3", False, False),
    ("x86_64", "NVIDIA H200", False, False),
    ("x86_64", "NVIDIA H200", True, True),                 # the site says so
    ("aarch64", "NVIDIA A100-SXM4-80GB", False, False),
])
def test_oversubscription_only_on_grace_hopper_or_site_flag(arch, gpu, site, allowed):
    assert oversubscription_allowed(arch, gpu, site) is allowed


def test_round_block_and_advice():
    assert round_block(1) == 512 and round_block(513) == 1024
    assert round_block(1 << 20) == 2 << 20 and round_block(3 << 20) == 4 << 20
    assert advice_flags("none") == 0 and advice_flags("both") == 3
    with pytest.raises(ValueError):
        advice_flags("everywhere")


def test_install_refuses_without_cuda():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this checks the refusal on a machine without CUDA")
    from hopperlab.memory.managed_allocator import install_managed_allocator

    with pytest.raises(ManagedAllocatorError, match="CUDA device"):
        install_managed_allocator()


def _driver(tmp_path: Path) -> dict[str, str]:
    torch = pytest.importorskip("torch")
    from torch.utils.cpp_extension import include_paths

    if shutil.which("g++") is None:
        pytest.skip("no g++")
    lib = Path(torch.__file__).parent / "lib"
    exe = tmp_path / "driver"
    cmd = compile_command(SOURCE, exe, include_dirs=[str(FAKE), *include_paths()],
                          link=[f"-L{lib}", "-lc10", f"-Wl,-rpath,{lib}"],
                          cxx11_abi=bool(torch._C._GLIBCXX_USE_CXX11_ABI))
    cmd = [c for c in cmd if c not in ("-shared", "-fPIC")] + [str(FAKE / "driver.cpp")]
    cmd = [("-O0" if c == "-O2" else c) for c in cmd]
    build = subprocess.run(cmd, capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[-3000:]
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, run.stderr
    facts = {}
    for line in run.stdout.splitlines():
        tag, _, rest = line.partition(" ")
        facts[tag] = rest
    return facts


def _field(text: str, name: str) -> int:
    return int(re.search(rf"{name}=(\d+)", text).group(1))


@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
def test_cpp_allocator_caches_caps_and_counts(tmp_path):
    f = _driver(tmp_path)
    MiB = 1 << 20
    assert _field(f["two"], "reserved") == 4 * MiB + 512          # rounded blocks
    assert f["advice_calls"] == "6"                                # 2 advices + prefetch, 2 blocks
    assert f["reused"] == "1"                                      # same stream, same size class
    assert _field(f["reuse"], "calls") == 2                        # no new cudaMallocManaged
    assert f["other_stream_reused"] == "0"                         # never across streams
    assert f["refused"] == "1" and f["message_has_cuda_oom"] == "1"
    assert _field(f["after_refusal"], "refusals") == 1
    assert _field(f["after_refusal"], "reserved") <= 8 * MiB       # the cap held
    assert _field(f["end"], "in_use") == 0
    assert _field(f["end"], "peak_reserved") == 4 * MiB + 512
