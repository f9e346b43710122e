"""FSDP2's offloaded AdamW stepped layer by layer during backward, hidden behind the GPU's work
(issue 35, item 3).

Under ``CPUOffloadPolicy`` each decoder layer's parameter shards and gradients live in host
memory and the AdamW step runs on the CPU. Stepped after backward (``torch.optim.AdamW.step``),
nothing overlaps it. Here one fused AdamW per FSDP unit (the decoder layers in backward order,
then the root's embedding, norm and head) steps on a worker thread as soon as that unit's
gradients are in host memory, while the GPU runs the backward of the layers before it: a
layer's shards are not read again before the next step's forward, so the update is the same
as the one after backward (tested against torch's reference AdamW), not a delayed one.
``finish`` joins the worker before the next forward: its wait is the exposed CPU time.

``delayed`` (off by default): ZeRO-Offload's one-step delayed parameter update, as an option
that changes the maths: each unit steps with the gradients of the step before, so the update
of step t's gradients lands at step t+1 (after that unit's backward there), step t+1's
gradients are taken at weights without it, and the first step applies none. Under FSDP2's
offload it hides no more than stepping as gradients land: the GPU reads the host shards again
in backward, so a unit cannot step before its backward of the next step either. It holds one
more set of gradients in host memory (``host_need``).

How a unit's gradients are known to be in host memory: FSDP2 records a CUDA event on its
post-reduce stream right after it enqueued a gradient's device-to-host copy
(``FSDPParam.grad_offload_event``) and only then sets ``.grad``. So once every parameter of the
unit has a ``.grad`` (the step starts with none: ``zero_grad(set_to_none=True)``), the worker
waits on those events alone (``copy_waits``): the unit's own copies, not the backward of the
layers the GPU runs meanwhile. An event already gone (None) was waited for by FSDP2 at the end
of backward. Where FSDP2 keeps no such events (another torch, no pinned memory) the worker
synchronises the device, as before (``LayerwiseAdamW.wait_kind`` says which). Only for one
micro batch per step: with gradient accumulation the run steps after backward (``overlapped``
false).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Iterable

#: how long the worker sleeps between looks at a unit's gradients
POLL_S = 0.0005

#: CPUs of the rank left to others while the worker steps during backward: one for the
#: training thread, which launches the GPU's kernels and runs FSDP2's hooks (a late launch is
#: GPU time lost), one for the driver's and NCCL's helper threads and the pinned copies' issue
RESERVED_CPUS = 2


def optimizer_threads(threads: int, overlap: bool) -> int:
    """Threads of the CPU AdamW: all the rank's ``threads`` after backward (nothing else runs
    then); beside backward (``overlap``) the rank's CPUs minus ``RESERVED_CPUS``. Only the
    CPUs the job was given count, never others in the affinity mask: a scheduler's allocation
    is the job's share of the node. The price: the AdamW is memory bound and, on a host whose
    bandwidth the rank's threads do not saturate, slower on fewer threads (13B, one GPU: 1.32x
    its floor on 14 of 16 threads, 2026-11-28); hidden behind backward, that costs the step
    nothing, while an optimizer thread on the training thread's CPU delays every launch."""
    if not overlap or threads < 2 * RESERVED_CPUS:
        return threads
    return threads - RESERVED_CPUS


def copy_waits(model: Any, units: list[list[Any]]) -> list[Any] | None:
    """For each unit, a function that waits for FSDP2's device-to-host copies of that unit's
    gradients (their ``grad_offload_event``; the module's doc), or None where the model's
    FSDP2 parameters cannot be found (the worker then synchronises the device). Look the
    events up after the first forward: FSDP2 makes its parameters' state at lazy init."""
    by_param: dict[int, Any] = {}
    for module in model.modules():
        state_of = getattr(module, "_get_fsdp_state", None)
        if state_of is None:
            continue
        state = state_of()
        groups = getattr(state, "_fsdp_param_groups", None)
        if groups is None:
            group = getattr(state, "_fsdp_param_group", None)
            groups = [group] if group is not None else []
        for group in groups:
            for fsdp_param in group.fsdp_params:
                by_param[id(fsdp_param.sharded_param)] = fsdp_param
    if not by_param or any(id(p) not in by_param or not hasattr(by_param[id(p)],
                                                                 "grad_offload_event")
                           for unit in units for p in unit):
        return None

    def waiter(fsdp_params: list[Any]) -> Any:
        def wait() -> None:
            for fp in fsdp_params:
                event = fp.grad_offload_event  # None: a blocking copy, or FSDP2 waited already
                if event is not None:
                    event.synchronize()
        return wait

    return [waiter([by_param[id(p)] for p in unit]) for unit in units]


