"""Pinned host buffers shared by the offload techniques: exact-size page-locked memory and a pool
that reuses it.

Why here: activation offload copies saved tensors into these buffers, parameter offload keeps
the frozen weights in them and inference's host arena (``host_arena``) its evicted KV caches and
streamed layers; all need the same exact-size registration (PyTorch's pinned allocator rounds
every block up to a power of two, up to twice the host memory). ``host_buffer`` is the one place
hopperlab allocates host memory for the GPU to copy from and to.
"""

from __future__ import annotations

import collections
import weakref

import numpy as np
import torch


#: buffers from this size up are touched by torch's threads before they are registered
PREFAULT_BYTES = 1 << 20
#: ``cudaHostRegister`` flags: portable (every context) and mapped (a device pointer too)
HOST_REGISTER_PORTABLE, HOST_REGISTER_MAPPED = 0x01, 0x02


def pinned_empty(nbytes: int, mapped: bool = False) -> torch.Tensor:
    """``nbytes`` of page-locked host memory (uint8), exactly: plain host memory registered with
    ``cudaHostRegister``, unregistered when its memory is freed, i.e. when the last tensor that
    shares it (views, reshapes) is gone. ``mapped``: also mapped into the device's address
    space, for kernels that read it in place (zero-copy).

    Why a NumPy array owns the memory: ``torch.from_numpy`` keeps the array alive as long as the
    storage, so a finalizer on the array runs when the storage is freed. A finalizer on the
    returned tensor object ran as soon as that one Python object went, while views of it still
    read the memory, then pageable (2026-11-28: TPC-H ``host-pinned`` streamed at 8.4 GB/s, the
    pageable rate, against 53.9 on 2026-11-24, since ``pinned_copy`` returned a view).

    The pages are touched first on torch's intra-op threads (``zero_``): registering untouched
    memory makes the driver fault in and clear every page on one thread, about 0.5 GB/s (the
    13B one-GPU build: 52.8 s for 26 GB of parameter shards, issue 35)."""
    if nbytes == 0:
        return torch.empty(0, dtype=torch.uint8)
    owner = np.empty(nbytes, dtype=np.uint8)
    buf = torch.from_numpy(owner)
    if nbytes >= PREFAULT_BYTES:
        buf.zero_()
    cudart = torch.cuda.cudart()
    flags = HOST_REGISTER_PORTABLE | HOST_REGISTER_MAPPED if mapped else 0
    err = cudart.cudaHostRegister(buf.data_ptr(), nbytes, flags)
    if int(err) != 0:
        raise RuntimeError(f"cudaHostRegister of {nbytes} bytes failed (error {int(err)})")
    weakref.finalize(owner, cudart.cudaHostUnregister, buf.data_ptr())
    return buf


def host_buffer(nbytes: int, pin: bool) -> torch.Tensor:
    """``nbytes`` of host memory (uint8): page-locked (``pinned_empty``) when ``pin``, else plain."""
    return pinned_empty(nbytes) if pin else torch.empty(nbytes, dtype=torch.uint8)


def pinned_copy(tensor: torch.Tensor, mapped: bool = False) -> torch.Tensor:
    """A page-locked copy of the host tensor ``tensor``, of its exact size (``pinned_empty``;
    ``Tensor.pin_memory`` would round it up to a power of two), same dtype and shape."""
    src = tensor.detach().contiguous()
    nbytes = src.numel() * src.element_size()
    out = pinned_empty(nbytes, mapped=mapped).view(src.dtype).view(src.shape)
    out.copy_(src)
    return out


#: a new buffer is rounded up to 1/GRANULE_DIVISIONS of its power-of-two range (at most 12.5 %
#: more): tensors whose sizes change a little from step to step (the token segments of MoE
#: experts) then find a free buffer again instead of each step pinning new ones
GRANULE_DIVISIONS = 8


def rounded_size(nbytes: int) -> int:
    """``nbytes`` rounded up to a multiple of 1/8 of the power of two below it (4 KiB at least)."""
    if nbytes <= 4096:
        return nbytes
    step = max(4096, (1 << (nbytes.bit_length() - 1)) // GRANULE_DIVISIONS)
    return -(-nbytes // step) * step


class PinnedBufferPool:
    """Reusable host buffers (uint8).

    ``acquire`` returns the smallest free buffer that holds ``nbytes`` (a view of its first
    ``nbytes``) or allocates one of ``rounded_size(nbytes)``; ``release`` gives it back. Best fit
    over rounded sizes, because saved tensors are not all the same size every step: an MoE
    expert's activations follow the router, and a pool keyed by exact size would pin new memory
    for them at every step until the host ran out.
    With ``pin=True`` the memory is page-locked with ``cudaHostRegister`` (exact size, not
    PyTorch's power of two), so device<->host copies from and to it are asynchronous DMA. With
    ``device`` set the buffers are GPU memory instead (the ``staging="device"`` diagnostic).
    Counters: ``allocated_bytes`` (all buffers made and not freed), ``allocations`` (how many
    were made: a steady-state step must not increase it), ``in_use_bytes``.
    """

    def __init__(self, pin: bool, device: torch.device | None = None):
        if pin and device is not None:
            raise ValueError("PinnedBufferPool: pin is for host buffers; device buffers need none")
        self.pin = pin
        self.device = device
        self._free: dict[int, list[torch.Tensor]] = collections.defaultdict(list)
        self._lent: dict[int, torch.Tensor] = {}   # data_ptr of a lent view -> its buffer
        self.allocated_bytes = 0
        self.allocations = 0
        self.in_use_bytes = 0

    def acquire(self, nbytes: int) -> torch.Tensor:
        fits = [size for size, bufs in self._free.items() if bufs and size >= nbytes]
        if fits:
            base = self._free[min(fits)].pop()
        else:
            size = rounded_size(nbytes)
            if self.device is not None:
                base = torch.empty(size, dtype=torch.uint8, device=self.device)
            else:
                base = host_buffer(size, pin=self.pin)
            self.allocated_bytes += size
            self.allocations += 1
        self.in_use_bytes += base.numel()
        view = base[:nbytes]
        if nbytes:
            self._lent[view.data_ptr()] = base
        return view

    def release(self, buf: torch.Tensor) -> None:
        base = self._lent.pop(buf.data_ptr(), buf) if buf.numel() else buf
        self.in_use_bytes -= base.numel()
        self._free[base.numel()].append(base)

    def free_bytes(self) -> int:
        return sum(k * len(v) for k, v in self._free.items())

    def clear(self) -> None:
        """Drop the free buffers (those in use stay valid until released, then are kept)."""
        for size, bufs in self._free.items():
            self.allocated_bytes -= size * len(bufs)
        self._free.clear()      # unregistered as they are garbage-collected (pinned_empty)
