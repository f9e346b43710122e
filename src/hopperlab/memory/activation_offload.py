"""Asynchronous activation offload, the mechanism: saved activations go to pinned host memory
during forward and come back, ahead of use, during backward.

``ActivationOffload`` installs saved-tensor hooks (``_pack`` / ``_unpack``), copies on two side
streams (one each way, so reloads do not queue behind offloads), groups saved tensors by decoder
layer (``wrap_layers``) to prefetch them in the order backward needs them, and keeps host buffers
in a ``PinnedBufferPool``. What to offload and which reloads may start under a GPU-memory budget
is the policy's, ``offload_budget.OffloadBudget``, this class's base.

Without CUDA the same bookkeeping runs on the host (host->host copies, no streams or events), so
CI tests the logic and the exactness of the gradients. How it works, and the measurements behind
each rule: docs/memory.md ("Activation offload: how and the policy").
"""

from __future__ import annotations

import collections
import dataclasses
import weakref
from typing import Any, Callable, Iterable, Protocol

import torch
from torch import nn

from hopperlab.cuda.nvtx import OFFLOAD_COPY, OFFLOAD_PREFETCH, nvtx_range
from hopperlab.memory.offload_budget import OffloadBudget
from hopperlab.memory.pinned import PinnedBufferPool

#: below this, a saved tensor stays on the device (copy latency dominates, the gain is nil)
DEFAULT_MIN_BYTES = 1 << 20
#: where offloaded copies live: pinned host memory, or GPU memory (a diagnostic: docs/memory.md)
STAGINGS = ("host", "device")


class SavedTensorDelegate(Protocol):
    """Something that claims some saved tensors before activation offload sees them
    (parameter offload: views of its streamed weights)."""

    def try_pack(self, tensor: torch.Tensor) -> Any | None: ...

    def unpack(self, packed: Any) -> torch.Tensor: ...


# ----------------------------------------------------------------------------- statistics
@dataclasses.dataclass
class OffloadStats:
    """Counters of one step (reset when the forward context is entered)."""

    bytes_offloaded: int = 0          # device -> host, this step
    bytes_reloaded: int = 0           # host -> device, this step
    tensors_offloaded: int = 0
    tensors_kept: int = 0             # saved tensors left on the device (small, budget, layout)
    bytes_kept: int = 0               # their bytes (those above min_bytes kept by the budget)
    bytes_kept_by_budget: int = 0
    bytes_kept_last_layers: int = 0   # saved in the last ``keep_last_layers`` layers or after
    plan_bytes: int = 0               # what the budget's plan offloads this step (0: no plan)
    parameters_skipped: int = 0       # saved tensors recognised as (views of) parameters
    tensors_shared: int = 0           # saved again by another consumer: one copy serves both
    pool_bytes: int = 0               # pinned bytes the pool holds (all buffers)
    pool_new_allocations: int = 0     # pinned buffers allocated this step (0 in steady state)
    groups: int = 0                   # layer groups that had offloaded tensors
    reserve_bytes: int = 0            # the budget policy's backward reserve used this step
    transient_bytes: int = 0          # a layer's backward need above its start (prefetch room)

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


# ----------------------------------------------------------------------------- packed handles
class _Offloaded:
    """A saved tensor that lives in a host buffer; ``device_tensor`` once prefetched."""

    __slots__ = ("owner", "group", "buffer", "host", "size", "stride", "dtype", "device", "nbytes",
                 "device_tensor", "ready_event", "copy_event", "copy_seq", "users", "__weakref__")

    def __init__(self, owner: "ActivationOffload", group: int, buffer: torch.Tensor,
                 host: torch.Tensor, src: torch.Tensor):
        self.owner = owner
        self.group = group
        self.buffer = buffer
        self.host = host
        self.size = src.size()
        self.stride = src.stride()
        self.dtype = src.dtype
        self.device = src.device
        self.nbytes = src.numel() * src.element_size()
        self.device_tensor: torch.Tensor | None = None
        self.ready_event: Any = None     # end of the host->device copy (reads the buffer)
        self.copy_event: Any = None      # end of the device->host copy
        self.copy_seq = 0                # its number in the device->host stream's order
        self.users = 1                   # saved tensors (graph nodes) that share this copy

    def __del__(self) -> None:  # the graph node that held it is gone: recycle the host buffer
        try:
            self.owner._release(self)
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


