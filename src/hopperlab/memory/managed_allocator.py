"""Unified memory for PyTorch: every CUDA allocation through ``cudaMallocManaged``.

``install_managed_allocator()`` compiles ``csrc/managed_allocator.cpp`` at first use (cached by
the source's hash and the toolchain) and makes it PyTorch's allocator through
``CUDAPluggableAllocator``, before CUDA is initialised (refused clearly after).

Why the cap (ARCHITECTURE.md): managed memory never asks for more than the GPU has free unless
the machine is a Grace Hopper or the site says ``allow_oversubscription: true``; asking for more
can hang a shared GPU. The cap (``managed_cap_bytes``: free bytes at install minus a margin) is
enforced by the allocator with ``torch.OutOfMemoryError`` (a run's ``status: oom``). Optional
advice and prefetch per new block. ``torch.cuda.memory_allocated`` does not work under a
pluggable allocator: read ``ManagedAllocator.stats()``. In detail: docs/memory.md.
"""

from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import os
import platform
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any, Sequence

from hopperlab.core.errors import NodeError
from hopperlab.node.hardware import is_grace_hopper

SOURCE = Path(__file__).with_name("csrc") / "managed_allocator.cpp"
ALLOC_SYMBOL = "hopperlab_managed_malloc"
FREE_SYMBOL = "hopperlab_managed_free"
ADVICE = {"none": 0, "preferred_device": 1, "accessed_by": 2, "both": 3}
#: margin kept free below the GPU's free memory: the larger of this and MARGIN_FRACTION of total
MARGIN_MIN_BYTES = 1 << 30
MARGIN_FRACTION = 0.03

_installed: "ManagedAllocator | None" = None


class ManagedAllocatorError(NodeError):
    """The managed allocator cannot be installed here (say why; the workload may skip the run)."""


# ----------------------------------------------------------------------------- pure policy
def oversubscription_allowed(cpu_arch: str | None, gpu_name: str | None, site_allows: bool) -> bool:
    """Grace Hopper (Arm host + Hopper GPU, or a GH200) or the site's explicit permission."""
    return bool(site_allows) or is_grace_hopper(cpu_arch, gpu_name)


def managed_cap_bytes(free_bytes: int, total_bytes: int, *, oversubscription: bool,
                      margin_bytes: int | None = None) -> int | None:
    """The most managed memory the allocator may hold: free memory minus a margin, or None (no
    cap) where oversubscription is allowed. Raises when the margin leaves nothing."""
    if oversubscription:
        return None
    if free_bytes < 0 or total_bytes <= 0 or free_bytes > total_bytes:
        raise ValueError(f"implausible GPU memory: free {free_bytes} of {total_bytes} bytes")
    margin = margin_bytes if margin_bytes is not None else max(MARGIN_MIN_BYTES,
                                                               int(total_bytes * MARGIN_FRACTION))
    cap = free_bytes - margin
    if cap <= 0:
        raise ManagedAllocatorError(
            f"only {free_bytes / 2**30:.1f} GiB of the GPU are free, less than the "
            f"{margin / 2**30:.1f} GiB margin: no managed memory can be given safely")
    return cap


