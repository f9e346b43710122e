"""The per-step floor of a sharded fine-tuning step, from what the hardware does, never from
the run's own parts (issue 35: a floor that adds the run's measured optimizer step is met by
construction and hides a CPU step running at one core's rate).

Parts, each the work over a rate the job measured on its node:

- GPU compute: the step's FLOPs on this rank (``step_flops``: 6 per matmul parameter per
  token, causal attention, and the forward again under checkpointing) over the GPU's measured
  dense matmul rate (``cuda.device_rates.matmul_tflops``; on a CPU-only run, the CPU's);
- host link (the offloaded modes): the bytes this rank moves each way at the measured pinned
  rates; compute and the two directions overlap, so the longest counts;
- CPU optimizer (the offloaded modes): the AdamW traffic of every rank on the host
  (``ADAMW_TRAFFIC`` x their parameter shares) over the host triad of all the job's CPUs with
  every rank streaming at once.

``step_floor_s`` adds the CPU optimizer to the longest of compute and link when the optimizer
step runs after backward (the default: nothing overlaps it), and takes the longest of the three
when the run overlaps it with the GPU's work by design (``overlapped``); ``floor_rule`` says
which. The run's measured parts (the compute probe, ``optimizer_step_s``) stay beside it as
diagnostics. NCCL traffic between GPUs is not in it: the floor is a lower bound. No torch here:
tests feed it recorded inputs.
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
    #: FLOPs of this rank's step (``step_flops``) and the device's measured dense TFLOP/s
    flops: float
    matmul_tflops: float | None
    #: GB/s of the host memory with every rank on the host streaming at once (all the job's
    #: CPUs there), and how many ranks share it
    host_gbps: float | None = None
    ranks_on_host: int = 1
    #: the node's pinned host->device and device->host GB/s (None: not measured, e.g. no GPU)
    h2d_gbps: float | None = None
    d2h_gbps: float | None = None
    #: the CPU optimizer overlaps the GPU's work by design (the parts' longest is the floor)
    overlapped: bool = False
    #: FSDP2 frees each layer's gathered weights after its forward (its default): under
    #: offload they come over the link again for backward
    reshard_after_forward: bool = True


def step_flops(matmul_params: int, head_params: int, layers: int, hidden: int, seq_len: int,
               tokens: int, checkpointing: bool, not_recomputed: int = 0) -> float:
    """FLOPs of one step over ``tokens`` of sequences of ``seq_len``: forward and backward
    (6 per matmul parameter per token), causal attention (its score and value products: 2 x 2
    x seq/2 x hidden per layer per token forward, twice that backward), and under activation
    checkpointing the decoder layers' forward once more (the head is not recomputed, nor the
    ``not_recomputed`` matmul parameters whose outputs the run keeps)."""
    attn_fwd = 2.0 * layers * hidden * seq_len  # 4 * hidden * (seq/2) per layer, causal
    per_token = 6.0 * matmul_params + 3.0 * attn_fwd
    if checkpointing:
        per_token += 2.0 * (matmul_params - head_params - not_recomputed) + attn_fwd
    return per_token * tokens


def link_bytes(mode: str, params: int, elt_bytes: int, world: int,
               reshard_after_forward: bool = True) -> tuple[float, float]:
    """Bytes (host->device, device->host) one step moves over this rank's host link.

    FSDP2 offload: this rank's parameter shard in for forward and again for backward (once
    where the layers stay gathered from forward to backward), its gradient shard out.
    torchao's CPUOffloadOptimizer (one GPU, whole model): gradients out, updated parameters
    in, once each. No offload: nothing."""
    if mode not in OFFLOADED:
        return 0.0, 0.0
    share = params * elt_bytes / (world if mode.startswith("fsdp2") else 1)
    copies_in = 2 if mode == "fsdp2-cpu-offload" and reshard_after_forward else 1
    return share * copies_in, share


#: host-memory traffic of one AdamW step per parameter, in units of the element's size:
#: parameter read and written, gradient read, both moments read and written
ADAMW_TRAFFIC = 7


def optimizer_floor(mode: str, params: int, elt_bytes: int, world: int,
                    host_gbps: float | None, ranks_on_host: int = 1) -> dict[str, float]:
    """The CPU optimizer step's floor where it runs on the host (the offloaded modes): the
    AdamW traffic of every rank on the host (``ADAMW_TRAFFIC`` x each one's parameter share)
    at ``host_gbps``, the rate all the job's CPUs there reach streaming at once. Empty
    elsewhere or without the rate."""
    if mode not in OFFLOADED or not host_gbps or host_gbps <= 0:
        return {}
    share = params * elt_bytes / (world if mode.startswith("fsdp2") else 1)
    traffic = ADAMW_TRAFFIC * share
    return {"optimizer_host_gb_per_step": traffic / 1e9,
            "optimizer_floor_s": traffic * max(1, ranks_on_host) / (host_gbps * 1e9)}


def step_floor(x: FloorInputs) -> dict[str, float]:
    """``step_floor_s`` and its parts: ``floor_compute_s``, ``link_floor_s`` (with the bytes)
    and ``floor_optimizer_s`` (the CPU optimizer's, 0 where it runs on the GPU), and
    ``floor_overlapped`` (1: the longest part is the floor, 0: the optimizer adds). Empty
    without a measured matmul rate: a floor without its compute part would flatter the step."""
    if not x.matmul_tflops or x.matmul_tflops <= 0:
        return {}
    compute = x.flops / (x.matmul_tflops * 1e12)
    out: dict[str, float] = {"step_tflop": x.flops / 1e12, "floor_compute_s": compute}
    h2d, d2h = link_bytes(x.mode, x.params, x.elt_bytes, x.world, x.reshard_after_forward)
    link = 0.0
    if h2d or d2h:
        out.update(h2d_gb_per_step=h2d / 1e9, d2h_gb_per_step=d2h / 1e9)
        if x.h2d_gbps and x.d2h_gbps:
            link = max(h2d / (x.h2d_gbps * 1e9), d2h / (x.d2h_gbps * 1e9))
            out["link_floor_s"] = link
    opt = optimizer_floor(x.mode, x.params, x.elt_bytes, x.world, x.host_gbps, x.ranks_on_host)
    out.update(opt)
    cpu = opt.get("optimizer_floor_s", 0.0)
    out["floor_optimizer_s"] = cpu
    out["floor_overlapped"] = float(x.overlapped)
    out["step_floor_s"] = max(compute, link, cpu) if x.overlapped else max(compute, link) + cpu
    return out


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
