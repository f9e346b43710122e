"""hopperlab.node.hardware: the node fingerprint and its pure parsers."""

from __future__ import annotations

import os
import stat
import sys

import pytest

from hopperlab.node import hardware

KEYS = {
    "hostname": str, "cpu_model": (str, type(None)), "cpu_arch": (str, type(None)),
    "cpu_cores": (int, type(None)), "cpu_sockets": (int, type(None)),
    "mem_total_gb": (float, type(None)), "gpu_count": int, "gpu_model": (str, type(None)),
    "gpu_memory_gb": (float, type(None)), "driver": (str, type(None)),
    "cuda_runtime": (str, type(None)), "torch_version": (str, type(None)),
    "host_link": (str, type(None)), "is_grace_hopper": bool,
}

# Captured on the lent H200 on 2026-11-22 (benchmarks/membench_gpu.sh's nvidia-smi.txt), with
# the query NVIDIA_SMI_FIELDS + pcie.link.width.max:
CAPTURED_H200 = ("0, GPU-162128ca-17f6-ce5a-9c55-90c219e5fde5, NVIDIA H200, 143771 MiB, "
                 "580.159.04, 5, 5, 16, 16")
# Constructed, not captured: the same card with its link dropped to Gen1 at idle, and a GH200
# whose PCIe fields read [N/A].
H200_LINE = "0, GPU-5d3c8f02-5e2a-9d7b-1c44-0f6a2b9e7d11, NVIDIA H200, 143771 MiB, 580.159.04, 1, 5, 16"
GH200_LINE = "0, GPU-aaaa, NVIDIA GH200 480GB, 97871 MiB, 560.35.03, [N/A], [N/A], [N/A]"


def test_fingerprint_keys_and_types():
    fp = hardware.fingerprint()
    assert set(KEYS) <= set(fp)
    for key, types in KEYS.items():
        assert isinstance(fp[key], types), (key, fp[key])
    assert fp["cpu_cores"] >= 1
    assert fp["mem_total_gb"] is None or fp["mem_total_gb"] > 0
    assert fp["gpu_count"] >= 0
    import json

    json.dumps(fp)  # JSON-ready: hardware.json and MLflow tags


def test_fingerprint_on_this_cpu_machine():
    if hardware.shutil.which("nvidia-smi"):
        pytest.skip("this machine has nvidia-smi")
    fp = hardware.fingerprint()
    assert fp["gpu_count"] == 0 and fp["gpu_model"] is None and fp["host_link"] is None
    assert fp["is_grace_hopper"] is False
    try:
        import torch
    except ImportError:
        assert fp["torch_version"] is None
    else:
        assert fp["torch_version"] == torch.__version__
        assert fp["cuda_runtime"] == torch.version.cuda


