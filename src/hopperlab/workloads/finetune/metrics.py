"""What a run reports: per-step figures, their summary, the FLOP count and MFU, peaks.

FLOPs (model FLOPs, as in MFU; recomputation by checkpointing is *not* counted, so a
checkpointed run shows the MFU it costs):

* full fine-tuning, per token: ``6 * N + 6 * L * d * T``;
* LoRA, per token: ``4 * N_frozen + 6 * N_lora + 6 * L * d * T``: the frozen weights do the
  forward product (2 N) and the product for the activations' gradient (2 N), never the one for
  their own gradient; the adapters do all three.

``N`` counts parameters that take part in matrix products (everything but the input embedding,
whose lookup is no product; the LM head counts; for a Mixture of Experts the *active* ones:
``N = N_total - N_embed - L * (E - k) * N_expert``, the router and ``k = top_k`` of the ``E``
experts per layer, since each token passes through ``k`` experts only), ``L`` layers, ``d``
the hidden size, ``T`` the sequence length; ``6 L d T`` is attention's two products (``Q K^T``
and ``P V``) over the causal half of the square (2 * 2 * d * T/2 per token and layer forward,
twice that backward): the work the causal kernels do (SDPA ``is_causal``, flash attention) and
the sharded engine's count (``step_floor.step_flops``). Until 2026-12-02 this counted the whole
square (PaLM's convention), which put a LoRA-7B run 4 % above the card's own matmul probe in
FLOP per joule (docs/benchmarks/energy.md). MFU = FLOPs per second / the GPU's dense bf16 peak
(``PEAK_BF16_FLOPS``), for fp8 runs too, so that fp8 and bf16 compare on one scale.
"""

from __future__ import annotations

import resource
import statistics
import sys
from dataclasses import dataclass, field
from typing import Sequence

from hopperlab.core.energy_names import SLOW_STEP_X, SLOW_STEPS
from hopperlab.core.stats import percentile
from hopperlab.workloads.finetune.torch.model import ModelCounts

GB = 1e9

GIB = float(1 << 30)
#: the final loss is the mean of the last few measured steps' losses (one batch is noisy)
FINAL_LOSS_STEPS = 3
#: dense bf16 tensor-core peak FLOP/s by GPU model (vendor data sheets); matched by substring
PEAK_BF16_FLOPS: tuple[tuple[str, float], ...] = (
    ("GH200", 989.4e12), ("H200", 989.4e12), ("H100 PCIe", 756.0e12), ("H100 NVL", 835.0e12),
    ("H100", 989.4e12), ("H800", 989.4e12), ("A100", 312.0e12), ("L40S", 362.0e12),
)


def flops_per_token(c: ModelCounts, seq_len: int, method: str) -> float:
    attention = 6.0 * c.layers * c.hidden * seq_len  # causal: half of the 12 L d T square
    if method == "full":
        return 6.0 * c.matmul + attention
    frozen = c.matmul - c.trainable
    return 4.0 * frozen + 6.0 * c.trainable + attention


def peak_flops(gpu_name: str | None) -> float | None:
    if not gpu_name:
        return None
    for key, flops in PEAK_BF16_FLOPS:
        if key in gpu_name:
            return flops
    return None


def host_peak_rss_gib() -> float:
    """The process's peak resident set (ru_maxrss: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / GIB if sys.platform == "darwin" else peak * 1024 / GIB


@dataclass
class StepRecord:
    step: int
    loss: float
    step_s: float
    data_wait_s: float
    tokens: int
    measured: bool
    extra: dict[str, float] = field(default_factory=dict)


def summarize(steps: Sequence[StepRecord], *, flops_token: float,
              peak: float | None) -> dict[str, float]:
    """Final figures from the measured steps (warm-up steps only give the first loss)."""
    measured = [s for s in steps if s.measured]
    if len(measured) < 1:
        raise ValueError("no measured step")
    times = [s.step_s for s in measured]
    rates = [s.tokens / s.step_s for s in measured]
    first = steps[0].loss
    tail = [s.loss for s in measured[-FINAL_LOSS_STEPS:]]
    last = statistics.fmean(tail)
    out = {
        "tokens_per_s": statistics.median(rates),
        "step_time_p50_s": percentile(times, 50),
        "step_time_p90_s": percentile(times, 90),
        "step_time_mean_s": statistics.fmean(times),
        "data_wait_fraction": sum(s.data_wait_s for s in measured) / sum(times),
        "data_wait_p50_s": percentile([s.data_wait_s for s in measured], 50),
        "tokens_per_step": float(measured[0].tokens),
        "first_loss": first,
        "final_loss": last,
        "loss_drop": first - last,
        "loss_ratio": last / first if first else float("nan"),
        "measured_steps": float(len(measured)),
        "flops_per_token": flops_token,
        "model_tflops_per_s": flops_token * statistics.median(rates) / 1e12,
        "peak_host_rss_gib": host_peak_rss_gib(),
    }
    if peak:
        out["mfu"] = flops_token * statistics.median(rates) / peak
    return out


def window_work(steps: Sequence[StepRecord]) -> dict[str, float]:
    """Over every measured step of the run (all windows: one measured region): the tokens they
    trained (``measured_tokens``, what the window's joules are divided by), the longest step and
    how many took more than ``SLOW_STEP_X`` x the median (``slow_steps``: a stall inside the
    window, which a p50 hides; issue 36 saw a 3.3 s step among 0.13 s ones)."""
    measured = [s for s in steps if s.measured]
    if not measured:
        return {}
    median = statistics.median(s.step_s for s in measured)
    return {"measured_tokens": float(sum(s.tokens for s in measured)),
            "step_time_max_s": max(s.step_s for s in measured),
            SLOW_STEPS: float(sum(s.step_s > SLOW_STEP_X * median for s in measured))}


def link_floors(final: dict[str, float], h2d_gbps: float, d2h_gbps: float, *,
                two_phase: bool) -> dict[str, float]:
    """What the host link allows a step whose techniques move ``bytes_to_host_per_step`` and
    ``bytes_from_host_per_step`` (GB/s measured on the node, pinned):

    * ``link_floor_s``: the larger direction at its rate: no step that moves these bytes can be
      shorter (the offload's floor of docs/benchmarks/finetune.md is the larger of this and the
      baseline's step, which is another run's figure);
    * ``link_two_phase_s`` (``two_phase``: activation offload alone, whose bytes leave in
      forward and come back in backward, one direction at a time): the two directions' times
      added;
    * ``step_over_link_floor`` / ``step_over_link_two_phase``: the median step against them
      (near 1: the step is the link's).
    """
    out_s = final.get("bytes_to_host_per_step", 0.0) / (d2h_gbps * GB)
    in_s = final.get("bytes_from_host_per_step", 0.0) / (h2d_gbps * GB)
    out = {"link_h2d_gbps": h2d_gbps, "link_d2h_gbps": d2h_gbps,
           "link_floor_s": max(out_s, in_s)}
    if two_phase:
        out["link_two_phase_s"] = out_s + in_s
    step = final.get("step_time_p50_s", 0.0)
    for name in ("link_floor_s", "link_two_phase_s"):
        if out.get(name, 0.0) > 0 and step > 0:
            out["step_over_" + name[:-2]] = step / out[name]
    return out
