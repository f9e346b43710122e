"""The per-step floor of a sharded fine-tuning step, from figures the run records.

Why a floor: a step's time alone does not say how much of it the platform wasted. The floor is
what the node allows for the same work: the GPU compute of this rank's micro batches measured
alone (every weight on the GPU, no optimizer, no collectives), the bytes this rank's step moves
over the host link at the node's measured pinned rate each way (compute and the two directions
overlap, so the longest of the three counts), plus the optimizer step, which nothing overlaps
(on the CPU under offload). NCCL traffic between GPUs (fsdp2 without offload) is not in it:
the floor is a lower bound. No torch here: tests feed it recorded inputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: the sharded modes (finetune.SHARDINGS) whose parameters live in host memory
OFFLOADED = ("fsdp2-cpu-offload", "torchao-cpu-offload")


@dataclass(frozen=True)
class FloorInputs:
    mode: str
    #: parameters of the whole model and bytes per element (the training dtype)
    params: int
    elt_bytes: int
    world: int
    #: seconds of forward + backward of one step's micro batches on this rank, measured alone
    compute_s: float
    #: seconds of the optimizer step (median of the measured steps)
    optimizer_s: float
    #: the node's pinned host->device and device->host GB/s (None: not measured, e.g. no GPU)
    h2d_gbps: float | None = None
    d2h_gbps: float | None = None


def link_bytes(mode: str, params: int, elt_bytes: int, world: int) -> tuple[float, float]:
    """Bytes (host->device, device->host) one step moves over this rank's host link.

    FSDP2 offload: this rank's parameter shard in for forward and again for backward, its
    gradient shard out. torchao's CPUOffloadOptimizer (one GPU, whole model): gradients out,
    updated parameters in, once each. No offload: nothing."""
    if mode not in OFFLOADED:
        return 0.0, 0.0
    share = params * elt_bytes / (world if mode.startswith("fsdp2") else 1)
    return share * (2 if mode == "fsdp2-cpu-offload" else 1), share


def step_floor(x: FloorInputs) -> dict[str, float]:
    """``step_floor_s`` and its parts (``link_floor_s`` and the bytes where the link counts)."""
    h2d, d2h = link_bytes(x.mode, x.params, x.elt_bytes, x.world)
    out: dict[str, float] = {"floor_compute_s": x.compute_s, "floor_optimizer_s": x.optimizer_s}
    link = 0.0
    if h2d or d2h:
        out.update(h2d_gb_per_step=h2d / 1e9, d2h_gb_per_step=d2h / 1e9)
        if x.h2d_gbps and x.d2h_gbps:
            link = max(h2d / (x.h2d_gbps * 1e9), d2h / (x.d2h_gbps * 1e9))
            out["link_floor_s"] = link
    out["step_floor_s"] = max(x.compute_s, link) + x.optimizer_s
    return out


#: host-memory traffic of one AdamW step per parameter, in units of the element's size:
#: parameter read and written, gradient read, both moments read and written
ADAMW_TRAFFIC = 7


def optimizer_floor(mode: str, params: int, elt_bytes: int, world: int,
                    host_gbps: float | None) -> dict[str, float]:
    """The CPU optimizer step's floor where it runs on the host (the offloaded modes): this
    rank's AdamW traffic (``ADAMW_TRAFFIC`` x its parameter share) at the host memory rate the
    job's CPUs reached (``node.host_bandwidth``). Empty elsewhere or without the rate."""
    if mode not in OFFLOADED or not host_gbps or host_gbps <= 0:
        return {}
    share = params * elt_bytes / (world if mode.startswith("fsdp2") else 1)
    traffic = ADAMW_TRAFFIC * share
    return {"optimizer_host_gb_per_step": traffic / 1e9,
            "optimizer_floor_s": traffic / (host_gbps * 1e9)}


def over_floor(step_s: float, floor: dict[str, float]) -> dict[str, float]:
    """The measured step against its floor (and against the link alone where it counts)."""
    out = {}
    if floor.get("step_floor_s", 0) > 0 and math.isfinite(step_s):
        out["step_over_floor"] = step_s / floor["step_floor_s"]
    if floor.get("link_floor_s", 0) > 0:
        out["step_over_link_floor"] = step_s / floor["link_floor_s"]
    return out


def extrapolate_layers(t_small: float, t_large: float, small: int, large: int,
                       layers: int) -> float:
    """Compute of ``layers`` decoder layers from probes of ``small`` and ``large`` layers
    (embedding, head and loss are in both): the probe need not hold the whole model."""
    if layers in (small, large):
        return t_small if layers == small else t_large
    per_layer = max(0.0, (t_large - t_small) / (large - small))
    return t_small + (layers - small) * per_layer
