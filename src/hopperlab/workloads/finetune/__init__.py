"""finetune: LoRA and full fine-tuning of Llama models on Dolly, under the memory techniques.

The study of the source talk (LoRA of Llama-2-7B on Dolly-15k: data-loader workers, activation
offload, unified memory, FP8) and the slides' single-GPU 70B LoRA, as one training loop whose
knobs dispatch to ``hopperlab.memory`` (``techniques.py``). Two backends: ``torch``
(transformers + peft, this package) and ``nemo`` (NeMo in the site's ``nemo`` container,
``nemo.py``). The family declares its knobs' values here (``FAMILY.supported_knobs``; the
``offload`` knob with what each value offloads, ``OFFLOADS``). What each knob does:
docs/benchmarks/finetune.md ("The family in one page").

This module is imported by the spec layer: it stays cheap (no torch).
"""

from __future__ import annotations

from dataclasses import dataclass

from hopperlab.workloads.base import (HIGHER, LOWER, PROFILERS, Contradiction, FamilyInfo, Knobs,
                                      WorkUnit)
from hopperlab.workloads.finetune.moe_config import check_assets

BACKENDS = ("torch", "nemo", "sharded")
#: backend sharded: how the full fine-tune is spread (sharded.py)
SHARDINGS = ("fsdp2", "fsdp2-cpu-offload", "torchao-cpu-offload")
#: backend sharded: Llama shapes built with random weights (hidden, heads, ffn, vocab, layers)
SHAPES = {"llama-2-13b": (5120, 40, 13824, 32000, 40), "tiny": (64, 4, 128, 256, 2)}
METHODS = ("lora", "full")
WEIGHTS = ("random", "pretrained")
DATA_SOURCES = ("prepared", "tokenize", "synthetic")
ACTIVATION_OFFLOADS = ("async", "save_on_cpu")
DTYPES = ("bfloat16", "float32")
MANAGED_ADVICE = ("none", "preferred_device", "accessed_by", "both")
OFFLOAD_STAGINGS = ("host", "device")
#: the ``offload`` knob, the family's one declaration of it: each value and what it offloads
OFFLOADS: dict[str, frozenset[str]] = {
    "none": frozenset(), "activations": frozenset({"activations"}),
    "parameters": frozenset({"parameters"}), "both": frozenset({"activations", "parameters"})}

#: The figures the report charts for every finetune run.
HEADLINE_METRICS: tuple[str, ...] = (
    "tokens_per_s", "step_time_p50_s", "peak_gpu_allocated_gib", "mfu", "data_wait_fraction",
    "loss_drop")


