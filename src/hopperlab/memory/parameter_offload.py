"""Parameter offload: frozen weights live in pinned host memory and stream to the GPU layer by
layer, ahead of use, in forward and in backward.

Why: LoRA's frozen base model is most of a large model's memory, and only a few of its layers
need to be on the GPU at once. Every ``requires_grad=False`` parameter of a decoder layer is
streamed, except in the last ``resident_layers`` layers (they stay on the device). Each layer's
frozen weights are one pinned buffer per dtype, copied on a side stream ordered by events (no host
synchronisation) into ``prefetch + 1`` device slots reused in turn. Backward brings a layer back
through the saved-tensor hooks (weight views saved as references) or, with checkpointing,
through the recomputed forward's pre-hook. ``remove()`` puts every weight back where it came
from. Without CUDA the same bookkeeping runs on the host (CI checks exact gradients). In
detail: docs/memory.md ("Parameter offload").
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable

import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef

from hopperlab.memory.pinned import pinned_empty
from hopperlab.cuda.nvtx import OFFLOAD_PREFETCH, nvtx_range


@dataclasses.dataclass
class ParameterOffloadStats:
    bytes_streamed: int = 0       # host -> device, since reset_stats()
    layer_fetches: int = 0
    streamed_layers: int = 0      # layers whose frozen weights live on the host
    resident_layers: int = 0
    host_bytes: int = 0           # pinned host bytes holding the streamed weights
    slot_bytes: int = 0           # device bytes of the slots
    slots: int = 0
    device_bytes: int = 0         # frozen-weight bytes on the device now (slots, resident, copies)
    peak_device_bytes: int = 0    # the most at once since reset_stats()

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class _WeightRef:
    """A saved view of a streamed weight, by layer and position instead of by memory."""

    layer: int
    dtype: torch.dtype
    size: torch.Size
    stride: tuple[int, ...]
    offset: int


@dataclasses.dataclass
class _Entry:
    param: nn.Parameter
    offset: int
    numel: int
    shape: torch.Size
    origin: torch.device          # where the weight was before the offload; remove() restores it


class ParameterOffload:
    """Stream the frozen weights of ``layers`` from pinned host memory.

    Args:
        layers: the decoder layers, in forward order (``decoder_layers(model)``).
        device: the compute device (``cpu`` runs the bookkeeping only).
        resident_layers: how many of the last layers stay on the device for good.
        prefetch: how many layers ahead are copied while one computes (slots = prefetch + 1).

    Use ``with offload:`` around forward (saved-tensor hooks for the weights, stats reset), or
    pass it to ``ActivationOffload(parameter_offload=...)`` when both are used. The rest of the
    model (embeddings, final norm, head) is the caller's to move to the device.
    """

    def __init__(self, layers: Iterable[nn.Module], device: torch.device | str, *,
                 resident_layers: int = 1, prefetch: int = 1):
        if resident_layers < 0 or prefetch < 1:
            raise ValueError("resident_layers must be >= 0 and prefetch >= 1")
        self.layers = list(layers)
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        if self.cuda and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        n = len(self.layers)
        self.n_resident = min(resident_layers, n)
        self.n_streamed = n - self.n_resident
        self.prefetch = prefetch
        self.n_slots = min(prefetch + 1, self.n_streamed)
        self._side = torch.cuda.Stream(self.device) if self.cuda else None
        self._entries: list[dict[torch.dtype, list[_Entry]]] = []
        self._host: list[dict[torch.dtype, torch.Tensor]] = []
        self._slots: list[dict[torch.dtype, torch.Tensor]] = []
        self._slot_of_storage: dict[int, tuple[int, torch.dtype]] = {}
        self._occupant: list[int | None] = [None] * self.n_slots
        self._ready: list[Any] = [None] * self.n_slots
        self._slot_free: list[Any] = [None] * self.n_slots
        self._current: int | None = None
        self._direction = 1
        self._hooks: list[Any] = []
        self._saved_hooks: Any = None
        self._stats = ParameterOffloadStats()
        self._pinned: list[torch.Tensor] = []
        self._frozen: list[list[nn.Parameter]] = []      # per layer, for the device-memory check
        self._known: set[int] = set()                    # storages counted in _fixed_bytes
        self._fixed_bytes = 0                            # slots + resident layers' frozen weights
        self._copies: dict[int, tuple[StorageWeakRef, int]] = {}   # other device storages seen
        self._setup()

    # -------------------------------------------------------------- setup
    def _setup(self) -> None:
        pin = self.cuda
        for i, layer in enumerate(self.layers):
            for p in layer.parameters():
                if p.requires_grad:
                    p.data = p.data.to(self.device)
            for mod in layer.modules():
                for name, buf in list(mod.named_buffers(recurse=False)):
                    mod._buffers[name] = buf.to(self.device)
            self._frozen.append(_frozen(layer))
            if i >= self.n_streamed:
                for p in layer.parameters():
                    p.data = p.data.to(self.device)
                for storage in {p.untyped_storage().data_ptr(): p.untyped_storage()
                                for p in self._frozen[-1]}.values():
                    if storage.data_ptr() not in self._known:
                        self._known.add(storage.data_ptr())
                        self._fixed_bytes += storage.nbytes()
                self._stats.resident_layers += 1
                continue
            by_dtype: dict[torch.dtype, list[_Entry]] = {}
            sizes: dict[torch.dtype, int] = {}
            seen: set[int] = set()
            for p in layer.parameters():
                if p.requires_grad or id(p) in seen:
                    continue
                seen.add(id(p))
                off = sizes.get(p.dtype, 0)
                by_dtype.setdefault(p.dtype, []).append(_Entry(p, off, p.numel(), p.shape, p.device))
                sizes[p.dtype] = off + p.numel()
            host = {}
            for dtype, entries in by_dtype.items():
                # pinned at its exact size (PyTorch's pinned allocator rounds up to a power of 2)
                nbytes = sizes[dtype] * torch.empty(0, dtype=dtype).element_size()
                if pin:
                    base = pinned_empty(nbytes)
                    self._pinned.append(base)   # the registration lives as long as this object
                    flat = base.view(dtype)
                else:
                    flat = torch.empty(sizes[dtype], dtype=dtype)
                for e in entries:
                    flat[e.offset:e.offset + e.numel].copy_(e.param.data.reshape(-1))
                    e.param.data = self._placeholder(dtype)
                host[dtype] = flat
                self._known.add(flat.untyped_storage().data_ptr())   # host memory, not counted
                self._stats.host_bytes += flat.numel() * flat.element_size()
            self._entries.append(by_dtype)
            self._host.append(host)
            self._stats.streamed_layers += 1
        need: dict[torch.dtype, int] = {}
        for host in self._host:
            for dtype, flat in host.items():
                need[dtype] = max(need.get(dtype, 0), flat.numel())
        for _ in range(self.n_slots):
            slot = {dtype: torch.empty(numel, dtype=dtype, device=self.device)
                    for dtype, numel in need.items()}
            self._slots.append(slot)
            for dtype, flat in slot.items():
                self._slot_of_storage[flat.untyped_storage().data_ptr()] = (len(self._slots) - 1, dtype)
                self._known.add(flat.untyped_storage().data_ptr())
                self._stats.slot_bytes += flat.numel() * flat.element_size()
        self._stats.slots = self.n_slots
        self._fixed_bytes += self._stats.slot_bytes
        self._note_device_bytes()
        for i, layer in enumerate(self.layers):
            self._hooks.append(layer.register_forward_pre_hook(self._make_pre_hook(i)))

    def _placeholder(self, dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(0, dtype=dtype, device=self.device)

    def _make_pre_hook(self, i: int) -> Any:
        def hook(_module: nn.Module, _args: Any) -> None:
            self.enter(i)
        return hook

    def remove(self) -> None:
        """Take the hooks away and put every streamed weight back where it was before: a view of
        its host buffer if it came from host memory (no copy: materialising every layer on the
        device is what the offload exists to avoid, and would set the run's peak), a copy on its
        device otherwise. The slots are released."""
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        if self.cuda:
            torch.cuda.current_stream(self.device).wait_stream(self._side)
        for i in range(self.n_streamed):
            for dtype, entries in self._entries[i].items():
                for e in entries:
                    src = self._host[i][dtype][e.offset:e.offset + e.numel].view(e.shape)
                    e.param.data = src if e.origin.type == "cpu" else src.to(e.origin)
                    self._observe(e.param.data)
        self._occupant = [None] * self.n_slots
        if self._slots:
            self._slots = []
            self._slot_of_storage.clear()
            self._fixed_bytes -= self._stats.slot_bytes
        self._note_device_bytes()

    # -------------------------------------------------------------- stats
    def stats(self) -> ParameterOffloadStats:
        return dataclasses.replace(self._stats)

    def reset_stats(self) -> None:
        self._stats.bytes_streamed = 0
        self._stats.layer_fetches = 0
        self._note_device_bytes()
        self._stats.peak_device_bytes = self._stats.device_bytes

    def _observe(self, t: torch.Tensor) -> None:
        """Count ``t``'s storage if it holds a frozen weight on the device outside the slots and
        the resident layers (a copy: it is device memory for as long as anything references it)."""
        if t.device != self.device or t.numel() == 0:
            return
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr in self._known:
            return
        seen = self._copies.get(ptr)
        if seen is None or seen[0].expired():
            self._copies[ptr] = (StorageWeakRef(storage), storage.nbytes())

    def _note_device_bytes(self) -> None:
        for ptr in [p for p, (ref, _n) in self._copies.items() if ref.expired()]:
            del self._copies[ptr]
        now = self._fixed_bytes + sum(n for _ref, n in self._copies.values())
        self._stats.device_bytes = now
        self._stats.peak_device_bytes = max(self._stats.peak_device_bytes, now)

    # -------------------------------------------------------------- saved-tensor hooks
    def __enter__(self) -> "ParameterOffload":
        self.reset_stats()
        self._saved_hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._saved_hooks.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._saved_hooks.__exit__(*exc)
        self._saved_hooks = None

    def _pack(self, t: torch.Tensor) -> Any:
        ref = self.try_pack(t)
        # anything else as a detached alias: the tensor itself would close a reference cycle
        # with the node that produced it (activation_offload._Kept says more)
        return t.detach() if ref is None else ref

    def _unpack(self, packed: Any) -> torch.Tensor:
        return self.unpack(packed) if isinstance(packed, _WeightRef) else packed

    def try_pack(self, t: torch.Tensor) -> _WeightRef | None:
        """A reference for a view of a slot (a streamed weight); None for anything else."""
        if not self._slot_of_storage or t.device != self.device:
            return None
        key = self._slot_of_storage.get(t.untyped_storage().data_ptr())
        if key is None:
            return None
        slot, dtype = key
        layer = self._occupant[slot]
        if layer is None or t.dtype != dtype:
            return None
        return _WeightRef(layer, dtype, t.size(), t.stride(), t.storage_offset())

    def unpack(self, ref: _WeightRef) -> torch.Tensor:
        if not self._slots and self.n_slots:
            raise RuntimeError("ParameterOffload.remove() was called before this backward")
        self.enter(ref.layer)
        slot = self._slots[ref.layer % self.n_slots][ref.dtype]
        return slot.as_strided(ref.size, ref.stride, ref.offset)

    # -------------------------------------------------------------- the schedule
    def enter(self, i: int) -> None:
        """Layer ``i`` is about to compute (forward, recomputation or backward): make its weights
        present, and start copying the layers that come next."""
        if i == self._current:
            return
        if self._current is not None:
            self._direction = 1 if i > self._current else -1
        if self.cuda and self.n_slots:
            left = torch.cuda.current_stream(self.device).record_event()
            for s in range(self.n_slots):
                if self._occupant[s] != i:
                    self._slot_free[s] = left
        self._current = i
        if i < self.n_streamed:
            s = i % self.n_slots
            if self._occupant[s] != i:
                self._fetch(i)
            if self.cuda:
                torch.cuda.current_stream(self.device).wait_event(self._ready[s])
        for j in self._upcoming(i):
            s = j % self.n_slots
            if self._occupant[s] != j and self._occupant[s] != i:
                self._fetch(j)
        for p in self._frozen[i]:
            self._observe(p.data)
        self._note_device_bytes()

    def _upcoming(self, i: int) -> list[int]:
        """The next ``prefetch`` streamed layers after ``i`` in the visiting order."""
        n = len(self.layers)
        if self.n_streamed == 0:
            return []
        order = list(range(n)) + list(range(n - 1, -1, -1))
        pos = i if self._direction > 0 else n + (n - 1 - i)
        out: list[int] = []
        for k in range(1, 2 * n):
            j = order[(pos + k) % (2 * n)]
            if j == i:
                continue
            if j < self.n_streamed and j not in out:
                out.append(j)
                if len(out) == self.prefetch:
                    break
        return out

    def _fetch(self, j: int) -> None:
        s = j % self.n_slots
        previous = self._occupant[s]
        if previous is not None:
            for entries in self._entries[previous].values():
                for e in entries:
                    e.param.data = self._placeholder(e.param.dtype)
        with nvtx_range(OFFLOAD_PREFETCH):
            if self.cuda:
                if self._slot_free[s] is not None:
                    self._side.wait_event(self._slot_free[s])
                with torch.cuda.stream(self._side):
                    for dtype, host in self._host[j].items():
                        self._slots[s][dtype][:host.numel()].copy_(host, non_blocking=True)
                self._ready[s] = self._side.record_event()
            else:
                for dtype, host in self._host[j].items():
                    self._slots[s][dtype][:host.numel()].copy_(host)
        self._occupant[s] = j
        for dtype, entries in self._entries[j].items():
            flat = self._slots[s][dtype]
            for e in entries:
                e.param.data = flat[e.offset:e.offset + e.numel].view(e.shape)
        self._stats.layer_fetches += 1
        self._stats.bytes_streamed += sum(h.numel() * h.element_size() for h in self._host[j].values())


def _frozen(layer: nn.Module) -> list[nn.Parameter]:
    """The layer's frozen parameters, each once (tied ones are listed by ``parameters()`` once)."""
    return [p for p in layer.parameters() if not p.requires_grad]
