"""inference: CPU memory as an extension of the GPU's for LLM inference (FAMILY, params).

Two studies over a causal LM driven by our own prefill + greedy decode loop, so that we decide
where every KV cache and weight lives: ``kv-cache`` (a multi-round dialogue whose idle sessions'
caches are kept, offloaded and reloaded, or recomputed) and ``weight-streaming`` (only the first
layers resident, the rest streamed from pinned host memory, against accelerate's CPU offload).
Units: bytes, GB = 1e9 bytes, GB/s, ms, tokens/s. Cheap to import (no torch): the spec layer
reads it. How each piece works: docs/benchmarks/inference.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hopperlab.workloads.base import (HIGHER, LOWER, PROFILERS, Contradiction, FamilyInfo, Knobs,
                                      WorkUnit)

STUDIES = ("kv-cache", "weight-streaming", "tensor-parallel")
#: study tensor-parallel: decoder shapes (hidden, heads, kv heads, ffn, vocab, layers)
TP_SHAPES = {"llama-2-70b": (8192, 64, 8, 28672, 32000, 80), "tiny": (64, 4, 2, 128, 256, 2)}
POLICIES = ("resident", "offload", "recompute")
STREAMERS = ("double-buffer", "accelerate")
DTYPES = ("bfloat16", "float16", "float32", "float64")

#: What the report charts for every inference run (each run logs the ones of its study):
#: kv-cache: time to first token of resumed rounds, decode rate, reload bandwidth;
#: weight-streaming: decode rate at the run's hardest point and its share of the link's floor.
HEADLINE_METRICS: tuple[str, ...] = (
    "ttft_ms_p50", "ttft_ms_p99", "decode_tokens_per_s", "reload_gbps", "floor_fraction")


@dataclass(frozen=True)
class InferenceParams:
    #: "kv-cache" (dialogue with a KV-cache policy) or "weight-streaming"
    study: str = "kv-cache"
    # -- kv-cache --------------------------------------------------------------------------
    #: "resident", "offload" or "recompute" (what happens to an evicted session's cache)
    policy: str = "resident"
    #: offload/managed: reload layer by layer while the new turn's prefill runs on the layers
    #: already back (False: reload the whole cache, then prefill)
    layered_reload: bool = True
    #: conversations served, each for ``rounds`` rounds, interleaved round-robin
    sessions: int = 4
    rounds: int = 3
    #: tokens of each session's opening context (system prompt and earlier history)
    context_tokens: int = 64
    #: tokens of each new user turn, and of each generated reply
    turn_tokens: int = 16
    reply_tokens: int = 8
    #: offload/recompute: caches that stay on the GPU between rounds (least recently used are
    #: evicted); resident keeps every cache
    gpu_sessions: int = 1
    # -- weight-streaming ------------------------------------------------------------------
    #: "double-buffer" (ours) or "accelerate" (Hugging Face accelerate's CPU offload)
    streamer: str = "double-buffer"
    #: shares of the decoder layers kept on the GPU (1.0: the whole model), swept in the run
    resident_fractions: tuple[float, ...] = (1.0,)
    #: batch sizes swept in the run (for each resident fraction)
    batch_sizes: tuple[int, ...] = (1,)
    #: tokens of the prompt (prefill) and decode steps timed per point
    prompt_tokens: int = 32
    decode_tokens: int = 8
    # -- both ------------------------------------------------------------------------------
    #: untimed repetitions first (weight-streaming: decode steps; kv-cache: whole rounds of the
    #: first session, run again before the measured dialogue)
    warmup: int = 1
    #: model dtype
    dtype: str = "bfloat16"
    seed: int = 0
    #: the node's pinned host->device GB/s for the floors; None: measured at the start of the run
    pinned_gbps: float | None = None
    #: study tensor-parallel: a random-weights decoder of ``model_shape`` (TP_SHAPES) with
    #: ``num_layers`` of its layers (0: all), split over the run's ranks; ``requests`` timed
    #: batches of ``concurrency`` prompts of ``prompt_tokens``, each decoding ``decode_tokens``
    model_shape: str = "tiny"
    num_layers: int = 0
    concurrency: int = 1
    requests: int = 2
    #: tensor-parallel on a GPU: fuse the block's pieces between collectives with torch.compile
    #: (False: eager kernels, as on the CPU)
    compile_kernels: bool = True

    def __post_init__(self) -> None:
        choices = {"study": STUDIES, "policy": POLICIES, "streamer": STREAMERS, "dtype": DTYPES,
                   "model_shape": tuple(TP_SHAPES)}
        for name, allowed in choices.items():
            value = getattr(self, name)
            if value not in allowed:
                raise ValueError(f"{name}: expected one of {', '.join(allowed)}, got {value!r}")
        positive = ("sessions", "rounds", "context_tokens", "turn_tokens", "reply_tokens",
                    "gpu_sessions", "prompt_tokens", "decode_tokens", "concurrency", "requests")
        for name in positive:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected a whole number of at least 1, got {value!r}")
        if isinstance(self.num_layers, bool) or not isinstance(self.num_layers, int) \
                or self.num_layers < 0:
            raise ValueError(f"num_layers: expected 0 (all) or more, got {self.num_layers!r}")
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, int) or self.warmup < 0:
            raise ValueError(f"warmup: expected 0 or more, got {self.warmup!r}")
        fractions = tuple(self.resident_fractions)
        batches = tuple(self.batch_sizes)
        object.__setattr__(self, "resident_fractions", fractions)
        object.__setattr__(self, "batch_sizes", batches)
        if not fractions or any(isinstance(f, bool) or not isinstance(f, (int, float))
                                or not 0.0 <= f <= 1.0 or math.isnan(f) for f in fractions):
            raise ValueError(f"resident_fractions: expected shares between 0 and 1, got "
                             f"{list(fractions)!r}")
        if not batches or any(isinstance(b, bool) or not isinstance(b, int) or b < 1
                              for b in batches):
            raise ValueError(f"batch_sizes: expected whole numbers of at least 1, got "
                             f"{list(batches)!r}")
        if self.pinned_gbps is not None and (isinstance(self.pinned_gbps, bool)
                                             or not self.pinned_gbps > 0):
            raise ValueError(f"pinned_gbps: expected a positive GB/s or null, got "
                             f"{self.pinned_gbps!r}")
        if self.streamer == "accelerate" and self.study != "weight-streaming":
            raise ValueError("streamer: accelerate is a weight-streaming peer; set "
                             "study: weight-streaming")
        if self.streamer == "accelerate" and len(fractions) != 1:
            raise ValueError(f"resident_fractions: accelerate's dispatch cannot be undone within "
                             f"a run: give one share, got {list(fractions)!r}")


def check(knobs: Knobs, params: InferenceParams) -> None:
    """Refuse a variant whose knobs contradict its params (``FamilyInfo.check``)."""
    if knobs.memory == "managed" and not (params.study == "kv-cache"
                                          and params.policy == "offload"):
        raise Contradiction("memory", f"managed keeps evicted KV caches in managed memory; it "
                            f"needs study: kv-cache and policy: offload (got study "
                            f"{params.study!r}, policy {params.policy!r})")


#: which way each figure is better and what a run's cost is divided by
METRIC_DIRECTIONS = {"request_latency_ms_p50": LOWER, "allreduce_share": LOWER,
              "ttft_ms_p50": LOWER, "ttft_ms_p99": LOWER, "decode_tokens_per_s": HIGHER,
              "reload_gbps": HIGHER, "floor_fraction": HIGHER}
WORK_UNITS = (WorkUnit("cost_per_1m_generated_tokens", "per 1M generated tokens", 1e6, "per_s",
                       "decode_tokens_per_s", work_per_j="generated_tokens_per_j",
                       work_label="generated tokens per joule"),
              WorkUnit("cost_per_1k_first_tokens", "per 1000 first tokens", 1e3, "ms_each",
                       "ttft_ms_p50", work_per_j="first_tokens_per_j",
                       work_label="first tokens per joule"))

FAMILY = FamilyInfo(
    name="inference",
    entry="hopperlab.workloads.inference.workload:run",
    predict="hopperlab.workloads.inference.predict:MODEL",
    supported_knobs={
        "memory": frozenset({"device", "managed"}),
        "profiler": PROFILERS,
    },
    params=InferenceParams,
    headline_metrics=HEADLINE_METRICS,
    directions=METRIC_DIRECTIONS,
    work_units=WORK_UNITS,
    check=check,
    # loading the model takes longer than serving its sessions: windows, each with its own
    # warm-up sessions, on the one loaded model (tensor-parallel runs fall back to reruns)
    repeat_unit="windows",
)