class LayerwiseAdamW:
    """One fused AdamW per unit of ``units`` (lists of parameters, in the order their
    gradients land), stepped by a worker thread during backward (``begin`` / ``finish``) or all
    at once (``step``). ``threads``: torch threads of the worker's steps (None: as set);
    ``delayed``: each unit steps with its previous step's gradients (the module's doc);
    ``model``: the FSDP2 model whose gradient-copy events the worker waits on (``copy_waits``;
    None: a device synchronisation per unit)."""

    def __init__(self, units: Iterable[list[Any]], lr: float, weight_decay: float,
                 device: Any, fused: bool = True, threads: int | None = None,
                 delayed: bool = False, model: Any = None) -> None:
        import torch

        self.units = [u for u in units if u]
        self.model = model
        self._waits: list[Any] | None = None
        #: how the worker knows a unit's gradients are in host memory (for the record)
        self.wait_kind = "none (CPU)"
        self.optimizers = [torch.optim.AdamW(u, lr=lr, weight_decay=weight_decay, fused=fused)
                           for u in self.units]
        self.device = device
        self.threads = threads
        self.delayed = delayed
        #: delayed: each unit's gradients of the step before, applied at this step
        self._held: list[list[Any] | None] = [None] * len(self.units)
        self.busy_s = 0.0  # seconds in AdamW steps of the last step (the CPU optimizer's time)
        self._worker: threading.Thread | None = None
        self._backward_done = threading.Event()
        self._error: BaseException | None = None

    def begin(self) -> None:
        """Start the worker: call right before the step's (last) backward."""
        if self._worker is not None:
            raise RuntimeError("LayerwiseAdamW.begin: the previous step was not finished")
        self._backward_done.clear()
        self._error = None
        self.busy_s = 0.0
        if self._cuda() and self._waits is None and self.model is not None:
            self._waits = copy_waits(self.model, self.units)  # after forward: FSDP2's lazy init
        if self._cuda():
            self.wait_kind = ("FSDP2's gradient-copy events, per unit" if self._waits is not None
                              else "device synchronize, per unit")
        self._worker = threading.Thread(target=self._work, name="layerwise-adamw", daemon=True)
        self._worker.start()

    def finish(self) -> float:
        """Wait for the worker (backward is over); returns the seconds waited: the exposed
        CPU time. Re-raises what the worker raised."""
        if self._worker is None:
            raise RuntimeError("LayerwiseAdamW.finish without begin")
        t0 = time.perf_counter()
        self._backward_done.set()
        self._worker.join()
        self._worker = None
        waited = time.perf_counter() - t0
        if self._error is not None:
            raise self._error
        return waited

    def step(self) -> None:
        """Every unit at once, after backward (the sequential reference)."""
        t0 = time.perf_counter()
        for i in range(len(self.units)):
            self._step_unit(i)
        self.busy_s = time.perf_counter() - t0

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=set_to_none)

    def _step_unit(self, i: int) -> None:
        """Unit ``i``'s AdamW step: with its gradients now, or (``delayed``) with those of the
        step before, keeping the new ones for the next step (none before: no update)."""
        if not self.delayed:
            self.optimizers[i].step()
            return
        unit = self.units[i]
        fresh = [p.grad for p in unit]
        held, self._held[i] = self._held[i], fresh
        if held is None:
            return
        for p, grad in zip(unit, held):
            p.grad = grad
        try:
            self.optimizers[i].step()
        finally:
            for p, grad in zip(unit, fresh):
                p.grad = grad

    def _cuda(self) -> bool:
        return getattr(self.device, "type", str(self.device)) == "cuda"

    def _landed(self, unit: list[Any]) -> bool:
        return all(p.grad is not None for p in unit if p.requires_grad)

    def _work(self) -> None:
        import torch

        try:
            if self.threads:
                torch.set_num_threads(self.threads)
            cuda = self._cuda()
            if cuda:
                torch.cuda.set_device(self.device)
            for i, unit in enumerate(self.units):
                while not self._landed(unit) and not self._backward_done.is_set():
                    time.sleep(POLL_S)
                if cuda and self._waits is not None:  # the unit's own gradient copies
                    self._waits[i]()
                elif cuda:  # every queued GPU op: the copies, and the backward after them
                    torch.cuda.synchronize(self.device)
                t0 = time.perf_counter()
                self._step_unit(i)
                self.busy_s += time.perf_counter() - t0
        except BaseException as exc:  # noqa: BLE001 - handed to the training thread by finish
            self._error = exc


def fsdp_units(model: Any) -> list[list[Any]]:
    """The model's parameters by FSDP unit in the order backward finishes them: the decoder
    layers last to first, then what the root unit holds (embedding, final norm, head)."""
    layers = list(model.layers)
    in_layers = {id(p) for layer in layers for p in layer.parameters()}
    root = [p for p in model.parameters() if id(p) not in in_layers]
    return [list(layer.parameters()) for layer in reversed(layers)] + [root]
