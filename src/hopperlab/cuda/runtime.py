"""The few CUDA runtime calls torch does not expose, through ctypes on torch's own libcudart.

Used for managed memory (``cudaMallocManaged``, ``cudaMemPrefetchAsync``), device attributes and,
where torch has no way to empty its pinned-memory cache, ``cudaHostAlloc``. Import this only
after ``torch.cuda`` is initialised: the library is found among the ones already mapped into
the process, so these calls share torch's CUDA context.

``cudaMemPrefetchAsync`` changed its signature in CUDA 13 (a ``cudaMemLocation`` and flags in
place of a device ordinal; CUDA 12.2+ has that form as ``cudaMemPrefetchAsync_v2``): the right
one is picked from ``cudaRuntimeGetVersion``.
"""

from __future__ import annotations

import ctypes
import glob
import os
import re
import sys
from contextlib import contextmanager
from typing import Iterator

from hopperlab.core.errors import NodeError

CUDA_MEM_ATTACH_GLOBAL = 1
CUDA_CPU_DEVICE_ID = -1
MEM_LOCATION_DEVICE = 1
MEM_LOCATION_HOST = 2

#: cudaDeviceAttr values used here (stable since CUDA 8).
ATTR_MANAGED_MEMORY = 83
ATTR_PAGEABLE_MEMORY_ACCESS = 88
ATTR_CONCURRENT_MANAGED_ACCESS = 89
#: ATS (Grace Hopper's coherent C2C) rather than HMM (x86 with the kernel's heterogeneous
#: memory management): the GPU walks the host's own page tables
ATTR_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES = 100

#: cudaMemoryAdvise values (stable since CUDA 8)
ADVISE_SET_PREFERRED_LOCATION = 3
ADVISE_SET_ACCESSED_BY = 5

_CUDART = re.compile(r"libcudart(-[0-9a-f]+)?\.so(\.\d+)*$")


class CudaError(NodeError):
    pass


