"""Evicted KV caches in managed memory (``memory: managed``): prefetched to the host on
eviction, prefetched back layer by layer on resume, the model running on views of the buffer.

Managed memory stays under the free-memory rule of ARCHITECTURE.md (``cuda.managed_policy``):
the run checks its worst case before it starts and every allocation again. Without CUDA the
buffers are host tensors and prefetches do nothing, so the bookkeeping is still checked.
Details: docs/benchmarks/inference.md.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass
from typing import Any, Sequence

from hopperlab.core.rundir import SkipRun
from hopperlab.core.stats import GB, MIB
from hopperlab.cuda import runtime as cr
from hopperlab.cuda.managed_policy import managed_bytes_allowed
from hopperlab.cuda.nvtx import OFFLOAD_COPY, nvtx_range
from hopperlab.node import hardware
from hopperlab.workloads.inference.kv_cache import LayerKV, cache_nbytes
from hopperlab.workloads.inference.layered_reload import Reload, copy_layers, reload_in_layers
from hopperlab.workloads.inference.runtime import Runtime

ALIGN = 512
#: managed buffers are allocated in multiples of this and pooled: an evicted cache takes the
#: smallest free buffer that fits, so pages (and the host pages behind them) are made once
POOL_GRANULE = 32 * MIB


@dataclass
class ManagedCopy:
    ptr: int  # 0 without CUDA
    buffer: Any  # uint8 tensor over the whole buffer
    layers: list[LayerKV]  # views of ``buffer``
    ranges: list[tuple[int, int]]  # (offset, bytes) of each layer's keys + values
    saved: Any
    nbytes: int


def _is_grace_hopper(rt: Runtime) -> bool:
    torch = rt.torch
    name = torch.cuda.get_device_name(rt.device)
    cap = tuple(torch.cuda.get_device_capability(rt.device))
    return hardware.is_grace_hopper(platform.machine(), name, cap)


class ManagedStore:
    """Evicted caches in managed memory, prefetched to the host and back."""

    name = "managed"

    def __init__(self, rt: Runtime, allow_oversubscription: bool) -> None:
        self.rt = rt
        self.allow_oversubscription = allow_oversubscription
        self.held_bytes = 0  # bytes of evicted caches held now (what a policy reports)
        self.allocated_bytes = 0  # managed memory allocated, in use or pooled: the rule counts it
        self._pool: list[tuple[int, Any]] = []  # (ptr, buffer) free for reuse
        self.cuda = None
        self.grace_hopper = False
        if rt.is_cuda:
            try:
                self.cuda = cr.CudaRuntime()
            except (cr.CudaError, OSError, AttributeError) as exc:
                raise SkipRun(f"managed memory needs the CUDA runtime library: {exc}") from None
            if not self.cuda.device_attribute(cr.ATTR_MANAGED_MEMORY, rt.device.index or 0):
                raise SkipRun("managed memory: this device does not support cudaMallocManaged")
            self.grace_hopper = _is_grace_hopper(rt)

    @property
    def emulated(self) -> bool:
        return self.cuda is None

    def allowed(self, nbytes: int) -> bool:
        if self.emulated:
            return True
        return managed_bytes_allowed(self.allocated_bytes + nbytes, self.rt.free_bytes(),
                                     self.grace_hopper, self.allow_oversubscription)

    def check_budget(self, worst_case_bytes: int) -> None:
        """SkipRun before anything runs when the run's worst case breaks the free-memory rule."""
        if not self.allowed(worst_case_bytes):
            free = self.rt.free_bytes() or 0
            raise SkipRun(
                f"managed memory: the evicted caches may hold {worst_case_bytes / GB:.2f} GB, "
                f"over half of the GPU's free memory ({free / GB:.2f} GB); allowed only on "
                f"Grace Hopper or where the site sets allow_oversubscription: true")

    # -- one buffer per evicted cache ------------------------------------------------------
    def _allocate(self, nbytes: int) -> tuple[int, Any]:
        """A pooled buffer of at least ``nbytes`` (the smallest that fits), or a new one."""
        torch = self.rt.torch
        fits = [i for i, (_, buf) in enumerate(self._pool) if buf.numel() >= nbytes]
        if fits:
            best = min(fits, key=lambda i: self._pool[i][1].numel())
            return self._pool.pop(best)
        size = -(-nbytes // POOL_GRANULE) * POOL_GRANULE
        if self.emulated:
            buffer = torch.empty(size, dtype=torch.uint8)
            self.allocated_bytes += size
            return 0, buffer
        if not self.allowed(size):
            raise SkipRun(f"managed memory: {size / GB:.2f} GB more would break the "
                          f"free-memory rule (allocated {self.allocated_bytes / GB:.2f} GB)")
        ptr = self.cuda.malloc_managed(size)
        self.allocated_bytes += size
        return ptr, torch.as_tensor(cr.CudaArray(ptr, size), device=self.rt.device)

    def save(self, layers: Sequence[LayerKV]) -> ManagedCopy:
        rt = self.rt
        sizes = [(k.numel() * k.element_size(), v.numel() * v.element_size()) for k, v in layers]
        offsets, at = [], 0
        for kb, vb in sizes:
            offsets.append(at)
            at += -(-kb // ALIGN) * ALIGN + -(-vb // ALIGN) * ALIGN
        ptr, buffer = self._allocate(max(at, 1))
        views: list[LayerKV] = []
        ranges = []
        for (k, v), (kb, vb), off in zip(layers, sizes, offsets):
            voff = off + -(-kb // ALIGN) * ALIGN
            views.append((buffer[off:off + kb].view(k.dtype).view(k.shape),
                          buffer[voff:voff + vb].view(v.dtype).view(v.shape)))
            ranges.append((off, voff + vb - off))
        if rt.is_cuda:  # a reused buffer: its last reads (compute) and prefetches (side) are over
            rt.d2h.wait_stream(rt.compute_stream())
            rt.d2h.wait_stream(rt.side)
        with nvtx_range(OFFLOAD_COPY), rt.d2h_stream():
            if not self.emulated:  # pages made on the GPU at once, not by the copy's faults
                self.cuda.prefetch(ptr, at, rt.device.index or 0, rt.d2h.cuda_stream)
            copy_layers(rt, views, layers)
            if not self.emulated:  # the pages leave the GPU: that is the eviction
                self.cuda.prefetch(ptr, at, None, rt.d2h.cuda_stream)
        nbytes = cache_nbytes(layers)
        self.held_bytes += nbytes
        return ManagedCopy(ptr=ptr, buffer=buffer, layers=views, ranges=ranges,
                           saved=rt.record_on(rt.d2h), nbytes=nbytes)

    def send_to_host(self, copy: ManagedCopy) -> None:
        """Evict ``copy``'s pages to the host again (a benchmark reloading the same copy)."""
        rt = self.rt
        if self.emulated:
            return
        if rt.is_cuda:
            rt.d2h.wait_stream(rt.compute_stream())
            rt.d2h.wait_stream(rt.side)
        total = copy.ranges[-1][0] + copy.ranges[-1][1] if copy.ranges else 0
        with nvtx_range(OFFLOAD_COPY):
            self.cuda.prefetch(copy.ptr, total, None, rt.d2h.cuda_stream)
        copy.saved = rt.record_on(rt.d2h)

    def load(self, copy: ManagedCopy, layered: bool, release: bool = True) -> Reload:
        rt = self.rt
        dev = (rt.device.index or 0) if rt.is_cuda else None

        def prefetch_layer(i: int) -> LayerKV:
            if not self.emulated:
                off, n = copy.ranges[i]
                self.cuda.prefetch(copy.ptr + off, n, dev, rt.side.cuda_stream)
            return copy.layers[i]

        reload = reload_in_layers(rt, len(copy.layers), prefetch_layer, layered, copy.nbytes,
                                  wait_first=copy.saved)
        if release:
            reload.on_done.append(lambda: self.drop(copy))
        return reload

    def drop(self, copy: ManagedCopy) -> None:
        """The cache is no longer needed: its buffer goes back to the pool (no cudaFree, which
        would wait for the whole device)."""
        if copy.buffer is None:
            return
        self._pool.append((copy.ptr, copy.buffer))
        self.held_bytes -= copy.nbytes
        copy.layers = []
        copy.buffer = None
        copy.ptr = 0

    def close(self) -> None:
        """Free every pooled buffer (after the device is idle); the store is empty after."""
        if not self.emulated and self._pool:
            self.cuda.synchronize()
            for ptr, _ in self._pool:
                self.cuda.free(ptr)
        self._pool = []
        self.allocated_bytes = 0