@dataclass(frozen=True)
class FinetuneParams:
    #: "torch" (transformers + peft in this process) or "nemo" (the NeMo container)
    backend: str = "torch"
    #: "lora" (frozen base, peft adapters) or "full" (every weight trained)
    method: str = "lora"
    #: "random": the architecture of the model asset with random weights (performance studies);
    #: "pretrained": the asset's weights (a random-weights asset is refused)
    weights: str = "pretrained"
    #: dtype of the model's weights (LoRA adapters stay float32, as peft makes them)
    dtype: str = "bfloat16"
    #: on CUDA with bfloat16 weights: forward under torch.autocast(bfloat16), so the float32
    #: adapters compute (and save their activations) in bf16 too
    autocast: bool = True
    lora_rank: int = 32
    lora_alpha: int = 64
    lora_dropout: float = 0.0
    lora_targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    learning_rate: float = 1e-4
    #: method full with bfloat16 weights: AdamW steps float32 master copies of the weights with
    #: float32 states (master_weights.py), as Megatron-LM's --bf16 and AMP training do: 16 bytes
    #: per parameter instead of 8
    master_weights: bool = False
    weight_decay: float = 0.0
    seq_len: int = 2048
    micro_batch: int = 4
    #: steps run before the measured ones (compilation, allocator warm-up); excluded from figures
    warmup_steps: int = 2
    measured_steps: int = 10
    seed: int = 0
    #: "prepared" (the pre-tokenized asset of role data), "tokenize" (records of role records,
    #: tokenized in the loader's workers with the tokenizer of role tokenizer) or "synthetic"
    #: (random tokens of the right shape)
    data: str = "prepared"
    #: when the data assets are not built: use synthetic tokens (tagged) instead of failing
    synthetic_if_missing: bool = False
    pin_memory: bool = True
    #: offload: activations|both: "async" (hopperlab.memory.activation_offload) or
    #: "save_on_cpu" (torch.autograd.graph.save_on_cpu(pin_memory=True), the reference)
    activation_offload: str = "async"
    #: the GPU-memory budget of the async activation offload, GiB (None: offload everything)
    offload_budget_gib: float | None = None
    #: with offload_budget_gib: cap the caching allocator at the budget as well
    #: (torch.cuda.set_per_process_memory_fraction), so the memory it reserves stays under it
    #: too (it frees cached blocks before it would pass the cap; an allocation the cap cannot
    #: hold fails as out of memory); not with memory: managed
    offload_budget_caps_allocator: bool = False
    #: saved tensors smaller than this stay on the GPU
    offload_min_bytes: int = 1 << 20
    #: activation offload keeps the saved tensors of the last this-many decoder layers (and the
    #: head's) on the GPU: backward needs them first (memory.activation_offload)
    offload_keep_last_layers: int = 0
    #: with offload_keep_last_layers 0: keep only the head's saved tensors (final norm, loss)
    offload_keep_head: bool = False
    #: device->host copies may lag forward by this many MiB before forward waits for them
    offload_max_inflight_mib: int = 1024
    #: where the async offload's copies go: "host" (pinned host memory: the technique) or
    #: "device" (GPU memory: a diagnostic that takes the host link out of the step and leaves
    #: the technique's own cost; it saves no memory and is not allowed with a budget)
    offload_staging: str = "host"
    #: activation checkpointing of each decoder layer (combinable with offload)
    checkpointing: bool = False
    #: Llama's RMSNorms and SiLU product recomputed in backward, saving 23% of a layer's
    #: activations without recomputing a matrix product (memory.recompute_elementwise);
    #: combinable with offload and checkpointing, not with compile (inductor decides itself)
    recompute_elementwise: bool = False
    #: the causal-LM loss computed in chunks of this many tokens, its gradient with it, so the
    #: float32 logits of the whole batch never exist (memory.chunked_cross_entropy; 2-3 GiB less
    #: at the loss's peak for Llama-2-7B at 4 x 2048); None: transformers' own loss
    loss_chunk_tokens: int | None = None
    #: CUDA caching allocator with expandable segments: reserved memory stays close to allocated
    #: (a GPU-memory budget is about what the GPU holds); not with memory: managed
    expandable_segments: bool = False
    #: offload: parameters|both: decoder layers kept resident on the GPU, and layers prefetched
    resident_layers: int = 0
    prefetch_layers: int = 1
    #: torch.compile each decoder layer (the bf16 + compile baseline of fp8; fp8 always compiles)
    compile: bool = False
    #: only the first N decoder layers of the architecture (None: all): for a 70B run on a host
    #: too small for all 80 layers; runs tag the layer count and report per-layer figures
    num_layers: int | None = None
    #: memory: managed: cudaMemAdvise of each new block ("none", "preferred_device",
    #: "accessed_by", "both") and whether to prefetch each new block to the GPU
    managed_advise: str = "preferred_device"
    managed_prefetch: bool = False
    #: memory: managed: this variant asks for more managed memory than the GPU has (the
    #: source talk's full fine-tuning of Llama-2-7B on one GH200): run only on a Grace Hopper
    #: node or a site with allow_oversubscription: true, skipped before any allocation elsewhere
    oversubscribe: bool = False
    #: backend torch: the saved-tensor census (memory.saved_tensor_census) of one extra,
    #: unmeasured step after warm-up: census_* metrics, artifacts/census.json and census.csv
    census: bool = False
    #: nemo backend: the NeMo recipe (a Llama-2-7B LoRA fine-tuning on Dolly by default)
    #: backend sharded: fsdp2 | fsdp2-cpu-offload | torchao-cpu-offload, over a random-weights
    #: Llama ``model_shape`` (SHAPES; ``num_layers`` overrides its layers) and random tokens;
    #: ``global_batch`` rows per optimizer step (0: micro_batch x world size)
    sharding: str = "fsdp2"
    model_shape: str = "tiny"
    global_batch: int = 0
    nemo_recipe: str = "llama2_7b"
    #: nemo backend: extra arguments appended to the command (key=value overrides)
    nemo_extra: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        choices = {"backend": BACKENDS, "method": METHODS, "weights": WEIGHTS,
                   "data": DATA_SOURCES, "activation_offload": ACTIVATION_OFFLOADS,
                   "dtype": DTYPES, "managed_advise": MANAGED_ADVICE,
                   "offload_staging": OFFLOAD_STAGINGS, "sharding": SHARDINGS,
                   "model_shape": tuple(SHAPES)}
        for name, allowed in choices.items():
            value = getattr(self, name)
            if value not in allowed:
                raise ValueError(f"{name}: expected one of {', '.join(allowed)}, got {value!r}")
        if self.master_weights is True and (self.method != "full" or self.dtype != "bfloat16"):
            raise ValueError("master_weights: float32 masters of bfloat16 weights: needs method "
                             "full and dtype bfloat16")
        for name in ("oversubscribe", "census", "master_weights"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}: expected true or false, got {getattr(self, name)!r}")
        if self.census and self.backend != "torch":
            raise ValueError(f"census: only with backend torch (the hooks run in this process), "
                             f"not {self.backend}")
        positive = ("lora_rank", "lora_alpha", "seq_len", "micro_batch", "measured_steps")
        for name in positive:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected a whole number of at least 1, got {value!r}")
        if isinstance(self.prefetch_layers, bool) or not isinstance(self.prefetch_layers, int) \
                or self.prefetch_layers < 1:
            raise ValueError(f"prefetch_layers: expected at least 1 (the layer being fetched "
                             f"while one computes), got {self.prefetch_layers!r}")
        for name in ("warmup_steps", "resident_layers", "offload_min_bytes",
                     "offload_keep_last_layers", "offload_max_inflight_mib"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name}: expected a whole number of 0 or more, got {value!r}")
        if self.measured_steps < 2:
            raise ValueError("measured_steps: expected at least 2 (a loss drop needs two)")
        if not 0.0 <= self.lora_dropout < 1.0:
            raise ValueError(f"lora_dropout: expected 0 <= p < 1, got {self.lora_dropout!r}")
        if self.learning_rate <= 0:
            raise ValueError(f"learning_rate: expected > 0, got {self.learning_rate!r}")
        if self.offload_budget_gib is not None and self.offload_budget_gib <= 0:
            raise ValueError(f"offload_budget_gib: expected > 0 GiB, got "
                             f"{self.offload_budget_gib!r}")
        if self.offload_staging == "device" and self.offload_budget_gib is not None:
            raise ValueError("offload_staging: device keeps the copies in GPU memory (a "
                             "diagnostic); it cannot be combined with offload_budget_gib")
        if self.offload_budget_caps_allocator and self.offload_budget_gib is None:
            raise ValueError("offload_budget_caps_allocator: needs offload_budget_gib (the cap "
                             "is the budget)")
        if self.loss_chunk_tokens is not None and (
                isinstance(self.loss_chunk_tokens, bool) or not isinstance(self.loss_chunk_tokens, int)
                or self.loss_chunk_tokens < 1):
            raise ValueError(f"loss_chunk_tokens: expected a whole number of at least 1 (or null: "
                             f"transformers' loss), got {self.loss_chunk_tokens!r}")
        if self.num_layers is not None and self.num_layers < 1:
            raise ValueError(f"num_layers: expected at least 1, got {self.num_layers!r}")
        if self.recompute_elementwise and self.compile:
            raise ValueError("recompute_elementwise: not with compile (torch.compile's partitioner "
                             "chooses what to recompute in a compiled layer itself)")
        object.__setattr__(self, "lora_targets", tuple(self.lora_targets))
        object.__setattr__(self, "nemo_extra", tuple(self.nemo_extra))
        if self.method == "lora" and not self.lora_targets:
            raise ValueError("lora_targets: LoRA needs at least one target module name")