# ----------------------------------------------------------------------------- the technique
class ActivationOffload(OffloadBudget):
    """Offload saved activations to pinned host memory; use as a context manager around forward.

    Args:
        device: the device the model computes on (``cuda:N``; ``cpu`` runs the bookkeeping only).
        min_bytes: saved tensors smaller than this stay on the device.
        budget_bytes: GPU-memory budget for the step's peak; ``None`` offloads all eligible tensors.
        reserve_bytes: added to the learned backward reserve of the budget policy.
        prefetch_groups: how many layer groups beyond the one being unpacked are copied back ahead.
        max_inflight_bytes: device->host copies may lag forward by this many bytes; beyond, the
            compute stream waits for the oldest copy (without it, a link slower than forward keeps
            every activation alive until its copy is over, and the peak is the baseline's).
            Under a budget the budget decides instead: copies may lag while it holds.
        keep_last_layers: saved tensors of the last this-many layers of ``wrap_layers`` (and
            those saved after them: final norm, head, loss) stay on the device: backward needs
            them first, so offloading them would cost two transfers with no compute to hide in.
        keep_head: with ``keep_last_layers=0``, keep only what is saved after the last layer
            (final norm, head, loss): the loss's log-probabilities are needed the moment backward
            starts, and the loss's backward is the step's memory peak either way.
        parameter_offload: a ``ParameterOffload`` (or any ``SavedTensorDelegate``) whose saved
            weight views are handed to it rather than offloaded (only one pair of saved-tensor hooks
            is active at a time, so this context carries both).
        staging: ``"host"`` (pinned host buffers: the technique) or ``"device"`` (buffers in GPU
            memory: a diagnostic that takes the host link out and measures the technique's own
            cost; saves no memory, so not with ``budget_bytes``).
        memory_probe: bytes currently allocated on the device, for the budget policy; default
            ``peaks.allocated_now`` (CUDA: ``torch.cuda.memory_allocated``, read cheaply) or the
            saved bytes kept this step (CPU).

    Example::

        offload = ActivationOffload("cuda", budget_bytes=40 << 30).wrap_layers(decoder_layers(model))
        offload.track_parameters(model)
        with offload:
            loss = model(**batch).loss
        loss.backward()
        stats = offload.stats()      # this step's bytes offloaded / reloaded, pool size, ...
    """

    def __init__(self, device: torch.device | str, *, min_bytes: int = DEFAULT_MIN_BYTES,
                 budget_bytes: int | None = None, reserve_bytes: int = 0, prefetch_groups: int = 1,
                 max_inflight_bytes: int = 1 << 30, keep_last_layers: int = 0,
                 keep_head: bool = False,
                 parameter_offload: SavedTensorDelegate | None = None,
                 staging: str = "host",
                 memory_probe: Callable[[], int] | None = None):
        if min_bytes < 0 or prefetch_groups < 0 or reserve_bytes < 0 or keep_last_layers < 0:
            raise ValueError("min_bytes, prefetch_groups, reserve_bytes and keep_last_layers "
                             "must be >= 0")
        if budget_bytes is not None and budget_bytes <= 0:
            raise ValueError("budget_bytes must be positive (or None: offload everything)")
        if staging not in STAGINGS:
            raise ValueError(f"staging: expected one of {', '.join(STAGINGS)}, got {staging!r}")
        if staging == "device" and budget_bytes is not None:
            raise ValueError("staging='device' keeps the copies in GPU memory (a diagnostic of "
                             "the technique's own cost): a budget cannot hold with it")
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        if self.cuda and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.staging = staging
        self.min_bytes = min_bytes
        self.prefetch_groups = prefetch_groups
        self.max_inflight_bytes = max_inflight_bytes
        self.keep_last_layers = keep_last_layers
        self.keep_head = keep_head
        self._first_kept_group: int | None = None   # set by wrap_layers
        self.delegate = parameter_offload
        on_device = staging == "device" and self.cuda
        self.pool = PinnedBufferPool(pin=self.cuda and not on_device,
                                     device=self.device if on_device else None)
        # one stream each way: in backward, reloads need not queue behind offloads still running
        self._d2h = torch.cuda.Stream(self.device) if self.cuda else None
        self._h2d = torch.cuda.Stream(self.device) if self.cuda else None
        self._buffer_events: dict[int, Any] = {}   # host buffer -> the last copy that read it
        self._inflight_bytes = 0
        self._compute: Any = None
        self._param_storages: set[int] = set()
        self._hooks: list[Any] = []
        self._saved_hooks: Any = None
        self._active = False
        self._group = 0
        self._groups: dict[int, list[Any]] = {}
        self._kept_groups: set[int] = set()       # groups with tensors kept on the device
        self._pending_groups: list[int] = []      # descending: the order backward needs them
        self._order: list[int] = []               # every group with a saved tensor, descending
        self._inflight: collections.deque[tuple[int, Any, torch.Tensor]] = collections.deque()
        self._seq = 0                             # device->host copies issued
        self._stats = OffloadStats()
        self._pool_allocations_at_start = 0
        self._by_key: dict[tuple, Any] = {}
        self._head_group: int | None = None       # the first group after the last layer
        self._head_unpacked = False
        self._init_budget(budget_bytes, reserve_bytes, memory_probe)

    # -------------------------------------------------------------- setup
    def wrap_layers(self, layers: Iterable[nn.Module]) -> "ActivationOffload":
        """Mark layer boundaries: tensors saved in layer i form group 2i+1, those saved after it
        (before the next layer) group 2i+2. Idempotent hooks: firing twice (checkpointing) is fine."""
        n = 0
        for i, layer in enumerate(layers):
            self._hooks.append(layer.register_forward_pre_hook(self._make_enter(2 * i + 1)))
            self._hooks.append(layer.register_forward_hook(self._make_exit(2 * i + 2)))
            n = i + 1
        if self.keep_last_layers:
            # the last layers' groups and everything saved after them (norm, head, loss)
            self._first_kept_group = 2 * max(0, n - self.keep_last_layers) + 1
        elif self.keep_head and n:
            self._first_kept_group = 2 * n
        self._head_group = 2 * n if n else None
        return self

    def track_parameters(self, module: nn.Module) -> "ActivationOffload":
        """Remember the storages of ``module``'s parameters (also frozen ones, also non-leaf views
        of them) so that saved tensors sharing them are never copied. Call it once the parameters
        are where they stay (after ``ParameterOffload`` has moved the streamed ones)."""
        for p in module.parameters():
            if p.numel():
                self._param_storages.add(p.untyped_storage().data_ptr())
        return self

    def remove(self) -> None:
        """Take the layer hooks away again, and let go of what an unfinished step still holds:
        the handles drop their device tensors (kept aliases, prefetched reloads), so backward
        through such a graph is no longer possible after ``remove``. (The handles close no
        reference cycle with the graph, see ``_Kept``: a failed step's activations go with its
        graph anyway; this frees them even while something still holds the graph.)"""
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        if self._d2h is not None:
            self._d2h.synchronize()       # the copies still reading device tensors are over
        self._inflight.clear()
        self._inflight_bytes = 0
        for ref, _source in list(self._by_key.values()):
            handle = ref()
            if isinstance(handle, _Kept):
                handle.tensor = None
            elif isinstance(handle, _Offloaded):
                handle.device_tensor = None
        self._by_key = {}

    def _make_enter(self, group: int) -> Callable[..., None]:
        def hook(_module: nn.Module, _args: Any) -> None:
            if self._active:
                self._group = group
        return hook

    def _make_exit(self, group: int) -> Callable[..., None]:
        def hook(_module: nn.Module, _args: Any, _out: Any) -> None:
            if self._active:
                self._group = group
        return hook

    # -------------------------------------------------------------- context
    def __enter__(self) -> "ActivationOffload":
        if self._active:
            raise RuntimeError("ActivationOffload is already active")
        self._budget_step_begins()
        self._reap(all_done_ok=False)
        self._stats = OffloadStats(**self._budget_figures())
        self._head_unpacked = False
        self._pool_allocations_at_start = self.pool.allocations
        if self.delegate is not None and hasattr(self.delegate, "reset_stats"):
            self.delegate.reset_stats()
        self._group = 0
        self._groups = {}
        self._kept_groups = set()
        self._pending_groups = []
        self._by_key = {}
        self._compute = torch.cuda.current_stream(self.device) if self.cuda else None
        self._saved_hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._saved_hooks.__enter__()
        self._active = True
        return self

    def __exit__(self, *exc: Any) -> None:
        self._active = False
        self._saved_hooks.__exit__(*exc)
        self._saved_hooks = None
        self._pending_groups = sorted(self._groups, reverse=True)
        # the prefetch window counts kept groups too: under the head, the next group backward
        # needs is the kept last layer, and the reload of the layer before it starts when that
        # layer's backward does (not during the loss's, the step's memory peak)
        self._order = sorted(set(self._groups) | self._kept_groups, reverse=True)
        self._budget_forward_ends()

    def stats(self) -> OffloadStats:
        """This step's counters (complete once backward has run)."""
        s = dataclasses.replace(self._stats)
        s.pool_bytes = self.pool.allocated_bytes
        s.pool_new_allocations = self.pool.allocations - self._pool_allocations_at_start
        s.groups = len(self._groups)
        return s

    # -------------------------------------------------------------- pack
    def _is_parameter(self, t: torch.Tensor) -> bool:
        if isinstance(t, nn.Parameter) or isinstance(t._base, nn.Parameter):
            return True
        if t.is_leaf and t.requires_grad:
            return True
        return bool(self._param_storages) and t.untyped_storage().data_ptr() in self._param_storages

    def _eligible_device(self, t: torch.Tensor) -> bool:
        if self.cuda:
            return t.device == self.device
        return t.device.type == "cpu"

    def _pack(self, t: torch.Tensor) -> Any:
        if self.delegate is not None:
            packed = self.delegate.try_pack(t)
            if packed is not None:
                return _Delegated(packed)
        if self.cuda:
            self._reap(all_done_ok=False)
        nbytes = t.numel() * t.element_size()
        if nbytes < self.min_bytes or not self._eligible_device(t) or not _dense(t):
            self._keep(nbytes)
            return t.detach()     # not t itself: see _Kept
        if self._is_parameter(t):
            self._stats.parameters_skipped += 1
            return t
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.size()), t.stride(),
               t.dtype, t._version)
        same = self._by_key.get(key)
        if same is not None:
            handle, source = same[0](), same[1]()
            # the very same tensor saved again by another consumer (its memory cannot have been
            # reused while the tensor is alive): one copy serves both
            if handle is not None and source is t:
                if isinstance(handle, _Offloaded):
                    handle.users += 1
                self._stats.tensors_shared += 1
                return handle
        if self._first_kept_group is not None and self._group >= self._first_kept_group:
            # backward starts with these: copied out at forward's end, they would come straight
            # back, two link transfers with no compute to hide under
            self._keep(nbytes)
            self._stats.bytes_kept_last_layers += nbytes
            return self._kept(key, t)
        if self._budget_keeps(nbytes):
            self._keep(nbytes)
            self._stats.bytes_kept_by_budget += nbytes
            return self._kept(key, t)
        handle = self._offload(t, nbytes)
        self._by_key[key] = (weakref.ref(handle), weakref.ref(t))
        return handle

    def _kept(self, key: tuple, t: torch.Tensor) -> "_Kept":
        """A tensor left on the device; saved again by another consumer, it is counted once
        (one allocation, as on the device)."""
        kept = _Kept(t.detach(), self._group)
        self._kept_groups.add(self._group)
        self._by_key[key] = (weakref.ref(kept), weakref.ref(t))
        return kept

    def _keep(self, nbytes: int) -> None:
        self._stats.tensors_kept += 1
        self._stats.bytes_kept += nbytes

    def _offload(self, t: torch.Tensor, nbytes: int) -> _Offloaded:
        buffer = self.pool.acquire(nbytes)
        host = buffer.view(t.dtype).as_strided(t.size(), t.stride())
        handle = _Offloaded(self, self._group, buffer, host, t)
        with nvtx_range(OFFLOAD_COPY):
            if self.cuda:
                self._d2h.wait_stream(self._compute)
                last_reader = self._buffer_events.pop(buffer.data_ptr(), None)
                if last_reader is not None:
                    self._d2h.wait_event(last_reader)
                with torch.cuda.stream(self._d2h):
                    host.copy_(t, non_blocking=True)
                event = self._d2h.record_event()
                self._seq += 1
                handle.copy_event, handle.copy_seq = event, self._seq
                self._inflight.append((self._seq, event, t))   # keeps t alive until copied
                self._inflight_bytes += nbytes
                self._throttle()
            else:
                host.copy_(t)
        self._groups.setdefault(self._group, []).append(_weak(handle))
        self._stats.tensors_offloaded += 1
        self._stats.bytes_offloaded += nbytes
        return handle

    def _reap(self, all_done_ok: bool, upto_seq: int | None = None) -> None:
        """Drop references to device tensors whose device->host copy is over (or ordered before
        what the compute stream has already waited for: ``upto_seq``)."""
        while self._inflight:
            seq, event, t = self._inflight[0]
            if (upto_seq is not None and seq <= upto_seq) or all_done_ok or event.query():
                self._inflight.popleft()
                self._inflight_bytes -= t.numel() * t.element_size()
            else:
                break

    def _throttle(self) -> None:
        """Make the compute stream wait for the oldest unfinished copies (then their device
        memory may be reused in compute-stream order): without a budget, while more than
        ``max_inflight_bytes`` lag; under a budget, while memory passes it (lagging copies are
        fine while it holds)."""
        while self._inflight:
            if self.budget_bytes is not None:
                if self._within_budget():
                    break
            elif self._inflight_bytes <= self.max_inflight_bytes:
                break
            _seq, event, t = self._inflight.popleft()
            self._compute.wait_event(event)
            self._inflight_bytes -= t.numel() * t.element_size()
            del t                       # its memory counts as free for the next test

    # -------------------------------------------------------------- unpack
    def _unpack(self, packed: Any) -> torch.Tensor:
        if isinstance(packed, torch.Tensor):
            return packed
        if isinstance(packed, _Delegated):
            return self.delegate.unpack(packed.inner)
        if isinstance(packed, _Kept):
            # nothing to copy for this one; the groups backward needs next may start
            self._prefetch_through(packed.group)
            return packed.tensor
        handle: _Offloaded = packed
        self._prefetch_through(handle.group)
        if handle.device_tensor is None:          # evicted or unpacked twice (retain_graph)
            self._copy_back([handle])
        t = handle.device_tensor
        if self.cuda:
            torch.cuda.current_stream(self.device).wait_event(handle.ready_event)
            # the reload waited for this handle's offload, which the offload stream ran after
            # all earlier ones: their source tensors may go
            self._reap(all_done_ok=False, upto_seq=handle.copy_seq)
        handle.users -= 1
        if handle.users <= 0:         # the last consumer: the device copy goes with its use
            handle.device_tensor = None
        return t

    def _prefetch_through(self, group: int) -> None:
        """Start the copies of ``group`` (and of groups skipped above it) and of the next
        ``prefetch_groups`` groups backward will need; with a budget, instead, of the groups that
        fit under it (backward frees memory as it goes). The first unpack in the
        head's group (the loss's backward: the step's peak) starts no copy beyond it."""
        new_layer = self._budget_backward_reaches(group)
        at_head = self._head_group is not None and group >= self._head_group
        in_loss = at_head and not self._head_unpacked
        self._head_unpacked = self._head_unpacked or at_head
        # under a budget every prefetch must fit; without, the window is fixed
        window = set() if in_loss or self.budget_bytes is not None \
            else set([g for g in self._order if g < group][:self.prefetch_groups])
        while self._pending_groups:
            g = self._pending_groups[0]
            if g < group and g not in window and (in_loss or not self._fits_prefetch(g)):
                break
            if self._window_holds(g):
                break                     # not while the reserve's window is open
            self._pending_groups.pop(0)
            handles = [h for h in (ref() for ref in self._groups.get(g, ())) if h is not None]
            self._copy_back([h for h in handles if h.device_tensor is None])
        if new_layer:
            self._budget_layer_starts(group)

    def _group_bytes(self, group: int) -> int:
        return sum(h.nbytes for h in (ref() for ref in self._groups.get(group, ())) if h is not None)

    def _copy_back(self, handles: list[_Offloaded]) -> None:
        if not handles:
            return
        self._budget_reload_starts()
        with nvtx_range(OFFLOAD_PREFETCH):
            # allocated on the compute stream, which uses them: the side stream first waits for
            # what the compute stream did before (earlier users of that memory)
            tensors = [torch.empty_strided(h.size, h.stride, dtype=h.dtype, device=h.device)
                       for h in handles]
            if self.cuda:
                self._h2d.wait_stream(torch.cuda.current_stream(self.device))
                latest = max(handles, key=lambda h: h.copy_seq)
                self._h2d.wait_event(latest.copy_event)   # the offloads (in order) are over
                with torch.cuda.stream(self._h2d):
                    for h, dev in zip(handles, tensors):
                        dev.copy_(h.host, non_blocking=True)
                event = self._h2d.record_event()
                for h in handles:
                    h.ready_event = event
            else:
                for h, dev in zip(handles, tensors):
                    dev.copy_(h.host)
        for h, dev in zip(handles, tensors):
            h.device_tensor = dev
            self._stats.bytes_reloaded += h.nbytes

    def _release(self, handle: _Offloaded) -> None:
        if handle.device_tensor is not None and self.cuda and handle.ready_event is not None:
            # prefetched but never used: the memory may be reused on the compute stream only
            # after the copy into it is over
            torch.cuda.current_stream(self.device).wait_event(handle.ready_event)
        handle.device_tensor = None
        # the next device->host copy into this buffer must wait for the reload that read it
        if handle.ready_event is not None:
            self._buffer_events[handle.buffer.data_ptr()] = handle.ready_event
        self.pool.release(handle.buffer)