def round_block(size: int) -> int:
    """The block size the C++ allocator reserves for a request (mirrors ``round_size``)."""
    size = max(size, 1)
    unit = 512 if size < (1 << 20) else (2 << 20)
    return -(-size // unit) * unit


def advice_flags(advise: str) -> int:
    if advise not in ADVICE:
        raise ValueError(f"advise must be one of {sorted(ADVICE)}, not {advise!r}")
    return ADVICE[advise]


# ----------------------------------------------------------------------------- building
def _cuda_include_dirs() -> list[str]:
    dirs = []
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and Path(root, "include", "cuda_runtime_api.h").exists():
            dirs.append(str(Path(root, "include")))
    try:
        import nvidia  # the CUDA wheels torch depends on carry the headers

        for base in nvidia.__path__:
            for header in Path(base).glob("*/include/cuda_runtime_api.h"):
                dirs.append(str(header.parent))
    except ImportError:
        pass
    return dirs


def _loaded_cudart() -> str | None:
    """The libcudart torch has mapped into this process (so that we share its runtime)."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    for line in maps.splitlines():
        path = line.split(None, 5)[-1].strip() if len(line.split(None, 5)) == 6 else ""
        if re.search(r"libcudart(-[0-9a-f]+)?\.so(\.\d+)*$", os.path.basename(path)):
            return path
    return None


def compile_command(source: Path, output: Path, *, include_dirs: Sequence[str],
                    link: Sequence[str], cxx11_abi: bool, compiler: str = "g++") -> list[str]:
    cmd = [compiler, "-O2", "-std=c++17", "-shared", "-fPIC", str(source), "-o", str(output),
           f"-D_GLIBCXX_USE_CXX11_ABI={int(cxx11_abi)}"]
    cmd += [f"-I{d}" for d in include_dirs]
    cmd += list(link)
    return cmd


def build_library(cache_dir: str | Path | None = None, *, extra_include_dirs: Sequence[str] = (),
                  cudart: str | None = None) -> Path:
    """Compile the allocator (once per source and toolchain) and return the ``.so`` path."""
    import torch
    from torch.utils.cpp_extension import include_paths

    cudart = cudart or _loaded_cudart()
    cuda_inc = list(extra_include_dirs) or _cuda_include_dirs()
    if not cuda_inc:
        raise ManagedAllocatorError("no CUDA headers (cuda_runtime_api.h) found: set CUDA_HOME")
    if cudart is None:
        raise ManagedAllocatorError("torch's libcudart is not loaded in this process (no CUDA build?)")
    torch_lib = str(Path(torch.__file__).parent / "lib")
    link = [cudart, f"-L{torch_lib}", "-lc10", f"-Wl,-rpath,{torch_lib}",
            f"-Wl,-rpath,{Path(cudart).parent}"]
    abi = bool(torch._C._GLIBCXX_USE_CXX11_ABI)
    key = hashlib.sha256(SOURCE.read_bytes() + repr((torch.__version__, cudart, cuda_inc, abi)).encode())
    cache = Path(cache_dir or os.environ.get("HOPPERLAB_CACHE", Path.home() / ".cache" / "hopperlab"))
    out_dir = cache / "managed_allocator" / key.hexdigest()[:16]
    lib = out_dir / "libhopperlab_managed.so"
    if lib.exists():
        return lib
    out_dir.mkdir(parents=True, exist_ok=True)
    compiler = shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        raise ManagedAllocatorError("no C++ compiler (g++) to build the managed allocator")
    tmp = out_dir / f".{os.getpid()}.so"
    cmd = compile_command(SOURCE, tmp, include_dirs=[*include_paths(), *cuda_inc], link=link,
                          cxx11_abi=abi, compiler=compiler)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ManagedAllocatorError(f"building the managed allocator failed:\n{' '.join(cmd)}\n{proc.stderr[-4000:]}")
    os.replace(tmp, lib)
    return lib


# ----------------------------------------------------------------------------- installing
@dataclasses.dataclass
class ManagedStats:
    peak_managed_bytes: int
    reserved_bytes: int
    in_use_bytes: int
    peak_in_use_bytes: int
    managed_calls: int
    refusals: int
    cap_bytes: int | None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class ManagedAllocator:
    """The installed allocator: its library, cap and figures."""

    def __init__(self, lib: ctypes.CDLL, path: Path, cap: int | None, gpu_name: str,
                 free_bytes: int, total_bytes: int):
        self._lib = lib
        self.path = path
        self.cap_bytes = cap
        self.gpu_name = gpu_name
        self.free_bytes_at_install = free_bytes
        self.total_bytes = total_bytes

    def stats(self) -> ManagedStats:
        out = (ctypes.c_size_t * 7)()
        self._lib.hopperlab_managed_stats(out)
        return ManagedStats(peak_managed_bytes=out[2], reserved_bytes=out[0], in_use_bytes=out[1],
                            peak_in_use_bytes=out[3], managed_calls=out[4], refusals=out[5],
                            cap_bytes=out[6] or None)

    def empty_cache(self) -> None:
        """Give the cached blocks back (cudaFree: synchronises the device)."""
        self._lib.hopperlab_managed_empty_cache()


def installed() -> ManagedAllocator | None:
    return _installed


def install_managed_allocator(device: int = 0, *, allow_oversubscription: bool = False,
                              advise: str = "none", prefetch: bool = False,
                              margin_bytes: int | None = None,
                              cache_dir: str | Path | None = None) -> ManagedAllocator:
    """Make cudaMallocManaged PyTorch's CUDA allocator, capped at the GPU's free memory.

    Call before anything touches CUDA (a tensor on the GPU, ``torch.cuda.mem_get_info``, ...).
    ``allow_oversubscription`` is the site flag; Grace Hopper is detected. Raises
    ``ManagedAllocatorError`` where it cannot be installed (no CUDA, CUDA already initialised,
    no compiler or headers, no free memory).
    """
    global _installed
    import torch

    if _installed is not None:
        return _installed
    flags = advice_flags(advise)
    if not torch.cuda.is_available():
        raise ManagedAllocatorError("managed memory needs a CUDA device; none is available")
    if torch.cuda.is_initialized():
        raise ManagedAllocatorError(
            "the managed allocator must be installed before CUDA is initialised in this process "
            "(something already used the GPU: install it first thing in the run)")
    path = build_library(cache_dir)
    lib = ctypes.CDLL(str(path))
    lib.hopperlab_managed_configure.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_int]
    lib.hopperlab_managed_mem_get_info.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_size_t),
                                                   ctypes.POINTER(ctypes.c_size_t)]
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    if lib.hopperlab_managed_mem_get_info(device, ctypes.byref(free), ctypes.byref(total)) != 0:
        raise ManagedAllocatorError(f"cudaMemGetInfo failed on device {device}")
    name_buf = ctypes.create_string_buffer(256)
    lib.hopperlab_managed_device_name(device, name_buf, 256)
    gpu_name = name_buf.value.decode(errors="replace")
    over = oversubscription_allowed(platform.machine(), gpu_name, allow_oversubscription)
    cap = managed_cap_bytes(free.value, total.value, oversubscription=over, margin_bytes=margin_bytes)
    lib.hopperlab_managed_configure(cap or 0, flags, int(prefetch))
    allocator = torch.cuda.memory.CUDAPluggableAllocator(str(path), ALLOC_SYMBOL, FREE_SYMBOL)
    torch.cuda.memory.change_current_allocator(allocator)
    _installed = ManagedAllocator(lib, path, cap, gpu_name, free.value, total.value)
    return _installed