def check(knobs: Knobs, params: FinetuneParams) -> None:
    """Refuse a variant whose knobs contradict its params (``FamilyInfo.check``); beyond
    ``oversubscribe``, what the torch backend's techniques cannot combine (techniques.py)."""
    if params.oversubscribe and knobs.memory != "managed":
        raise Contradiction("memory", f"{knobs.memory!r}, but oversubscribe: needs the knob memory: "
                            f"managed (only managed memory can exceed the GPU's)")
    if params.backend != "torch":
        return
    if knobs.memory == "managed":
        for name in ("expandable_segments", "offload_budget_caps_allocator"):
            if getattr(params, name):
                raise Contradiction("memory", f"managed, but {name}: not with memory: managed "
                                    f"(the managed allocator replaces the caching allocator)")
    if OFFLOADS[knobs.offload] == {"activations", "parameters"} and \
            params.activation_offload == "save_on_cpu":
        raise Contradiction("offload", f"{knobs.offload}, but activation_offload: save_on_cpu "
                            f"cannot be combined with parameter offload (one pair of saved-tensor "
                            f"hooks at a time); use async")
    if knobs.precision == "fp8" and params.recompute_elementwise:
        raise Contradiction("precision", "fp8, but recompute_elementwise: not with precision fp8 "
                            "or compile (torch.compile's partitioner chooses what to recompute)")


