"""A short, stable machine name from a node's fingerprint: ``h200-141g-pcie5-x86_64``.

Why: two nodes of one kind must compare as one machine (hostnames differ, the kind does not),
and a name is what references (``configs/references/<machine>.yaml``) and machine descriptions
(``configs/machines/<machine>.yaml``) are filed under. The parts are the GPU model, its memory
as sold (the nearest marketed capacity: 143771 MiB reads 141 GB), the host link and the CPU
architecture; a run that saw several GPUs is named with their count first
(``4xh200-141g-pcie5-x86_64``): collectives, tensor-parallel serving and sharded fine-tuning are
figures of the GPU set, and a one-GPU reference must not judge them. A site may override the
name (``machine:`` in its file).
"""

from __future__ import annotations

import re
from typing import Any, Mapping

#: GPU memory capacities as sold (GB); a measured GiB figure within 5 % snaps to the nearest.
MARKETED_GB: tuple[int, ...] = (16, 24, 32, 40, 48, 80, 94, 96, 120, 141, 144, 188, 192)
_SNAP_TOLERANCE = 0.05
#: words in GPU names that say nothing about the kind
_NOISE = {"nvidia", "tesla", "geforce", "quadro"}
#: words that follow the model and name a different product (H100 PCIe is not H100 SXM)
_FORM_FACTORS = {"pcie", "nvl", "sxm", "sxm4", "sxm5"}


def gpu_short(name: str) -> str:
    """``NVIDIA H100 80GB HBM3`` -> ``h100``; ``NVIDIA H100 PCIe`` -> ``h100pcie``;
    ``NVIDIA GH200 480GB`` -> ``gh200``; ``NVIDIA GeForce RTX 4090`` -> ``rtx4090``."""
    words = [w for w in re.split(r"[\s_-]+", name.strip()) if w and w.lower() not in _NOISE]
    if not words:
        return "gpu"
    out = words[0].lower()
    rest = words[1:]
    if out == "rtx" and rest:
        out, rest = out + rest[0].lower(), rest[1:]
    for word in rest:
        if word.lower() in _FORM_FACTORS:
            out += word.lower()
    return re.sub(r"[^a-z0-9]", "", out) or "gpu"


def memory_tag(gib: float | None) -> str | None:
    """``140.4`` (GiB, as nvidia-smi counts) -> ``141g`` (the marketed GB it is sold as)."""
    if not gib:
        return None
    best = min(MARKETED_GB, key=lambda gb: abs(gib - gb) / gb)
    if abs(gib - best) / best <= _SNAP_TOLERANCE:
        return f"{best}g"
    return f"{round(gib)}g"


def link_tag(host_link: str | None) -> str | None:
    """``PCIe Gen5 x16`` -> ``pcie5``; ``PCIe Gen4 x8`` -> ``pcie4x8``; ``NVLink-C2C`` -> ``c2c``."""
    if not host_link:
        return None
    if "c2c" in host_link.lower():
        return "c2c"
    m = re.search(r"gen\s*(\d+)", host_link, re.IGNORECASE)
    w = re.search(r"x(\d+)", host_link)
    tag = "pcie" + (m.group(1) if m else "")
    if w and w.group(1) != "16":
        tag += "x" + w.group(1)
    return tag


def machine_name(hardware: Mapping[str, Any] | None, override: str | None = None) -> str:
    """The machine name of a fingerprint (``hardware.json``); ``override`` (the site's
    ``machine:``) wins. A node without a GPU is ``cpu-<arch>``; an empty fingerprint
    ``unknown``."""
    if override:
        return override
    hw = hardware or {}
    arch = str(hw.get("cpu_arch") or "").lower() or None
    if not hw:
        return "unknown"
    if not hw.get("gpu_count") or not hw.get("gpu_model"):
        return f"cpu-{arch or 'unknown'}"
    count = int(hw.get("gpu_count") or 0)
    gpu = gpu_short(str(hw["gpu_model"]))
    parts = [f"{count}x{gpu}" if count > 1 else gpu, memory_tag(hw.get("gpu_memory_gb")),
             link_tag(hw.get("host_link")), arch]
    return "-".join(p for p in parts if p)


def split_gpu_count(name: str) -> tuple[int, str]:
    """``4xh200-141g-pcie5-x86_64`` -> ``(4, "h200-141g-pcie5-x86_64")``; a name without a
    count -> ``(1, name)``."""
    m = re.fullmatch(r"(\d+)x(.+)", name)
    if m and int(m.group(1)) > 1:
        return int(m.group(1)), m.group(2)
    return 1, name
