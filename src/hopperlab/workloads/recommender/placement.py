"""Where the pipeline's memory lives: pinned or pageable staging, managed-memory feature tables.

``memory: managed`` puts the packed feature tables in CUDA managed memory (cudaMallocManaged via
ctypes, ``hopperlab.cuda.runtime``): the CPU writes them once, then the GPU gathers a query's rows
from them directly and pages migrate on demand; no explicit host->device copy of the batch.
The request is checked against the GPU's free memory first (``managed_bytes_allowed``: at most
half of it, unless Grace Hopper or the site allows oversubscription); over it, the run is skipped.
"""

from __future__ import annotations

import math
import platform
from typing import Any

import numpy as np
import torch

from hopperlab.core.rundir import SkipRun
from hopperlab.core.stats import GB
from hopperlab.cuda import runtime as cr
from hopperlab.cuda.managed_policy import managed_bytes_allowed
from hopperlab.memory.pinned import host_buffer as pinned_host_buffer
from hopperlab.node import hardware


def host_buffer(shape: tuple[int, ...], dtype: torch.dtype, pinned: bool) -> torch.Tensor:
    """A host tensor for staging; page-locked when ``pinned`` (needs CUDA), of its exact size
    (``memory.pinned``: PyTorch's pinned allocator rounds up to a power of two)."""
    nbytes = math.prod(shape) * dtype.itemsize
    buf = pinned_host_buffer(nbytes, pin=pinned and torch.cuda.is_available())
    return buf.view(dtype).view(shape)


class ManagedTables:
    """Numpy tables copied into managed memory, exposed as CUDA tensors; ``close()`` frees them."""

    def __init__(self, tables: dict[str, np.ndarray], *, allow_oversubscription: bool) -> None:
        try:
            self.rt = cr.CudaRuntime()
        except (cr.CudaError, OSError, AttributeError) as exc:
            raise SkipRun(f"memory=managed needs the CUDA runtime library: {exc}") from None
        device = torch.cuda.current_device()
        if not self.rt.device_attribute(cr.ATTR_MANAGED_MEMORY, device):
            raise SkipRun(f"memory=managed: device {device} does not support cudaMallocManaged")
        need = sum(a.nbytes for a in tables.values())
        free, _total = torch.cuda.mem_get_info(device)
        grace = hardware.is_grace_hopper(platform.machine(), torch.cuda.get_device_name(device))
        if not managed_bytes_allowed(need, free, grace, allow_oversubscription):
            raise SkipRun(f"memory=managed: the feature tables need {need / GB:.2f} GB of managed "
                          f"memory, over half of the GPU's free {free / GB:.2f} GB on a node that "
                          f"is not Grace Hopper (site allow_oversubscription is false)")
        self.nbytes = need
        self.concurrent = bool(self.rt.device_attribute(cr.ATTR_CONCURRENT_MANAGED_ACCESS, device))
        self._ptrs: list[int] = []
        self.tensors: dict[str, torch.Tensor] = {}
        try:
            for name, array in tables.items():
                array = np.ascontiguousarray(array)
                ptr = self.rt.malloc_managed(max(array.nbytes, 1))
                self._ptrs.append(ptr)
                cr.host_view(ptr, array.nbytes)[:] = array.view(np.uint8).reshape(-1)
                raw = torch.as_tensor(cr.CudaArray(ptr, array.nbytes), device="cuda")
                self.tensors[name] = raw.view(_torch_dtype(array.dtype)).view(array.shape)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        self.tensors.clear()
        if self._ptrs:
            self.rt.synchronize()
        while self._ptrs:
            self.rt.free(self._ptrs.pop())


def _torch_dtype(dtype: Any) -> torch.dtype:
    return {np.dtype(np.int32): torch.int32, np.dtype(np.float32): torch.float32,
            np.dtype(np.int64): torch.int64}[np.dtype(dtype)]
