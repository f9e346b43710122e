"""What this node's memory holds of a sharded run: the host memory an offloading run needs,
checked before any of it is allocated (``check_host_memory``, ``host_need``), and how many
layers keep their MLP's up-projection in the GPU's memory (``MlpUpFitting``, ``mlp_up_fit``).
``plan`` is the engine's ``Plan``."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist

from hopperlab.core.rundir import SkipRun
from hopperlab.workloads.base import Recording
from hopperlab.memory import mlp_up_fit
from hopperlab.workloads.finetune.sharded import host_need
from hopperlab.workloads.finetune.sharded.llama import Llama, Shape, keep_mlp_up
from hopperlab.workloads.finetune.sharded.plan import Plan


class MlpUpFitting:
    """The two sizing steps of ``mlp_up_fit`` (the first two warm-up steps): after the first
    (none kept) as many of the last layers keep their up-projection as an estimate fits above
    its GPU memory peak; after the second, more join at the rate a keeping layer measured. The
    same number on every rank (the fewest any rank holds); recorded. A CPU run keeps what
    was asked (no GPU memory to fit)."""

    def __init__(self, model: Llama, plan: Plan, recorder: Recording, cuda: bool, device: Any,
                 world: int) -> None:
        self.model, self.plan, self.recorder = model, plan, recorder
        self.cuda, self.device, self.world = cuda, device, world
        self.first: mlp_up_fit.Fit | None = None

    def keep(self, n: int) -> int:
        """The last ``n`` layers keep their up-projection (``mlp_up_fit``'s ``keep``)."""
        return keep_mlp_up(self.model, n)

    def after_step(self, step: int) -> None:
        if step > 1:
            return
        if not self.cuda:
            if step == 0:
                self._cpu()
            return
        peak = torch.cuda.max_memory_allocated(self.device)
        if step == 0:
            free, _ = torch.cuda.mem_get_info(self.device)
            capacity = free + torch.cuda.memory_reserved(self.device)  # what torch can hold
            self.first = self._agree(mlp_up_fit.fit(
                self.keep, len(self.model.layers), model_shape(self.model),
                self.plan.mlp_up_saved_layers,
                self.plan.micro_batch * self.plan.seq_len,
                torch.finfo(self.plan.dtype).bits // 8, peak, capacity))
            torch.cuda.reset_peak_memory_stats(self.device)  # the next step's own peak
            return
        assert self.first is not None
        outcome = self._agree(mlp_up_fit.refine(self.keep, self.first, peak))
        self.recorder.log_metrics(mlp_up_saved_layers=float(outcome.kept),
                                  mlp_up_fit_peak_gib=outcome.peak_bytes / 2**30,
                                  mlp_up_fit_second_peak_gib=peak / 2**30,
                                  mlp_up_layer_gib=outcome.layer_bytes / 2**30)
        self.recorder.set_tag("finetune.mlp_up_saved", outcome.describe())

    def _agree(self, outcome: mlp_up_fit.Fit) -> mlp_up_fit.Fit:
        """The fewest layers any rank can keep, kept on every rank."""
        if self.world == 1:
            return outcome
        fewest = torch.tensor([outcome.kept], device=self.device)
        dist.all_reduce(fewest, op=dist.ReduceOp.MIN)
        if int(fewest.item()) == outcome.kept:
            return outcome
        return replace(outcome, kept=keep_mlp_up(self.model, int(fewest.item())))

    def _cpu(self) -> None:
        kept = keep_mlp_up(self.model, self.plan.mlp_up_saved_layers)
        self.recorder.log_metric("mlp_up_saved_layers", float(kept))
        self.recorder.set_tag("finetune.mlp_up_saved", (
            f"the last {kept} of {len(self.model.layers)} decoder layers keep their MLP's "
            f"up-projection: not fitted (no GPU memory to fit: a CPU run keeps what was asked)"))


def check_host_memory(plan: Plan, world: int, recorder: Recording, device: Any,
                      meminfo: str | None = None) -> None:
    """Skip, with the figures, an offloading run this node's free host memory cannot hold
    (``host_need``), before any of it is allocated; log the estimate either way. ``meminfo``:
    /proc/meminfo's text (read when not given)."""
    from pathlib import Path

    model = Llama(plan.shape, plan.dtype, "meta")
    elt = torch.finfo(plan.dtype).bits // 8
    split = world if plan.mode.startswith("fsdp2") else 1
    local = [-(-p.shape[0] // split) * (p.numel() // p.shape[0]) * elt
             for p in model.parameters()]
    need = host_need.host_bytes(plan.mode, local, exact_params=True,
                                delayed=plan.delayed_update)
    recorder.log_metric("host_need_gb", need / 1e9)
    need *= max(1, min(world, torch.cuda.device_count()))  # this node's ranks share its memory
    try:
        free = host_need.available_bytes(meminfo if meminfo is not None
                                         else Path("/proc/meminfo").read_text())
    except OSError:
        free = None
    short = torch.tensor([float(free is not None and need > free)], device=device)
    if world > 1:  # every rank skips or none does: a lone skip would leave its peers waiting
        dist.all_reduce(short, op=dist.ReduceOp.MAX)
    if short.item():
        raise SkipRun(f"{plan.mode} of {plan.shape.layers} layers needs about {need / 1e9:.0f} GB "
                      f"of host memory for this node's ranks (pinned parameters and gradients, "
                      f"AdamW states); this node has {(free or 0) / 1e9:.0f} GB available")


def model_shape(model: Llama) -> Shape:
    """The shape a built model has (its first layer's projections; the vocabulary's head)."""
    layer = model.layers[0]
    hidden = layer.qkv.in_features
    return Shape(hidden=hidden, heads=layer.heads, ffn=layer.down.in_features,
                 vocab=model.head.out_features, layers=len(model.layers))
