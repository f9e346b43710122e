"""finetune: LoRA and full fine-tuning of Llama models on Dolly, under the memory techniques.

The study of the source talk (LoRA of Llama-2-7B on Dolly-15k: data-loader workers, activation
offload, unified memory, FP8) and the slides' single-GPU 70B LoRA, as one training loop whose
knobs dispatch to ``hopperlab.memory`` (``techniques.py``). Two backends: ``torch``
(transformers + peft, this package) and ``nemo`` (NVIDIA's megatron-core, in a child
process: ``nemo.py``). The family declares its knobs' values here (``FAMILY.supported_knobs``; the
``offload`` knob with what each value offloads, ``OFFLOADS``). What each knob does:
docs/benchmarks/finetune.md ("The family in one page").

This module is imported by the spec layer: it stays cheap (no torch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Mapping, get_args

from hopperlab.core.errors import SpecError
from hopperlab.core.schema import bounded, settle_fields
from hopperlab.workloads.base import (HIGHER, LOWER, PROFILERS, Contradiction, FamilyInfo, Knobs,
                                      WorkUnit)
from hopperlab.workloads.finetune.moe_config import check_model_asset

# each choice declared once, as the params' type (core.schema checks it); the tuples for readers
Backend = Literal["torch", "nemo", "sharded"]
#: backend sharded: how the full fine-tune is spread (sharded.py)
Sharding = Literal["fsdp2", "fsdp2-cpu-offload", "torchao-cpu-offload"]
#: backend sharded: Llama shapes built with random weights (hidden, heads, ffn, vocab, layers)
ModelShape = Literal["llama-2-13b", "tiny"]
SHAPES: dict[str, tuple[int, int, int, int, int]] = {
    "llama-2-13b": (5120, 40, 13824, 32000, 40), "tiny": (64, 4, 128, 256, 2)}
Method = Literal["lora", "full"]
Weights = Literal["random", "pretrained"]
DataSource = Literal["prepared", "tokenize", "synthetic"]
ActivationOffload = Literal["async", "save_on_cpu"]
Dtype = Literal["bfloat16", "float32"]
ManagedAdvice = Literal["none", "preferred_device", "accessed_by", "both"]
OffloadStaging = Literal["host", "device"]
#: backend torch: Liger Kernel's fused Triton kernels for Llama (fused_kernels.py)
LigerKernel = Literal["rms_norm", "rope", "swiglu", "fused_linear_cross_entropy"]
BACKENDS, SHARDINGS, METHODS, WEIGHTS = (get_args(t) for t in (Backend, Sharding, Method, Weights))
DATA_SOURCES, ACTIVATION_OFFLOADS, DTYPES = (get_args(t) for t in (DataSource, ActivationOffload,
                                                                    Dtype))
MANAGED_ADVICE, OFFLOAD_STAGINGS = get_args(ManagedAdvice), get_args(OffloadStaging)
LIGER_KERNELS: tuple[str, ...] = get_args(LigerKernel)
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
    #: "torch" (transformers + peft in this process) or "nemo" (megatron-core, nemo.py)
    backend: Backend = "torch"
    #: "lora" (frozen base, peft adapters) or "full" (every weight trained)
    method: Method = "lora"
    #: "random": the architecture of the model asset with random weights (performance studies);
    #: "pretrained": the asset's weights (a random-weights asset is refused)
    weights: Weights = "pretrained"
    #: dtype of the model's weights (LoRA adapters stay float32, as peft makes them)
    dtype: Dtype = "bfloat16"
    #: on CUDA with bfloat16 weights: forward under torch.autocast(bfloat16), so the float32
    #: adapters compute (and save their activations) in bf16 too
    autocast: bool = True
    lora_rank: int = bounded(32, at_least=1)
    lora_alpha: int = bounded(64, at_least=1)
    lora_dropout: float = bounded(0.0, at_least=0, below=1)
    lora_targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    learning_rate: float = bounded(1e-4, above=0)
    #: method full with bfloat16 weights: AdamW steps float32 master copies of the weights with
    #: float32 states (master_weights.py), as Megatron-LM's --bf16 and AMP training do: 16 bytes
    #: per parameter instead of 8
    master_weights: bool = False
    weight_decay: float = 0.0
    seq_len: int = bounded(2048, at_least=1)
    micro_batch: int = bounded(4, at_least=1)
    #: steps run before the measured ones (compilation, allocator warm-up); excluded from figures
    warmup_steps: int = bounded(2, at_least=0)
    measured_steps: int = bounded(10, at_least=2, why="a loss drop needs two")
    seed: int = 0
    #: "prepared" (the pre-tokenized asset of role data), "tokenize" (records of role records,
    #: tokenized in the loader's workers with the tokenizer of role tokenizer) or "synthetic"
    #: (random tokens of the right shape)
    data: DataSource = "prepared"
    #: when the data assets are not built: use synthetic tokens (tagged) instead of failing
    synthetic_if_missing: bool = False
    pin_memory: bool = True
    #: offload: activations|both: "async" (hopperlab.memory.activation_offload) or
    #: "save_on_cpu" (torch.autograd.graph.save_on_cpu(pin_memory=True), the reference)
    activation_offload: ActivationOffload = "async"
    #: the GPU-memory budget of the async activation offload, GiB (None: offload everything)
    offload_budget_gib: float | None = bounded(None, above=0)
    #: with offload_budget_gib: cap the caching allocator at the budget as well
    #: (torch.cuda.set_per_process_memory_fraction), so the memory it reserves stays under it
    #: too (it frees cached blocks before it would pass the cap; an allocation the cap cannot
    #: hold fails as out of memory); not with memory: managed
    offload_budget_caps_allocator: bool = False
    #: saved tensors smaller than this stay on the GPU
    offload_min_bytes: int = bounded(1 << 20, at_least=0)
    #: activation offload keeps the saved tensors of the last this-many decoder layers (and the
    #: head's) on the GPU: backward needs them first (memory.activation_offload)
    offload_keep_last_layers: int = bounded(0, at_least=0)
    #: with offload_keep_last_layers 0: keep only the head's saved tensors (final norm, loss)
    offload_keep_head: bool = False
    #: device->host copies may lag forward by this many MiB before forward waits for them
    offload_max_inflight_mib: int = bounded(1024, at_least=0)
    #: where the async offload's copies go: "host" (pinned host memory: the technique) or
    #: "device" (GPU memory: a diagnostic that takes the host link out of the step and leaves
    #: the technique's own cost; it saves no memory and is not allowed with a budget)
    offload_staging: OffloadStaging = "host"
    #: activation checkpointing of each decoder layer (combinable with offload)
    checkpointing: bool = False
    #: Llama's RMSNorms and SiLU product recomputed in backward, saving 23% of a layer's
    #: activations without recomputing a matrix product (memory.recompute_elementwise);
    #: combinable with offload and checkpointing, not with compile (inductor decides itself)
    recompute_elementwise: bool = False
    #: the causal-LM loss computed in chunks of this many tokens, its gradient with it, so the
    #: float32 logits of the whole batch never exist (memory.chunked_cross_entropy; 2-3 GiB less
    #: at the loss's peak for Llama-2-7B at 4 x 2048); None: transformers' own loss. Backend
    #: sharded: the same chunked loss inside its Llama's forward (llama.Llama)
    loss_chunk_tokens: int | None = bounded(None, at_least=1)
    #: CUDA caching allocator with expandable segments: reserved memory stays close to allocated
    #: (a GPU-memory budget is about what the GPU holds); not with memory: managed
    expandable_segments: bool = False
    #: offload: parameters|both: decoder layers kept resident on the GPU, and layers prefetched
    resident_layers: int = bounded(0, at_least=0)
    prefetch_layers: int = bounded(1, at_least=1, why="the layer being fetched while one computes")
    #: backend torch, on CUDA: Liger Kernel's Triton kernels in the Llama: rms_norm, rope,
    #: swiglu, fused_linear_cross_entropy (the loss without the batch's logits); any of them,
    #: each recorded (tag finetune.liger); a run without CUDA is skipped, saying so
    #: (fused_kernels.py). Not with compile or fp8 (inductor fuses the layer itself), nor with
    #: the techniques that replace the same forwards (recompute_elementwise: norms and SwiGLU;
    #: loss_chunk_tokens: the loss)
    liger: tuple[LigerKernel, ...] = ()
    #: torch.compile each decoder layer (the bf16 + compile baseline of fp8; fp8 always compiles;
    #: backend sharded: each layer's forward with its checkpoint inside, llama.compile_layers)
    compile: bool = False
    #: only the first N decoder layers of the architecture (None: all): for a 70B run on a host
    #: too small for all 80 layers; runs tag the layer count and report per-layer figures
    num_layers: int | None = bounded(None, at_least=1)
    #: memory: managed: cudaMemAdvise of each new block ("none", "preferred_device",
    #: "accessed_by", "both") and whether to prefetch each new block to the GPU
    managed_advise: ManagedAdvice = "preferred_device"
    managed_prefetch: bool = False
    #: memory: managed: this variant asks for more managed memory than the GPU has (the
    #: source talk's full fine-tuning of Llama-2-7B on one GH200): run only on a Grace Hopper
    #: node or a site with allow_oversubscription: true, skipped before any allocation elsewhere
    oversubscribe: bool = False
    #: backend torch: the saved-tensor census (memory.saved_tensor_census) of one extra,
    #: unmeasured step after warm-up: census_* metrics, artifacts/census.json and census.csv
    census: bool = False
    #: backend sharded: fsdp2 | fsdp2-cpu-offload | torchao-cpu-offload, over a random-weights
    #: Llama ``model_shape`` (SHAPES; ``num_layers`` overrides its layers) and random tokens;
    #: ``global_batch`` rows per optimizer step (0: micro_batch x world size)
    sharding: Sharding = "fsdp2"
    #: backend sharded, fsdp2-cpu-offload: step each FSDP unit's CPU AdamW during backward as
    #: its gradients land in host memory (the same update, hidden behind the GPU's backward;
    #: cpu_adamw.py); false: one step after backward
    overlap_optimizer: bool = False
    #: backend sharded, fsdp2-cpu-offload: ZeRO-Offload's one-step delayed parameter update
    #: (each unit steps with the step before's gradients; other maths: the record's tag
    #: finetune.cpu_optimizer says so; cpu_adamw.py)
    delayed_update: bool = False
    #: backend sharded: one extra step after the measured ones under torch.profiler, reduced
    #: to where the GPU's time went (diag_* figures: busy, idle, kernels by kind, copies and
    #: their rate; step_profile.py); GPU runs only
    diagnose_step: bool = False
    #: backend sharded, fsdp2 and fsdp2-cpu-offload: FSDP2's option for the decoder layers;
    #: false keeps each layer's gathered parameters from its forward to its backward (one
    #: host-to-device copy of the weights per step under offload instead of two: ZeRO-Offload's
    #: weights on the GPU during the step), for the memory of one unsharded model
    reshard_after_forward: bool = True
    #: backend sharded, fsdp2-cpu-offload at world size 1: copy the next decoder layer's host
    #: shards to the GPU on a side stream while this one computes (h2d_prefetch.py); FSDP2
    #: copies them on the compute stream there. Ignored (and said so) at larger world sizes
    h2d_prefetch: bool = True
    #: backend sharded with checkpointing: the last N decoder layers keep their MLP's
    #: up-projection output and input instead of recomputing them in backward (13B at 65,536
    #: tokens: about 3.4 GiB of GPU memory per layer, measured on an H200, for 18.6 TFLOP
    #: less; llama.keep_mlp_up)
    mlp_up_saved_layers: int = bounded(0, at_least=0)
    #: backend sharded on a GPU: ``mlp_up_saved_layers`` is the most; two more warm-up steps
    #: measure the memory peak with none kept and what a keeping layer adds, and as many of
    #: the last layers keep as the GPU's memory holds (mlp_up_fit.py; the record says how many
    #: and why)
    mlp_up_fit: bool = False
    model_shape: ModelShape = "tiny"
    global_batch: int = bounded(0, at_least=0)
    #: unused since backend nemo runs megatron-core (nemo.py), not the NeMo CLI: kept so that
    #: the spec.json files of earlier runs (which carry them) still load
    nemo_recipe: str = "llama2_7b"
    nemo_extra: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        """Types and bounds are declared on the fields (``settle_fields``); here: the fields
        that go together."""
        settle_fields(self)
        if self.master_weights and (self.method != "full" or self.dtype != "bfloat16"):
            raise ValueError("master_weights: float32 masters of bfloat16 weights: needs method "
                             "full and dtype bfloat16")
        if self.delayed_update and self.sharding != "fsdp2-cpu-offload":
            raise ValueError(f"delayed_update: only with sharding fsdp2-cpu-offload (its CPU "
                             f"AdamW), not {self.sharding}")
        if not self.reshard_after_forward and not (self.backend == "sharded"
                                                   and self.sharding.startswith("fsdp2")):
            raise ValueError(f"reshard_after_forward: false is FSDP2's option (backend sharded, "
                             f"sharding fsdp2 or fsdp2-cpu-offload), not backend {self.backend} "
                             f"sharding {self.sharding}")
        if self.mlp_up_saved_layers and not (self.backend == "sharded" and self.checkpointing):
            raise ValueError(f"mlp_up_saved_layers: what the sharded backend's checkpointed "
                             f"layers keep (backend sharded, checkpointing true), not backend "
                             f"{self.backend} with checkpointing {str(self.checkpointing).lower()}")
        if self.mlp_up_fit and not self.mlp_up_saved_layers:
            raise ValueError("mlp_up_fit: fits up to mlp_up_saved_layers keeping layers into the "
                             "GPU's memory: set mlp_up_saved_layers (the most) too")
        if self.diagnose_step and self.backend != "sharded":
            raise ValueError(f"diagnose_step: only with backend sharded (its step), not "
                             f"{self.backend}")
        if self.census and self.backend != "torch":
            raise ValueError(f"census: only with backend torch (the hooks run in this process), "
                             f"not {self.backend}")
        if self.offload_staging == "device" and self.offload_budget_gib is not None:
            raise ValueError("offload_staging: device keeps the copies in GPU memory (a "
                             "diagnostic); it cannot be combined with offload_budget_gib")
        if self.expandable_segments and self.backend == "nemo":
            raise ValueError(f"expandable_segments: an allocator setting the torch and sharded "
                             f"backends apply (memory/caching_allocator.py); backend "
                             f"{self.backend} does not apply it")
        if self.offload_budget_caps_allocator and self.offload_budget_gib is None:
            raise ValueError("offload_budget_caps_allocator: needs offload_budget_gib (the cap "
                             "is the budget)")
        if self.recompute_elementwise and self.compile:
            raise ValueError("recompute_elementwise: not with compile (torch.compile's partitioner "
                             "chooses what to recompute in a compiled layer itself)")
        if self.backend == "nemo" and self.method != "lora":
            raise ValueError(f"method: {self.method}, but backend nemo builds NeMo's LoRA recipe "
                             f"only (method: lora)")
        self._check_liger()
        if self.method == "lora" and not self.lora_targets:
            raise ValueError("lora_targets: LoRA needs at least one target module name")


    def _check_liger(self) -> None:
        """What Liger's kernels cannot go with: another backend, a compiled layer, and the
        techniques that replace the same forwards."""
        if not self.liger:
            return
        twice = sorted({k for k in self.liger if self.liger.count(k) > 1})
        if twice:
            raise ValueError(f"liger: {', '.join(twice)} named twice")
        if self.backend != "torch":
            raise ValueError(f"liger: Liger Kernel is applied by backend torch (transformers' "
                             f"Llama), not backend {self.backend}")
        if self.compile:
            raise ValueError("liger: not with compile (inductor fuses the compiled layer's "
                             "norms, RoPE and SwiGLU itself); set liger: [] there")
        clash = {"rms_norm", "swiglu"} & set(self.liger)
        if self.recompute_elementwise and clash:
            raise ValueError(f"liger: {', '.join(sorted(clash))} not with "
                             f"recompute_elementwise (both replace the norms' and the MLP's "
                             f"forward)")
        if self.loss_chunk_tokens is not None and "fused_linear_cross_entropy" in self.liger:
            raise ValueError("liger: fused_linear_cross_entropy not with loss_chunk_tokens "
                             "(both replace the loss: use one)")


def check(knobs: Knobs, params: FinetuneParams) -> None:
    """Refuse a variant whose knobs contradict its params (``FamilyInfo.check``); beyond
    ``oversubscribe``, what the torch backend's techniques cannot combine (techniques.py)."""
    if params.oversubscribe and knobs.memory != "managed":
        raise Contradiction("memory", f"{knobs.memory!r}, but oversubscribe: needs the knob memory: "
                            f"managed (only managed memory can exceed the GPU's)")
    if params.backend == "nemo" and knobs.memory == "managed":
        raise Contradiction("memory", "managed, but backend: nemo has no managed-memory setting "
                            "(NeMo allocates through its own caching allocator); use memory: "
                            "device or backend: torch")
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
    if knobs.precision == "fp8" and params.liger:
        raise Contradiction("precision", "fp8, but liger: fp8 compiles each layer (inductor "
                            "fuses it); set liger: [] there")
    if knobs.precision == "fp8" and params.recompute_elementwise:
        raise Contradiction("precision", "fp8, but recompute_elementwise: not with precision fp8 "
                            "or compile (torch.compile's partitioner chooses what to recompute)")