#: which way each figure is better, what a run's cost is divided by, and link floors
METRIC_DIRECTIONS = {"tokens_per_s": HIGHER, "step_time_p50_s": LOWER, "peak_gpu_allocated_gib": LOWER,
              "mfu": HIGHER, "data_wait_fraction": LOWER, "loss_drop": HIGHER,
              "link_floor_s": LOWER, "step_over_link_floor": LOWER}
WORK_UNITS = (WorkUnit("cost_per_1m_train_tokens", "per 1M training tokens", 1e6, "per_s",
                       "tokens_per_s", work_per_j="train_tokens_per_j",
                       work_label="training tokens per joule"),)
FLOORS = {"step_time_p50_s": "link_floor_s"}

FAMILY = FamilyInfo(
    name="finetune",
    entry="hopperlab.workloads.finetune.workload:run",
    predict="hopperlab.workloads.finetune.predict:MODEL",
    supported_knobs={
        "num_workers": frozenset(range(0, 65)),
        "offload": frozenset(OFFLOADS),
        "memory": frozenset({"device", "managed"}),
        "precision": frozenset({"bf16", "fp8"}),
        "profiler": PROFILERS,
    },
    params=FinetuneParams,
    headline_metrics=HEADLINE_METRICS,
    charts="hopperlab.workloads.finetune.charts:charts",
    directions=METRIC_DIRECTIONS,
    work_units=WORK_UNITS,
    floors=FLOORS,
    check_assets=check_assets,
    check=check,
    # building a 7B model takes longer than its measured steps: windows of measured steps
    # (the torch backend; sharded and NeMo runs fall back to reruns)
    repeat_unit="windows",
)
