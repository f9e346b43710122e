"""The next decoder layer's offloaded parameters copied to the GPU on a side stream while the
GPU computes this one: FSDP2 + ``CPUOffloadPolicy`` at world size 1 (issue 35).

At world size 1 FSDP2 has no all-gather to overlap: ``FSDPParamGroup.wait_for_unshard`` reads
``FSDPParam.all_gather_inputs``, which copies the host shard to the GPU (``non_blocking``) on
the *compute* stream, right before the layer's own kernels (torch 2.11 and 2.13 alike). The
2026-11-28 profile of the 13B one-GPU row found every such copy exposed: 1.019 s of a 11.0 s
step in which the GPU only copied (at 2 GPUs the same bytes ride the all-gather streams and
hide). Here a forward pre-hook on layer *i* enqueues layer *i+1*'s host shards on a copy
stream into fresh device tensors, and those FSDP parameters read the staged copy (after the
compute stream waits on its event) instead of copying again. Layers that reshard after
forward are copied again in backward (FSDP2's pre-backward, the same path): there the last
layer is staged right after its forward and layer *i-1* when layer *i*'s output gradient
arrives (a tensor hook), a layer's backward ahead. A staged copy that FSDP2 did not read
(another torch's path) is dropped at the next prefetch and counted: the record says how many
copies were read (``PrefetchCounts``), so a path that bypasses this shows as 0.

Why a per-instance subclass, not a patch of FSDP2's class: only this model's parameters change
behaviour, and only while a staged copy waits; everything else is FSDP2's own code.
The copy reads host memory the CPU AdamW writes: it is enqueued in the next step's forward,
after ``LayerwiseAdamW.finish`` joined the worker, so it reads the updated shard.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


@dataclass
class PrefetchCounts:
    """Copies this prefetcher made, and how many FSDP2 read (the rest were dropped)."""

    staged: int = 0
    read: int = 0
    dropped: int = 0

    #: whether backward stages too (layers that reshard after forward)
    backward: bool = False

    def describe(self) -> str:
        when = ("forward, and in backward the previous layer's during this layer's backward"
                if self.backward else "forward")
        return (f"next layer's host shards copied on a side stream during this layer's "
                f"{when}: {self.read} of {self.staged} staged copies read by FSDP2, "
                f"{self.dropped} dropped")


_STAGED = "_hopperlab_staged"  # (tensor, event or None) on an FSDPParam while a copy waits
_SUBCLASSES: dict[type, type] = {}


def _reading_class(base: type) -> type:
    """``base`` (FSDP2's FSDPParam) whose ``all_gather_inputs`` returns a staged copy once,
    when one waits and the parameter is plainly sharded; else FSDP2's own property."""
    if base in _SUBCLASSES:
        return _SUBCLASSES[base]

    class StagedFSDPParam(base):  # type: ignore[misc, valid-type]
        @property
        def all_gather_inputs(self) -> list[torch.Tensor]:
            staged = self.__dict__.pop(_STAGED, None)
            if staged is None:
                return super().all_gather_inputs
            tensor, event, counts = staged
            if tensor.is_cuda:
                stream = torch.cuda.current_stream(tensor.device)
                if event is not None:
                    stream.wait_event(event)
                tensor.record_stream(stream)  # the allocator reuses it only after this stream
            counts.read += 1
            dtype = getattr(self, "param_dtype", None)
            return [tensor if dtype in (None, tensor.dtype) else tensor.to(dtype)]

    StagedFSDPParam.__name__ = f"Staged{base.__name__}"
    _SUBCLASSES[base] = _SUBCLASSES[StagedFSDPParam] = StagedFSDPParam
    return StagedFSDPParam


def _fsdp_params(unit: nn.Module) -> list[Any]:
    """FSDP2's parameters of ``unit`` (a module ``fully_shard`` was applied to), or []."""
    state_of = getattr(unit, "_get_fsdp_state", None)
    if state_of is None:
        return []
    group = getattr(state_of(), "_fsdp_param_group", None)
    return list(group.fsdp_params) if group is not None else []


def _plainly_sharded(fp: Any) -> bool:
    """A parameter whose FSDP2 input is its host shard as is: offloaded, sharded, no tensor
    subclass extension (those take FSDP2's own path)."""
    local = getattr(fp, "_sharded_local_tensor", None)
    state = getattr(getattr(fp, "sharded_state", None), "name", "")
    return (bool(getattr(fp, "offload_to_cpu", False)) and state == "SHARDED"
            and hasattr(fp, "_sharded_param_data")
            and not hasattr(local, "fsdp_pre_all_gather"))


class NextLayerPrefetch:
    """Forward pre-hooks that stage ``layers[0]``'s host shards during ``root``'s forward
    (its embedding runs meanwhile) and layer *i+1*'s during layer *i* (``layers``: FSDP2 units
    in forward order); ``install`` once, after ``fully_shard`` (FSDP2 makes its parameters'
    state at lazy init, so the hooks look them up each time they run)."""

    def __init__(self, root: nn.Module, layers: list[nn.Module], device: Any) -> None:
        self.root = root
        self.layers = list(layers)
        self.device = torch.device(device)
        self.counts = PrefetchCounts()
        self._stream = (torch.cuda.Stream(self.device) if self.device.type == "cuda" else None)
        self._handles: list[Any] = []

    def install(self, backward: bool = False) -> "NextLayerPrefetch":
        """The forward's staging; with ``backward`` (layers that reshard after forward, so
        FSDP2 copies them from host again in backward, on the compute stream too) also the
        backward's: the last layer right after its forward (its backward comes first), and
        layer *i-1* when layer *i*'s output gradient arrives (its backward begins)."""
        self.counts.backward = backward
        for module, nxt in zip([self.root, *self.layers[:-1]], self.layers):
            self._handles.append(module.register_forward_pre_hook(
                lambda _m, _a, nxt=nxt: self.stage(nxt)))
        if backward and self.layers:
            for prev, layer in zip(self.layers[:-1], self.layers[1:]):
                self._handles.append(layer.register_forward_hook(
                    lambda _m, _a, out, prev=prev: self._stage_at_backward(out, prev)))
            last = self.layers[-1]
            self._handles.append(last.register_forward_hook(
                lambda _m, _a, _out: self.stage(last) if torch.is_grad_enabled() else None))
        return self

    def _stage_at_backward(self, output: Any, unit: nn.Module) -> None:
        """Stage ``unit`` when the gradient of ``output`` (the next layer's output) arrives."""
        if torch.is_grad_enabled() and isinstance(output, torch.Tensor) and output.requires_grad:
            output.register_hook(lambda _grad: self.stage(unit))

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def stage(self, unit: nn.Module) -> None:
        """Copy ``unit``'s host shards to the device on the copy stream (after what the
        compute stream has enqueued so far); a copy still waiting from before is dropped."""
        params = [fp for fp in _fsdp_params(unit) if _plainly_sharded(fp)]
        if not params:
            return
        if self._stream is not None:
            self._stream.wait_stream(torch.cuda.current_stream(self.device))
        for fp in params:
            if fp.__dict__.pop(_STAGED, None) is not None:
                self.counts.dropped += 1
            fp.__class__ = _reading_class(type(fp))  # the same class from the second time on
            host = fp._sharded_param_data
            if self._stream is None:
                tensor, event = host.to(self.device, copy=True), None
            else:
                with torch.cuda.stream(self._stream):
                    tensor = host.to(self.device, non_blocking=True)
                    event = self._stream.record_event()
            fp.__dict__[_STAGED] = (tensor, event, self.counts)
            self.counts.staged += 1