def check_assets(params: FinetuneParams, knobs: Knobs, assets: Mapping[str, Any],
                 where: str) -> None:
    """The run against its model asset (``FamilyInfo.check_assets``): what a hopperlab-moe
    config cannot take (moe_config.py), and parameter offload, which moves transformers'
    decoder layers (our MoE decoder's layers are not those)."""
    moe = check_model_asset(params, assets, where)
    if moe and params.liger:
        raise SpecError(f"{where}.liger: Liger's kernels patch transformers' Llama; the "
                        f"hopperlab-moe decoder is our own module (set liger: [])")
    if moe and "parameters" in OFFLOADS[knobs.offload]:
        raise SpecError(f"{where}.offload: {knobs.offload}, but parameter offload is not "
                        f"implemented for the hopperlab-moe decoder (its layers are not "
                        f"transformers layers); offload activations only")


#: which way each figure is better, what a run's cost is divided by, and link floors
METRIC_DIRECTIONS = {"tokens_per_s": HIGHER, "step_time_p50_s": LOWER, "peak_gpu_allocated_gib": LOWER,
              "mfu": HIGHER, "data_wait_fraction": LOWER, "loss_drop": HIGHER,
              "link_floor_s": LOWER, "step_over_link_floor": LOWER}
WORK_UNITS = (WorkUnit("cost_per_1m_train_tokens", "per 1M training tokens", 1e6, "per_s",
                       "tokens_per_s", work_per_j="train_tokens_per_j",
                       work_label="training tokens per joule",
                       done=("measured_tokens",)),)
FLOORS = {"step_time_p50_s": "link_floor_s"}

FAMILY = FamilyInfo(
    name="finetune",
    entry="hopperlab.workloads.finetune.workload:run",
    sameness="hopperlab.workloads.finetune.sameness:rule",
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
    tables="hopperlab.workloads.finetune.tables:tables",
    directions=METRIC_DIRECTIONS,
    judged=("tokens_per_s", "step_time_p50_s"),
    work_units=WORK_UNITS,
    floors=FLOORS,
    check_assets=check_assets,
    check=check,
    # building a 7B model takes longer than its measured steps: windows of measured steps
    # (the torch and sharded backends; NeMo runs fall back to reruns)
    repeat_unit="windows",
)
