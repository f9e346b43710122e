"""The GPUs' energy counters, power and state through NVML (``nvidia-ml-py``, module ``pynvml``).

``pynvml`` is imported inside functions: it is in the GPU image and an optional extra
(``pip install hopperlab[energy]``), never needed on a login node. A node without it, or whose
driver refuses a reading, gives ``None`` for that reading with the reason kept; nothing here
raises into a run.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Sequence

log = logging.getLogger(__name__)

#: NVML field id of the instantaneous board power (mW), newer drivers; else the 1 s average
FI_POWER_INSTANT = 186
NOT_INSTALLED = "nvidia-ml-py (pynvml) is not installed"
#: what a GPU node without the package is told (issue 49: a user's first GPU runs said
#: "energy not measured" and no page said why or how to fix it)
INSTALL_HINT = "pip install 'hopperlab[energy]' (or nvidia-ml-py) to measure energy"
#: where the NVIDIA driver shows its GPUs, without NVML
DRIVER_GPUS = Path("/proc/driver/nvidia/gpus")
_hinted = False


def gpu_present(driver_gpus: Path = DRIVER_GPUS) -> bool:
    """Whether the NVIDIA driver lists a GPU on this node (its /proc folder), NVML or not."""
    try:
        return any(driver_gpus.iterdir())
    except OSError:
        return False


def missing_reason(driver_gpus: Path = DRIVER_GPUS) -> str:
    """Why energy is not measured when pynvml cannot be imported: on a node with a GPU, with
    the install line, logged once per process (the first time); elsewhere (a CPU node, a
    login node) the plain reason, no advice nobody needs."""
    global _hinted
    if not gpu_present(driver_gpus):
        return NOT_INSTALLED
    if not _hinted:
        _hinted = True
        log.warning("energy not measured: %s on a GPU node: %s", NOT_INSTALLED, INSTALL_HINT)
    return f"{NOT_INSTALLED} on a GPU node: {INSTALL_HINT}"


def visible(all_uuids: Sequence[str], env: str | None) -> list[int]:
    """Indices (NVML order) of the GPUs ``CUDA_VISIBLE_DEVICES`` leaves visible: indices or
    UUID prefixes; unset: all. An index is NVML's only where CUDA orders by PCI bus too (the
    usual case on a homogeneous node); a rank's own GPU is matched by UUID later."""
    if env is None:
        return list(range(len(all_uuids)))
    out: list[int] = []
    for token in (t.strip() for t in env.split(",")):
        if not token:
            continue
        if token.isdigit():
            if int(token) < len(all_uuids):
                out.append(int(token))
            continue
        out += [i for i, u in enumerate(all_uuids) if u.startswith(token)]
    return out


class NvmlGpus:
    """Handles of this process's GPUs; every reading is a value or None (never raises)."""

    def __init__(self, nvml: Any, handles: list[Any], indices: list[int], uuids: list[str]):
        self._nvml = nvml
        self.handles = handles
        self.indices = indices
        self.uuids = uuids
        self.power_kind = "instant"
        self.errors: dict[str, str] = {}

    @classmethod
    def open(cls) -> tuple["NvmlGpus | None", str | None]:
        """The visible GPUs, or None and why (no pynvml, no driver, no GPU)."""
        try:
            import pynvml  # noqa: PLC0415 - optional, GPU image only
        except ImportError:
            return None, missing_reason()
        try:
            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
            all_handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            uuids = [_text(pynvml.nvmlDeviceGetUUID(h)) for h in all_handles]
        except Exception as exc:  # noqa: BLE001 - NVMLError_* of every kind
            return None, f"NVML unavailable: {type(exc).__name__}: {exc}"
        picked = visible(uuids, os.environ.get("CUDA_VISIBLE_DEVICES"))
        if not picked:
            return None, "NVML sees no GPU visible to this process"
        return cls(pynvml, [all_handles[i] for i in picked], picked,
                   [uuids[i] for i in picked]), None

    def _call(self, what: str, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as exc:  # noqa: BLE001
            self.errors.setdefault(what, f"{type(exc).__name__}: {exc}")
            return None

    def energy_mj(self, i: int) -> int | None:
        """The counter as an int: near 2**64 a float would lose the millijoules."""
        value = self._call("energy", self._nvml.nvmlDeviceGetTotalEnergyConsumption,
                           self.handles[i])
        return None if value is None else int(value)

    def power_w(self, i: int) -> float | None:
        if self.power_kind == "instant":
            field = getattr(self._nvml, "NVML_FI_DEV_POWER_INSTANT", FI_POWER_INSTANT)
            values = self._call("power instant", self._nvml.nvmlDeviceGetFieldValues,
                                self.handles[i], [field])
            if values and getattr(values[0], "nvmlReturn", 1) == 0:
                return float(values[0].value.uiVal) / 1e3
            self.power_kind = "average"  # this driver has no instant power: 1 s average
        value = self._call("power", self._nvml.nvmlDeviceGetPowerUsage, self.handles[i])
        return None if value is None else float(value) / 1e3

    def state(self, i: int) -> dict[str, Any]:
        """Power limit, SM and memory clocks, temperature (None where refused)."""
        n, h = self._nvml, self.handles[i]
        limit = self._call("power limit", n.nvmlDeviceGetEnforcedPowerLimit, h)
        return {"index": self.indices[i], "uuid": self.uuids[i],
                "power_limit_w": None if limit is None else limit / 1e3,
                "sm_clock_mhz": self._call("sm clock", n.nvmlDeviceGetClockInfo, h,
                                           getattr(n, "NVML_CLOCK_SM", 1)),
                "mem_clock_mhz": self._call("mem clock", n.nvmlDeviceGetClockInfo, h,
                                            getattr(n, "NVML_CLOCK_MEM", 2)),
                "temperature_c": self._call("temperature", n.nvmlDeviceGetTemperature, h,
                                            getattr(n, "NVML_TEMPERATURE_GPU", 0))}

    def keep(self, uuids: Sequence[str]) -> None:
        """Keep only the GPUs whose UUID ends with one of ``uuids`` (torch's lack "GPU-")."""
        pick = [i for i, u in enumerate(self.uuids) if any(u.endswith(x) for x in uuids)]
        if pick:
            self.handles = [self.handles[i] for i in pick]
            self.indices = [self.indices[i] for i in pick]
            self.uuids = [self.uuids[i] for i in pick]

    def close(self) -> None:
        self._call("shutdown", self._nvml.nvmlShutdown)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def torch_device_uuids(all_devices: bool) -> list[str] | None:
    """UUIDs of the CUDA devices this process used, when torch has CUDA initialised: its
    current device (a rank), or every device its caching allocator holds memory on (a run of
    one process: on a node whose GPUs are all visible, the idle ones are not the run's).
    None otherwise (the meter never initialises CUDA itself)."""
    import sys

    torch = sys.modules.get("torch")
    try:
        if torch is None or not torch.cuda.is_initialized():
            return None
        current = torch.cuda.current_device()
        devices = [current]
        if all_devices:
            devices = [d for d in range(torch.cuda.device_count())
                       if torch.cuda.memory_reserved(d) > 0] or devices
        return [str(torch.cuda.get_device_properties(d).uuid) for d in devices]
    except Exception:  # noqa: BLE001
        return None