class _Kept:
    """A saved tensor left on the device, with the group it was saved in: its unpack starts the
    prefetch of the groups backward needs next.

    It holds a detached alias, not the saved tensor: a tensor saved by the node that produced it
    (exp, softmax, ...) refers to that node through its ``grad_fn``, so holding the tensor itself
    would close a cycle through C++ that the garbage collector cannot see; a step that never runs
    its backward (it failed) would keep its activations for good. Autograd rebuilds the
    gradient edges at unpack from what it recorded, so the alias is all backward needs."""

    __slots__ = ("tensor", "group", "__weakref__")

    def __init__(self, tensor: torch.Tensor, group: int):
        self.tensor = tensor
        self.group = group


class _Delegated:
    __slots__ = ("inner",)

    def __init__(self, inner: Any):
        self.inner = inner


def _weak(handle: _Offloaded) -> Any:
    return weakref.ref(handle)


def _dense(t: torch.Tensor) -> bool:
    """Non-overlapping and dense (any dimension order): a host buffer of numel elements with
    the same strides holds it exactly, so the restored tensor has the original layout."""
    if t.is_contiguous():
        return True
    expected = 1
    dims = sorted(((st, s) for s, st in zip(t.shape, t.stride()) if s != 1))
    for stride, size in dims:
        if stride != expected:
            return False
        expected *= size
    return True


# ----------------------------------------------------------------------------- the reference
def save_on_cpu_reference(pin_memory: bool | None = None) -> Any:
    """PyTorch's own activation offload, the reference variant: every saved tensor is copied to
    (pinned) host memory in forward and back, synchronously, when backward unpacks it."""
    if pin_memory is None:
        pin_memory = torch.cuda.is_available()
    return torch.autograd.graph.save_on_cpu(pin_memory=pin_memory)