class CudaMemLocation(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


def loaded_cudart_paths(maps_text: str) -> list[str]:
    """Paths of libcudart mapped into a process, from the text of ``/proc/<pid>/maps``."""
    paths: list[str] = []
    for line in maps_text.splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6:
            path = parts[5].strip()
            if _CUDART.search(os.path.basename(path)) and path not in paths:
                paths.append(path)
    return paths


def find_cudart() -> str:
    """The libcudart this process uses: one already mapped (torch's), else a loadable one."""
    try:
        with open("/proc/self/maps") as fh:
            mapped = loaded_cudart_paths(fh.read())
    except OSError:
        mapped = []
    if mapped:
        return mapped[0]
    candidates = ["libcudart.so.13", "libcudart.so.12", "libcudart.so"]
    for prefix in sys.path:
        for sub in ("nvidia/cu13/lib", "nvidia/cuda_runtime/lib", "torch/lib"):
            candidates += sorted(glob.glob(os.path.join(prefix, sub, "libcudart*.so*")))
    for name in candidates:
        try:
            ctypes.CDLL(name)
            return name
        except OSError:
            continue
    raise CudaError("the CUDA runtime library (libcudart) is neither loaded in this process nor "
                    "loadable")


class CudaRuntime:
    """A thin, checked ctypes binding of the calls membench needs."""

    def __init__(self, path: str | None = None) -> None:
        self.path = path or find_cudart()
        self.lib = ctypes.CDLL(self.path)
        lib = self.lib
        lib.cudaGetErrorString.restype = ctypes.c_char_p
        lib.cudaGetErrorString.argtypes = [ctypes.c_int]
        lib.cudaRuntimeGetVersion.argtypes = [ctypes.POINTER(ctypes.c_int)]
        lib.cudaMallocManaged.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t,
                                          ctypes.c_uint]
        lib.cudaFree.argtypes = [ctypes.c_void_p]
        lib.cudaHostAlloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t,
                                      ctypes.c_uint]
        lib.cudaFreeHost.argtypes = [ctypes.c_void_p]
        lib.cudaDeviceGetAttribute.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int,
                                               ctypes.c_int]
        lib.cudaDeviceSynchronize.argtypes = []
        for fn in ("cudaGetErrorString", "cudaRuntimeGetVersion", "cudaMallocManaged", "cudaFree",
                   "cudaHostAlloc", "cudaFreeHost", "cudaDeviceGetAttribute",
                   "cudaDeviceSynchronize"):
            if fn != "cudaGetErrorString":
                getattr(lib, fn).restype = ctypes.c_int
        v = ctypes.c_int(0)
        self._check(lib.cudaRuntimeGetVersion(ctypes.byref(v)), "cudaRuntimeGetVersion")
        self.version = v.value
        # cudaMemPrefetchAsync: the location form on CUDA >= 13 (and as _v2 from 12.2 on).
        if self.version >= 13000:
            self._prefetch = getattr(lib, "cudaMemPrefetchAsync")
            self.prefetch_api = "cudaMemPrefetchAsync(location)"
        elif hasattr(lib, "cudaMemPrefetchAsync_v2"):
            self._prefetch = getattr(lib, "cudaMemPrefetchAsync_v2")
            self.prefetch_api = "cudaMemPrefetchAsync_v2(location)"
        else:
            self._prefetch = getattr(lib, "cudaMemPrefetchAsync")
            self.prefetch_api = "cudaMemPrefetchAsync(device)"
        self._prefetch.restype = ctypes.c_int
        if self.prefetch_api.endswith("(location)"):
            self._prefetch.argtypes = [ctypes.c_void_p, ctypes.c_size_t, CudaMemLocation,
                                       ctypes.c_uint, ctypes.c_void_p]
        else:
            self._prefetch.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                       ctypes.c_void_p]

        # cudaMemAdvise: the same change of signature as the prefetch (location on CUDA >= 13).
        if self.version >= 13000 or hasattr(lib, "cudaMemAdvise_v2"):
            self._advise = getattr(lib, "cudaMemAdvise" if self.version >= 13000
                                   else "cudaMemAdvise_v2")
            self._advise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                     CudaMemLocation]
            self.advise_api = "location"
        else:
            self._advise = getattr(lib, "cudaMemAdvise")
            self._advise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int]
            self.advise_api = "device"
        self._advise.restype = ctypes.c_int

    def _check(self, err: int, what: str) -> None:
        if err != 0:
            msg = self.lib.cudaGetErrorString(err)
            text = msg.decode() if msg else "unknown error"
            raise CudaError(f"{what} failed: error {err} ({text})")

    # -- calls ------------------------------------------------------------------------------
    def device_attribute(self, attr: int, device: int) -> int:
        v = ctypes.c_int(0)
        self._check(self.lib.cudaDeviceGetAttribute(ctypes.byref(v), attr, device),
                    f"cudaDeviceGetAttribute({attr})")
        return v.value

    def malloc_managed(self, nbytes: int) -> int:
        ptr = ctypes.c_void_p()
        err = self.lib.cudaMallocManaged(ctypes.byref(ptr), nbytes, CUDA_MEM_ATTACH_GLOBAL)
        if err == 2:  # cudaErrorMemoryAllocation: an outcome, the runner records "oom"
            raise MemoryError(f"cudaMallocManaged({nbytes} bytes): cudaErrorMemoryAllocation")
        self._check(err, f"cudaMallocManaged({nbytes} bytes)")
        return int(ptr.value or 0)

    def free(self, ptr: int) -> None:
        self._check(self.lib.cudaFree(ctypes.c_void_p(ptr)), "cudaFree")

    def host_alloc(self, nbytes: int) -> int:
        ptr = ctypes.c_void_p()
        err = self.lib.cudaHostAlloc(ctypes.byref(ptr), nbytes, 0)
        if err == 2:
            raise MemoryError(f"cudaHostAlloc({nbytes} bytes): cudaErrorMemoryAllocation")
        self._check(err, f"cudaHostAlloc({nbytes} bytes)")
        return int(ptr.value or 0)

    def free_host(self, ptr: int) -> None:
        self._check(self.lib.cudaFreeHost(ctypes.c_void_p(ptr)), "cudaFreeHost")

    def synchronize(self) -> None:
        self._check(self.lib.cudaDeviceSynchronize(), "cudaDeviceSynchronize")

    def prefetch(self, ptr: int, nbytes: int, device: int | None, stream: int) -> None:
        """Enqueue a prefetch of managed memory to GPU ``device``, or to the host when None."""
        if self.prefetch_api.endswith("(location)"):
            loc = CudaMemLocation(MEM_LOCATION_HOST, 0) if device is None else \
                CudaMemLocation(MEM_LOCATION_DEVICE, device)
            err = self._prefetch(ctypes.c_void_p(ptr), nbytes, loc, 0, ctypes.c_void_p(stream))
        else:
            dst = CUDA_CPU_DEVICE_ID if device is None else device
            err = self._prefetch(ctypes.c_void_p(ptr), nbytes, dst, ctypes.c_void_p(stream))
        self._check(err, f"{self.prefetch_api} to {'host' if device is None else device}")

    def advise(self, ptr: int, nbytes: int, advice: int, device: int | None) -> None:
        """cudaMemAdvise of managed or (where the GPU can read it) system-allocated memory;
        ``device`` None: the host."""
        if self.advise_api == "location":
            loc = CudaMemLocation(MEM_LOCATION_HOST, 0) if device is None else \
                CudaMemLocation(MEM_LOCATION_DEVICE, device)
            err = self._advise(ctypes.c_void_p(ptr), nbytes, advice, loc)
        else:
            err = self._advise(ctypes.c_void_p(ptr), nbytes, advice,
                               CUDA_CPU_DEVICE_ID if device is None else device)
        self._check(err, f"cudaMemAdvise({advice}) to {'host' if device is None else device}")

    @contextmanager
    def managed(self, nbytes: int) -> Iterator[int]:
        """A managed allocation, freed on the way out (after the device is idle), error or not."""
        ptr = self.malloc_managed(nbytes)
        try:
            yield ptr
        finally:
            try:
                self.synchronize()
            finally:
                self.free(ptr)


class CudaArray:
    """An object exposing raw device-accessible memory through ``__cuda_array_interface__``, so
    ``torch.as_tensor(CudaArray(ptr, n), device="cuda")`` wraps it without a copy (uint8)."""

    def __init__(self, ptr: int, nbytes: int) -> None:
        self.__cuda_array_interface__ = {
            "shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "version": 3,
            "strides": None,
        }


def host_view(ptr: int, nbytes: int):  # -> numpy.ndarray
    """A numpy uint8 view of ``nbytes`` at ``ptr`` (managed or pinned memory) for CPU access."""
    import numpy as np  # noqa: PLC0415

    buf = (ctypes.c_uint8 * nbytes).from_address(ptr)
    return np.frombuffer(buf, dtype=np.uint8)
