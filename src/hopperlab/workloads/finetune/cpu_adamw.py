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

How a unit's gradients are known to be in host memory: FSDP2 sets ``.grad`` of each sharded
parameter right after it enqueued the gradient's device-to-host copy, so once every parameter
of the unit has one (the step starts with none: ``zero_grad(set_to_none=True)``), a device
synchronisation by the worker covers the copies. Only for one micro batch per step: with
gradient accumulation the run steps after backward (``overlapped`` false).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Iterable

#: how long the worker sleeps between looks at a unit's gradients
POLL_S = 0.0005

#: CPUs left to the training thread's kernel launches and NCCL's threads while the worker
#: steps during backward, where the rank's CPUs are all the host has for it
RESERVED_CPUS = 2


def optimizer_threads(threads: int, overlap: bool, host_cpus: int, ranks_on_host: int) -> int:
    """Threads of the CPU AdamW stepping beside backward. It is memory bound, and on a host
    where the rank's ``threads`` do not saturate the memory the floor's triad (measured on all
    ``threads``) is thread bound, so every thread counts: the 13B one-GPU row on 14 of its 16
    threads ran at 1.32x its floor (2026-11-28, 16 of 32 CPUs given). It leaves
    ``RESERVED_CPUS`` to the training thread only where the host (``host_cpus`` in the
    affinity mask, shared by ``ranks_on_host`` ranks) has no CPUs beside the ranks' own."""
    if not overlap or threads < 2 * RESERVED_CPUS:
        return threads
    spare = host_cpus - threads * max(1, ranks_on_host)
    return threads if spare >= RESERVED_CPUS else threads - RESERVED_CPUS


class LayerwiseAdamW:
    """One fused AdamW per unit of ``units`` (lists of parameters, in the order their
    gradients land), stepped by a worker thread during backward (``begin`` / ``finish``) or all
    at once (``step``). ``threads``: torch threads of the worker's steps (None: as set);
    ``delayed``: each unit steps with its previous step's gradients (the module's doc)."""

    def __init__(self, units: Iterable[list[Any]], lr: float, weight_decay: float,
                 device: Any, fused: bool = True, threads: int | None = None,
                 delayed: bool = False) -> None:
        import torch

        self.units = [u for u in units if u]
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

    def _landed(self, unit: list[Any]) -> bool:
        return all(p.grad is not None for p in unit if p.requires_grad)

    def _work(self) -> None:
        import torch

        try:
            if self.threads:
                torch.set_num_threads(self.threads)
            cuda = getattr(self.device, "type", str(self.device)) == "cuda"
            if cuda:
                torch.cuda.set_device(self.device)
            for i, unit in enumerate(self.units):
                while not self._landed(unit) and not self._backward_done.is_set():
                    time.sleep(POLL_S)
                if cuda:  # the unit's device-to-host gradient copies were enqueued before .grad
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
