"""Can GPU kernels read and write plain ``malloc``/``mmap`` memory on this device?

Grace Hopper (coherent NVLink-C2C, address translation services) and x86 with the kernel's
heterogeneous memory management (HMM) say so through ``cudaDevAttrPageableMemoryAccess``; every
other node would fault on the first access. The families that measure system-allocated memory
ask here first and skip the run with ``reason`` where it is missing, before allocating anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hopperlab.cuda import runtime as cr


@dataclass(frozen=True)
class SystemMemorySupport:
    """What the device reports about system-allocated memory."""

    pageable_memory_access: bool
    #: True: ATS (the GPU walks the host's page tables: Grace Hopper); False: HMM (x86)
    uses_host_page_tables: bool
    device: int

    @property
    def mechanism(self) -> str:
        if not self.pageable_memory_access:
            return "none"
        return "ATS (host page tables)" if self.uses_host_page_tables else "HMM"

    @property
    def reason(self) -> str | None:
        """Why system-allocated memory cannot be used here (None: it can)."""
        if self.pageable_memory_access:
            return None
        return (f"device {self.device} does not report pageableMemoryAccess "
                f"(cudaDevAttrPageableMemoryAccess = 0): GPU kernels cannot read plain "
                f"malloc/mmap memory on this node (Grace Hopper, or x86 with HMM, can)")


def system_memory_support(rt: Any, device: int) -> SystemMemorySupport:
    """Ask the runtime ``rt`` (a ``cuda.runtime.CudaRuntime``) about ``device``."""
    pageable = bool(rt.device_attribute(cr.ATTR_PAGEABLE_MEMORY_ACCESS, device))
    ats = False
    if pageable:
        ats = bool(rt.device_attribute(cr.ATTR_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES,
                                       device))
    return SystemMemorySupport(pageable, ats, device)


def system_memory_tags(support: SystemMemorySupport) -> dict[str, str]:
    """The tags every run that asked records (one wording across families)."""
    return {"system_memory.pageable_memory_access": str(support.pageable_memory_access).lower(),
            "system_memory.mechanism": support.mechanism}
