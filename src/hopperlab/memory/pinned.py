"""Pinned host buffers shared by the offload techniques: exact-size page-locked memory and a pool
that reuses it.

Why here: activation offload copies saved tensors into these buffers and parameter offload keeps
the frozen weights in them; both need the same exact-size registration (PyTorch's pinned
allocator rounds every block up to a power of two, up to twice the host memory).
"""

from __future__ import annotations

import collections
import weakref

import torch


def pinned_empty(nbytes: int) -> torch.Tensor:
    """``nbytes`` of page-locked host memory (uint8), exactly: plain host memory registered with
    ``cudaHostRegister``, unregistered when the tensor is garbage-collected."""
    buf = torch.empty(nbytes, dtype=torch.uint8)
    if nbytes == 0:
        return buf
    cudart = torch.cuda.cudart()
    err = cudart.cudaHostRegister(buf.data_ptr(), nbytes, 0)
    if int(err) != 0:
        raise RuntimeError(f"cudaHostRegister of {nbytes} bytes failed (error {int(err)})")
    weakref.finalize(buf, cudart.cudaHostUnregister, buf.data_ptr())
    return buf


class PinnedBufferPool:
    """Reusable host buffers (uint8), keyed by exact byte size.

    ``acquire`` returns a free buffer of that size or allocates one; ``release`` gives it back.
    With ``pin=True`` the memory is page-locked with ``cudaHostRegister`` (exact size), so
    device<->host copies from and to it are asynchronous DMA. With ``device`` set the buffers
    are GPU memory instead (the ``staging="device"`` diagnostic). Counters: ``allocated_bytes``
    (all buffers ever made and not freed), ``allocations`` (how many were made: a steady-state step
    must not increase it), ``in_use_bytes``.
    """

    def __init__(self, pin: bool, device: torch.device | None = None):
        if pin and device is not None:
            raise ValueError("PinnedBufferPool: pin is for host buffers; device buffers need none")
        self.pin = pin
        self.device = device
        self._free: dict[int, list[torch.Tensor]] = collections.defaultdict(list)
        self.allocated_bytes = 0
        self.allocations = 0
        self.in_use_bytes = 0

    def acquire(self, nbytes: int) -> torch.Tensor:
        free = self._free.get(nbytes)
        if free:
            buf = free.pop()
        else:
            if self.device is not None:
                buf = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
            elif self.pin:
                buf = pinned_empty(nbytes)
            else:
                buf = torch.empty(nbytes, dtype=torch.uint8)
            self.allocated_bytes += nbytes
            self.allocations += 1
        self.in_use_bytes += nbytes
        return buf

    def release(self, buf: torch.Tensor) -> None:
        self.in_use_bytes -= buf.numel()
        self._free[buf.numel()].append(buf)

    def free_bytes(self) -> int:
        return sum(k * len(v) for k, v in self._free.items())

    def clear(self) -> None:
        """Drop the free buffers (those in use stay valid until released, then are kept)."""
        for size, bufs in self._free.items():
            self.allocated_bytes -= size * len(bufs)
        self._free.clear()      # unregistered as they are garbage-collected (pinned_empty)