def test_fingerprint_without_torch(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    monkeypatch.setattr(hardware, "_torch_folder", lambda: None)
    fp = hardware.fingerprint()
    assert fp["torch_version"] is None and fp["cuda_runtime"] is None


def test_torch_version_read_without_import(monkeypatch, tmp_path):
    pkg = tmp_path / "torch"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise ImportError('must not be imported')\n")
    (pkg / "version.py").write_text(
        "from typing import Optional\n__version__ = '2.11.0+cu130'\ndebug = False\n"
        "cuda: Optional[str] = '13.0'\ngit_version = 'abc'\nhip: Optional[str] = None\n")
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert hardware._torch_versions() == ("2.11.0+cu130", "13.0")


def test_parse_captured_nvidia_smi_line():
    fields = hardware.NVIDIA_SMI_FIELDS + ("pcie.link.width.max",)
    [row] = hardware.parse_nvidia_smi_csv(CAPTURED_H200 + "\n", fields)
    assert row == {
        "index": 0, "uuid": "GPU-162128ca-17f6-ce5a-9c55-90c219e5fde5", "name": "NVIDIA H200",
        "memory.total": 143771, "driver_version": "580.159.04", "pcie.link.gen.current": 5,
        "pcie.link.gen.max": 5, "pcie.link.width.current": 16, "pcie.link.width.max": 16,
    }
    assert hardware.pcie_link(row["pcie.link.gen.max"], row["pcie.link.gen.current"],
                              row["pcie.link.width.current"]) == "PCIe Gen5 x16"


def test_parse_nvidia_smi_csv():
    rows = hardware.parse_nvidia_smi_csv(H200_LINE + "\n\n" + GH200_LINE + "\n")
    assert rows[0] == {
        "index": 0, "uuid": "GPU-5d3c8f02-5e2a-9d7b-1c44-0f6a2b9e7d11", "name": "NVIDIA H200",
        "memory.total": 143771, "driver_version": "580.159.04", "pcie.link.gen.current": 1,
        "pcie.link.gen.max": 5, "pcie.link.width.current": 16,
    }
    assert rows[1]["pcie.link.gen.max"] is None and rows[1]["pcie.link.width.current"] is None
    with pytest.raises(ValueError, match="expected 8"):
        hardware.parse_nvidia_smi_csv("NVIDIA H200, 143771 MiB")
    short = hardware.parse_nvidia_smi_csv("NVIDIA H100 80GB HBM3, 81559 MiB",
                                          fields=("name", "memory.total"))
    assert short == [{"name": "NVIDIA H100 80GB HBM3", "memory.total": 81559}]


def test_pcie_link_reports_max_generation():
    assert hardware.pcie_link(5, 1, 16) == "PCIe Gen5 x16"  # idle link reads Gen1
    assert hardware.pcie_link(None, 4, 16) == "PCIe Gen4 x16"
    assert hardware.pcie_link(None, None, None) is None


@pytest.mark.parametrize("arch,name,cap,expected", [
    ("aarch64", "NVIDIA GH200 480GB", None, True),
    ("x86_64", "NVIDIA GH200 480GB", None, True),
    ("aarch64", "NVIDIA H100 96GB HBM3", None, True),
    ("aarch64", "NVIDIA H100", (9, 0), True),
    ("x86_64", "NVIDIA H100 80GB HBM3", (9, 0), False),
    ("x86_64", "NVIDIA H200", None, False),
    ("aarch64", "NVIDIA A100-SXM4-80GB", (8, 0), False),
    ("aarch64", None, None, False),
])
def test_is_grace_hopper(arch, name, cap, expected):
    assert hardware.is_grace_hopper(arch, name, cap) is expected


def test_visible_rows():
    rows = [{"index": 0, "uuid": "GPU-aaa"}, {"index": 1, "uuid": "GPU-bbb"}]
    assert hardware.visible_rows(rows, None) == rows
    assert hardware.visible_rows(rows, "1") == [rows[1]]
    assert hardware.visible_rows(rows, "GPU-bbb,0") == [rows[1], rows[0]]
    assert hardware.visible_rows(rows, "") == []


def _fake_nvidia_smi(tmp_path, lines):
    exe = tmp_path / "nvidia-smi"
    exe.write_text("#!/bin/sh\ncat <<'EOF'\n" + "\n".join(lines) + "\nEOF\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return tmp_path


def test_fingerprint_from_nvidia_smi(monkeypatch, tmp_path):
    line2 = H200_LINE.replace("0, GPU-5d3c", "1, GPU-9999")
    folder = _fake_nvidia_smi(tmp_path, [H200_LINE, line2])
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    fp = hardware.fingerprint()
    assert fp["gpu_count"] == 2
    assert fp["gpu_model"] == "NVIDIA H200"
    assert fp["gpu_memory_gb"] == pytest.approx(143771 / 1024, abs=0.1)
    assert fp["driver"] == "580.159.04"
    if fp["cpu_arch"] == "x86_64":
        assert fp["host_link"] == "PCIe Gen5 x16" and fp["is_grace_hopper"] is False
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert hardware.fingerprint()["gpu_count"] == 1


def test_fingerprint_grace_hopper_link(monkeypatch, tmp_path):
    folder = _fake_nvidia_smi(tmp_path, [GH200_LINE])
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    fp = hardware.fingerprint()
    assert fp["is_grace_hopper"] is True and fp["host_link"] == "NVLink-C2C"


def test_gpu_free_memory_bytes_without_gpu():
    free = hardware.gpu_free_memory_bytes()
    try:
        import torch
        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    if has_gpu:
        assert isinstance(free, int) and free > 0
    else:
        assert free is None
