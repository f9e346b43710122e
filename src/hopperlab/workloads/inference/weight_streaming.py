"""Weight streaming: run a model whose decoder layers do not all fit the GPU budget.

The first layers stay on the GPU; each later layer's weights live in pinned host memory and are
copied, ahead of use, into one of two device buffers on the side stream (forward hooks keep the
double buffer full). In decode the link is the limit, so the floor is streamed bytes / pinned
host->device bandwidth. Without CUDA the same hooks run with synchronous copies and the logits
must equal the unmodified model's. The schedule in detail: docs/benchmarks/inference.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hopperlab.cuda.nvtx import OFFLOAD_PREFETCH, nvtx_range
from hopperlab.memory.layers import decoder_layers  # the one helper (the family imports it here)
from hopperlab.memory.host_arena import HostArena
from hopperlab.workloads.inference.runtime import Runtime

ALIGN = 512


def resident_layer_count(n_layers: int, fraction: float) -> int:
    return max(0, min(n_layers, int(round(fraction * n_layers))))


def module_bytes(module: Any) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


@dataclass
class _Slot:
    param: Any
    offset: int
    nbytes: int
    original: Any  # the parameter's own tensor before streaming (dropped after attach)


class LayerStreamer:
    """Stream decoder layers ``resident_layers..`` through a double buffer (see module doc)."""

    def __init__(self, model: Any, rt: Runtime, arena: HostArena, resident_layers: int) -> None:
        self.model = model
        self.rt = rt
        self.arena = arena
        layers = list(decoder_layers(model))
        if not 0 <= resident_layers <= len(layers):
            raise ValueError(f"resident_layers must be 0..{len(layers)}, got {resident_layers}")
        self.resident_layers = resident_layers
        self.streamed = layers[resident_layers:]
        self.block = None
        self.host: list[Any] = []
        self.slots: list[list[_Slot]] = []
        self.buffers: list[Any] = []
        self.hooks: list[Any] = []
        self.loaded: list[Any] = []
        self.free: list[Any] = [None, None]
        self.pending: set[int] = set()  # layers whose copy is issued and not yet waited for
        self.bytes_copied = 0
        self.layer_bytes = [module_bytes(m) for m in self.streamed]

    @property
    def n_streamed(self) -> int:
        return len(self.streamed)

    def bytes_per_forward(self) -> int:
        return sum(self.layer_bytes)

    # -- set up and tear down --------------------------------------------------------------
    def attach(self) -> "LayerStreamer":
        torch, rt = self.rt.torch, self.rt
        if not self.streamed:
            return self
        self.block = self.arena.block()
        size = 0
        for module in self.streamed:
            slots, at = [], 0
            for p in module.parameters():
                n = p.numel() * p.element_size()
                slots.append(_Slot(param=p, offset=at, nbytes=n, original=p.data))
                at += -(-n // ALIGN) * ALIGN
            host = self.block.empty((at,), torch.uint8)
            for s in slots:  # the weights go to host memory once
                host[s.offset:s.offset + s.nbytes].copy_(s.param.data.reshape(-1).view(torch.uint8))
            self.host.append(host)
            self.slots.append(slots)
            size = max(size, at)
        self.buffers = [torch.empty(size, dtype=torch.uint8, device=rt.device) for _ in range(2)]
        for k, slots in enumerate(self.slots):
            buf = self.buffers[k % 2]
            for s in slots:
                shape, dtype = s.original.shape, s.original.dtype
                s.param.data = buf[s.offset:s.offset + s.nbytes].view(dtype).view(shape)
                s.original = None  # the resident copy is freed: that is the point
        for k, module in enumerate(self.streamed):
            self.hooks.append(module.register_forward_pre_hook(self._before(k)))
            self.hooks.append(module.register_forward_hook(self._after(k)))
        self.loaded = [None] * self.n_streamed
        self.free = [None, None]
        self.pending = set()
        rt.synchronize()
        self._prefetch(0)
        return self

    def detach(self) -> None:
        """Give every streamed layer its own device copy again and drop the hooks and buffers."""
        rt, torch = self.rt, self.rt.torch
        for h in self.hooks:
            h.remove()
        self.hooks = []
        rt.synchronize()
        for host, slots in zip(self.host, self.slots):
            for s in slots:
                shape, dtype = s.param.data.shape, s.param.data.dtype
                own = torch.empty(shape, dtype=dtype, device=rt.device)
                own.copy_(host[s.offset:s.offset + s.nbytes].view(dtype).view(shape))
                s.param.data = own
        self.buffers = []
        self.host = []
        self.slots = []
        if self.block is not None:
            self.block.release()
            self.block = None

    # -- the double buffer -----------------------------------------------------------------
    def _buffer_of(self, k: int) -> int:
        return k % 2

    def _prefetch(self, k: int) -> None:
        rt = self.rt
        b = self._buffer_of(k)
        n = self.host[k].numel()
        rt.side_waits(self.free[b])  # the buffer's previous layer has finished computing
        with nvtx_range(OFFLOAD_PREFETCH), rt.side_stream():
            self.buffers[b][:n].copy_(self.host[k], non_blocking=rt.is_cuda)
        self.loaded[k] = rt.record_on_side()
        self.pending.add(k)
        self.bytes_copied += self.layer_bytes[k]

    def _next(self, k: int) -> int:
        return (k + 1) % self.n_streamed

    def _before(self, k: int) -> Any:
        def hook(module: Any, args: Any) -> None:
            if k not in self.pending:  # not issued ahead (never happens in layer order)
                self._prefetch(k)
            self.rt.compute_waits(self.loaded[k])
            self.pending.discard(k)
            nxt = self._next(k)
            if self.n_streamed > 1 and self._buffer_of(nxt) != self._buffer_of(k):
                self._prefetch(nxt)
        return hook

    def _after(self, k: int) -> Any:
        def hook(module: Any, args: Any, output: Any) -> None:
            self.free[self._buffer_of(k)] = self.rt.record_on_compute()
            nxt = self._next(k)
            if self._buffer_of(nxt) == self._buffer_of(k):
                self._prefetch(nxt)
        return hook
