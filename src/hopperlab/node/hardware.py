"""What machine a run landed on: CPU, memory, GPUs, driver, host link, Grace Hopper or not.

``fingerprint()`` runs inside every job (``hardware.json``) and must stay cheap and work
everywhere: no GPU, no torch, no ``nvidia-smi``. It never imports torch or creates a CUDA
context just to fingerprint. Memory capacities are GiB (2**30 bytes). Where each fact comes
from, and why the PCIe generation is the maximum: docs/node.md.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

#: Fields asked of ``nvidia-smi --query-gpu`` (and the keys of ``parse_nvidia_smi_csv``'s rows).
NVIDIA_SMI_FIELDS: tuple[str, ...] = (
    "index", "uuid", "name", "memory.total", "driver_version",
    "pcie.link.gen.current", "pcie.link.gen.max", "pcie.link.width.current",
)
NVIDIA_SMI_TIMEOUT_S = 5.0

#: GPU names of the Hopper generation (compute capability 9.0).
_HOPPER_NAME = re.compile(r"\b(GH200|GH100|H100|H200|H800|H20)\b", re.IGNORECASE)
#: Arm "CPU part" codes of /proc/cpuinfo -> core names (Grace is Neoverse-V2).
_ARM_PARTS = {
    "0xd0c": "Neoverse-N1", "0xd40": "Neoverse-V1", "0xd49": "Neoverse-N2",
    "0xd4f": "Neoverse-V2", "0xd8e": "Neoverse-N3", "0xd84": "Neoverse-V3",
}
_NA = {"", "[n/a]", "n/a", "[not supported]", "not supported", "[unknown error]"}


# --------------------------------------------------------------------------- pure helpers
def _na(value: str) -> str | None:
    value = value.strip()
    return None if value.lower() in _NA else value


def _int_or_none(value: str | None) -> int | None:
    if value is None:
        return None
    m = re.match(r"\s*(\d+)", value)
    return int(m.group(1)) if m else None


def parse_nvidia_smi_csv(text: str, fields: Sequence[str] = NVIDIA_SMI_FIELDS) -> list[dict[str, Any]]:
    """Rows of ``nvidia-smi --query-gpu=<fields> --format=csv,noheader`` as dicts.

    Values are typed: ``memory.total`` in MiB (int), link generations and width as ints,
    ``index`` as int; ``[N/A]`` and ``[Not Supported]`` become None. Blank lines are skipped;
    a line with the wrong number of fields raises ValueError.
    """
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != len(fields):
            raise ValueError(f"nvidia-smi line has {len(parts)} fields, expected {len(fields)}: "
                             f"{line!r}")
        row: dict[str, Any] = {}
        for name, raw in zip(fields, parts):
            value = _na(raw)
            if name in ("memory.total", "index") or name.startswith("pcie.link."):
                row[name] = _int_or_none(value)  # "81559 MiB" -> 81559, "16" -> 16
            else:
                row[name] = value
        rows.append(row)
    return rows


def pcie_link(gen_max: int | None, gen_current: int | None, width: int | None) -> str | None:
    """``"PCIe Gen5 x16"`` from the link fields; the max generation (idle links read low)."""
    gen = gen_max or gen_current
    if gen is None and width is None:
        return None
    text = "PCIe"
    if gen is not None:
        text += f" Gen{gen}"
    if width is not None:
        text += f" x{width}"
    return text


def is_hopper_gpu(name: str | None, capability: tuple[int, int] | None = None) -> bool:
    if capability is not None:
        return tuple(capability) == (9, 0)
    return bool(name and _HOPPER_NAME.search(name))


def is_grace_hopper(cpu_arch: str | None, gpu_name: str | None,
                    capability: tuple[int, int] | None = None) -> bool:
    """A Grace Hopper superchip: an Arm host with a Hopper GPU (coherent NVLink-C2C), or a GPU
    named GH200."""
    if gpu_name and re.search(r"\bGH200\b", gpu_name, re.IGNORECASE):
        return True
    arm = (cpu_arch or "").lower() in ("aarch64", "arm64")
    return arm and is_hopper_gpu(gpu_name, capability)


def visible_rows(rows: list[dict[str, Any]], visible: str | None) -> list[dict[str, Any]]:
    """The ``nvidia-smi`` rows that ``CUDA_VISIBLE_DEVICES`` (indices or UUIDs) leaves visible."""
    if visible is None:
        return rows
    picked = []
    for token in (t.strip() for t in visible.split(",")):
        if not token:
            continue
        if token.isdigit():
            picked += [r for r in rows if r.get("index") == int(token)]
        else:
            picked += [r for r in rows if r.get("uuid") and str(r["uuid"]).startswith(token)]
    return picked


# --------------------------------------------------------------------------- probes
def _read(path: str) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""


def _cpu() -> dict[str, Any]:
    info = _read("/proc/cpuinfo")
    model = None
    m = re.search(r"^model name\s*:\s*(.+)$", info, re.MULTILINE)
    if m:
        model = m.group(1).strip()
    else:
        part = re.search(r"^CPU part\s*:\s*(0x[0-9a-fA-F]+)", info, re.MULTILINE)
        if part:
            model = _ARM_PARTS.get(part.group(1).lower(), f"Arm CPU part {part.group(1)}")
    model = model or platform.processor() or None
    sockets: int | None = None
    ids = set(re.findall(r"^physical id\s*:\s*(\d+)", info, re.MULTILINE))
    if ids:
        sockets = len(ids)
    else:
        pkgs = set()
        for p in Path("/sys/devices/system/cpu").glob("cpu[0-9]*/topology/physical_package_id"):
            v = _read(str(p)).strip()
            if v and v != "-1":
                pkgs.add(v)
        sockets = len(pkgs) or None
    return {"cpu_model": model, "cpu_signature": cpu_signature(info),
            "cpu_arch": platform.machine() or None,
            "cpu_cores": os.cpu_count(), "cpu_sockets": sockets}


def cpu_signature(cpuinfo: str) -> str | None:
    """Vendor, family, model and stepping of the first CPU (x86), or implementer, part and
    variant (Arm): it tells apart hosts whose model name a hypervisor reduced to
    "Intel(R) Xeon(R) Processor" (two lent H100 hosts of 2026-11-26 differed by 38 % in
    the recommender's CPU figures under that one name)."""
    def field(name: str) -> str | None:
        m = re.search(rf"^{name}\s*:\s*(.+)$", cpuinfo, re.MULTILINE)
        return m.group(1).strip() if m else None

    vendor, family, model = field("vendor_id"), field("cpu family"), field("model")
    if vendor and family and model:
        return f"{vendor} {family}-{model}-{field('stepping') or '?'}"
    implementer, part = field("CPU implementer"), field("CPU part")
    if implementer and part:
        return f"arm {implementer}-{part}-{field('CPU variant') or '?'}"
    return None


def host_cpu(hardware: Mapping[str, Any]) -> str | None:
    """The host CPU a run's CPU-driven figures are keyed by: the model name, with the
    signature when the fingerprint has one (None: no CPU recorded)."""
    model = hardware.get("cpu_model")
    if not model:
        return None
    sig = hardware.get("cpu_signature")
    return f"{model} [{sig}]" if sig else str(model)


def _mem_total_gb() -> float | None:
    m = re.search(r"^MemTotal:\s*(\d+)\s*kB", _read("/proc/meminfo"), re.MULTILINE)
    return round(int(m.group(1)) * 1024 / 2**30, 1) if m else None


def _torch_versions() -> tuple[str | None, str | None]:
    """torch's version and CUDA version, without importing torch when it is not loaded yet
    (``torch/version.py`` is read as text: importing torch costs about a second)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        version = getattr(torch, "__version__", None)
        return (str(version) if version else None,
                getattr(getattr(torch, "version", None), "cuda", None))
    folder = _torch_folder()
    if folder is None:
        return None, None
    text = _read(str(folder / "version.py"))
    ver = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", text, re.MULTILINE)
    cuda = re.search(r"^cuda\s*(?::[^=]*)?=\s*['\"]([^'\"]+)['\"]", text, re.MULTILINE)
    return (ver.group(1) if ver else None, cuda.group(1) if cuda else None)


def _torch_folder() -> Path | None:
    """Where ``import torch`` would find torch's package, found on ``sys.path`` without
    importing it (None: not installed)."""
    for entry in sys.path:
        folder = Path(entry or ".") / "torch"
        if (folder / "__init__.py").is_file():
            return folder
    return None


def _nvidia_smi() -> list[dict[str, Any]] | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run(
            [exe, f"--query-gpu={','.join(NVIDIA_SMI_FIELDS)}", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    try:
        return parse_nvidia_smi_csv(out.stdout)
    except ValueError:
        return None


def _torch_gpus(torch: Any) -> list[dict[str, Any]]:
    gpus = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        gpus.append({"name": props.name, "memory_gib": props.total_memory / 2**30,
                     "capability": (props.major, props.minor)})
    return gpus


def fingerprint() -> dict[str, Any]:
    """The node's CPU, memory, GPUs, driver, host link and software versions (JSON-ready)."""
    fp: dict[str, Any] = {"hostname": socket.gethostname()}
    fp.update(_cpu())
    fp["mem_total_gb"] = _mem_total_gb()
    torch_version, cuda_runtime = _torch_versions()

    gpus: list[dict[str, Any]] | None = None
    loaded = sys.modules.get("torch")
    if loaded is not None:
        try:
            if loaded.cuda.is_initialized():
                gpus = _torch_gpus(loaded)
        except Exception:  # noqa: BLE001 - a fingerprint never fails the job
            gpus = None
    smi = _nvidia_smi()
    smi_rows = visible_rows(smi, os.environ.get("CUDA_VISIBLE_DEVICES")) if smi else []
    if gpus is None and smi_rows:
        gpus = [{"name": r.get("name"),
                 "memory_gib": (r["memory.total"] / 1024) if r.get("memory.total") else None,
                 "capability": None} for r in smi_rows]
    if gpus is None and smi is None and torch_version is not None and cuda_runtime:
        try:
            import torch  # noqa: PLC0415 - last resort: no nvidia-smi on this node

            if torch.cuda.is_available():
                gpus = _torch_gpus(torch)
        except Exception:  # noqa: BLE001
            gpus = None
    gpus = gpus or []

    first = gpus[0] if gpus else {}
    fp["gpu_count"] = len(gpus)
    fp["gpu_model"] = first.get("name")
    mem = first.get("memory_gib")
    fp["gpu_memory_gb"] = round(mem, 1) if mem else None
    row = smi_rows[0] if smi_rows else {}
    fp["driver"] = row.get("driver_version")
    fp["cuda_runtime"] = cuda_runtime
    fp["torch_version"] = torch_version
    grace_hopper = bool(gpus) and is_grace_hopper(fp["cpu_arch"], fp["gpu_model"],
                                                  first.get("capability"))
    if grace_hopper:
        fp["host_link"] = "NVLink-C2C"
    else:
        fp["host_link"] = pcie_link(row.get("pcie.link.gen.max"), row.get("pcie.link.gen.current"),
                                    row.get("pcie.link.width.current")) if row else None
    fp["is_grace_hopper"] = grace_hopper
    return fp


def gpu_free_memory_bytes(device: int | None = None) -> int | None:
    """Free memory of a CUDA device in bytes (``torch.cuda.mem_get_info``), None without one.

    Imports torch (lazily): meant for GPU workloads, not for ``fingerprint``.
    """
    try:
        import torch  # noqa: PLC0415
    except ImportError:
        return None
    try:
        if not torch.cuda.is_available():
            return None
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    except Exception:  # noqa: BLE001 - no usable device is "unknown", not a crash
        return None


#: the GPU state the energy meter adds at the start and end of the workload (``gpu_state``:
#: ``{"start": [...], "end": [...]}``, one dict per GPU, None where NVML refused a reading)
GPU_STATE_KEYS = ("index", "uuid", "power_limit_w", "sm_clock_mhz", "mem_clock_mhz",
                  "temperature_c")


def gpu_state_line(fp: Mapping[str, Any]) -> str | None:
    """``power limit 700 W, SM 1980 MHz, 41->63 C`` of the first GPU (None: not recorded)."""
    state = fp.get("gpu_state") or {}
    start, end = (state.get("start") or [{}])[0], (state.get("end") or [{}])[0]
    if not start and not end:
        return None
    parts = []
    if (limit := start.get("power_limit_w") or end.get("power_limit_w")) is not None:
        parts.append(f"power limit {limit:g} W")
    if end.get("sm_clock_mhz") is not None:
        parts.append(f"SM {end['sm_clock_mhz']} MHz, memory {end.get('mem_clock_mhz')} MHz at end")
    if start.get("temperature_c") is not None or end.get("temperature_c") is not None:
        parts.append(f"{start.get('temperature_c')}->{end.get('temperature_c')} C")
    return ", ".join(parts) or None


def summary_line(fp: Mapping[str, Any]) -> str:
    """One line for logs: ``GPU x n (mem) on CPU, link, driver``."""
    gpu = f"{fp.get('gpu_model')} x{fp.get('gpu_count')}" if fp.get("gpu_count") else "no GPU"
    state = gpu_state_line(fp)
    return (f"{gpu}, {fp.get('gpu_memory_gb')} GiB; {fp.get('cpu_model')} ({fp.get('cpu_arch')}, "
            f"{fp.get('cpu_cores')} cores); link {fp.get('host_link')}; driver {fp.get('driver')}; "
            f"torch {fp.get('torch_version')} cuda {fp.get('cuda_runtime')}"
            + (f"; {state}" if state else ""))
