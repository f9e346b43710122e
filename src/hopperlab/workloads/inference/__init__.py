"""inference: CPU memory as an extension of the GPU's for LLM inference (FAMILY, params).

Two studies over a causal LM driven by our own prefill + greedy decode loop, so that we decide
where every KV cache and weight lives: ``kv-cache`` (a multi-round dialogue whose idle sessions'
caches are kept, offloaded and reloaded, or recomputed) and ``weight-streaming`` (only the first
layers resident, the rest streamed from pinned host memory, against accelerate's CPU offload).
Units: bytes, GB = 1e9 bytes, GB/s, ms, tokens/s. Cheap to import (no torch): the spec layer
reads it. How each piece works: docs/benchmarks/inference.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from hopperlab.core.schema import bounded, settle_fields
from hopperlab.workloads.base import (HIGHER, LOWER, PROFILERS, Contradiction, FamilyInfo, Knobs,
                                      WorkUnit)

# each choice declared once, as the params' type (core.schema checks it); the tuples for readers
Study = Literal["kv-cache", "weight-streaming", "tensor-parallel"]
#: study tensor-parallel: decoder shapes (hidden, heads, kv heads, ffn, vocab, layers)
ModelShape = Literal["llama-2-70b", "tiny"]
TP_SHAPES: dict[str, tuple[int, int, int, int, int, int]] = {
    "llama-2-70b": (8192, 64, 8, 28672, 32000, 80), "tiny": (64, 4, 2, 128, 256, 2)}
Policy = Literal["resident", "offload", "recompute"]
Streamer = Literal["double-buffer", "accelerate"]
Dtype = Literal["bfloat16", "float16", "float32", "float64"]
STUDIES, POLICIES, STREAMERS, DTYPES = (get_args(t) for t in (Study, Policy, Streamer, Dtype))

#: What the report charts for every inference run (each run logs the ones of its study):
#: kv-cache: time to first token of resumed rounds, decode rate, reload bandwidth;
#: weight-streaming: decode rate at the run's hardest point and its share of the link's floor.
HEADLINE_METRICS: tuple[str, ...] = (
    "ttft_ms_p50", "ttft_ms_p99", "decode_tokens_per_s", "reload_gbps", "floor_fraction")


@dataclass(frozen=True)
class InferenceParams:
    #: "kv-cache" (dialogue with a KV-cache policy) or "weight-streaming"
    study: Study = "kv-cache"
    # -- kv-cache --------------------------------------------------------------------------
    #: "resident", "offload" or "recompute" (what happens to an evicted session's cache)
    policy: Policy = "resident"
    #: offload/managed: reload layer by layer while the new turn's prefill runs on the layers
    #: already back (False: reload the whole cache, then prefill)
    layered_reload: bool = True
    #: conversations served, each for ``rounds`` rounds, interleaved round-robin
    sessions: int = bounded(4, at_least=1)
    rounds: int = bounded(3, at_least=1)
    #: tokens of each session's opening context (system prompt and earlier history)
    context_tokens: int = bounded(64, at_least=1)
    #: tokens of each new user turn, and of each generated reply
    turn_tokens: int = bounded(16, at_least=1)
    reply_tokens: int = bounded(8, at_least=1)
    #: offload/recompute: caches that stay on the GPU between rounds (least recently used are
    #: evicted); resident keeps every cache
    gpu_sessions: int = bounded(1, at_least=1)
    # -- weight-streaming ------------------------------------------------------------------
    #: "double-buffer" (ours) or "accelerate" (Hugging Face accelerate's CPU offload)
    streamer: Streamer = "double-buffer"
    #: shares of the decoder layers kept on the GPU (1.0: the whole model), swept in the run
    resident_fractions: tuple[float, ...] = bounded((1.0,), at_least=0, at_most=1, min_len=1)
    #: batch sizes swept in the run (for each resident fraction)
    batch_sizes: tuple[int, ...] = bounded((1,), at_least=1, min_len=1)
    #: tokens of the prompt (prefill) and decode steps timed per point
    prompt_tokens: int = bounded(32, at_least=1)
    decode_tokens: int = bounded(8, at_least=1)
    # -- both ------------------------------------------------------------------------------
    #: untimed repetitions first (weight-streaming: decode steps; kv-cache: whole rounds of the
    #: first session, run again before the measured dialogue)
    warmup: int = bounded(1, at_least=0)
    #: model dtype
    dtype: Dtype = "bfloat16"
    seed: int = 0
    #: the node's pinned host->device GB/s for the floors; None: measured at the start of the run
    pinned_gbps: float | None = bounded(None, above=0)
    #: study tensor-parallel: a random-weights decoder of ``model_shape`` (TP_SHAPES) with
    #: ``num_layers`` of its layers (0: all), split over the run's ranks; ``requests`` timed
    #: batches of ``concurrency`` prompts of ``prompt_tokens``, each decoding ``decode_tokens``
    model_shape: ModelShape = "tiny"
    num_layers: int = bounded(0, at_least=0)
    concurrency: int = bounded(1, at_least=1)
    requests: int = bounded(2, at_least=1)
    #: tensor-parallel on a GPU: fuse the block's pieces between collectives with torch.compile
    #: (False: eager kernels, as on the CPU)
    compile_kernels: bool = True

    def __post_init__(self) -> None:
        """Types and bounds are declared on the fields (``settle_fields``); here: the fields
        that go together."""
        settle_fields(self)
        if self.streamer == "accelerate" and self.study != "weight-streaming":
            raise ValueError("streamer: accelerate is a weight-streaming peer; set "
                             "study: weight-streaming")
        if self.streamer == "accelerate" and len(self.resident_fractions) != 1:
            raise ValueError(f"resident_fractions: accelerate's dispatch cannot be undone within "
                             f"a run: give one share, got {list(self.resident_fractions)!r}")


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
                       work_label="generated tokens per joule",
                       done=("measured_generated_tokens",)),
              WorkUnit("cost_per_1k_first_tokens", "per 1000 first tokens", 1e3, "ms_each",
                       "ttft_ms_p50", work_per_j="first_tokens_per_j",
                       work_label="first tokens per joule", done=("measured_first_tokens",)))

FAMILY = FamilyInfo(
    name="inference",
    entry="hopperlab.workloads.inference.workload:run",
    sameness="hopperlab.workloads.inference.sameness:rule",
    predict="hopperlab.workloads.inference.predict:MODEL",
    supported_knobs={
        "memory": frozenset({"device", "managed"}),
        "profiler": PROFILERS,
    },
    params=InferenceParams,
    headline_metrics=HEADLINE_METRICS,
    directions=METRIC_DIRECTIONS,
    judged=("request_latency_ms_p50", "ttft_ms_p50", "decode_tokens_per_s", "reload_gbps"),
    work_units=WORK_UNITS,
    check=check,
    # loading the model takes longer than serving its sessions: windows, each with its own
    # warm-up sessions, on the one loaded model (tensor-parallel: its timed requests again,
    # after one warm-up, on the one built model)
    repeat_unit="windows",
)
