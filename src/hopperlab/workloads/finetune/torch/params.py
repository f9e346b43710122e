"""The torch engine's params and check (transformers + peft in the job's process): the memory
techniques' settings, Liger's kernels, managed memory, the census. Cheap (no torch)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from hopperlab.core.schema import bounded, settle_fields
from hopperlab.workloads.base import Contradiction, Knobs
from hopperlab.workloads.finetune.common import LoraParams, engine_knobs

ActivationOffload = Literal["async", "save_on_cpu"]
ManagedAdvice = Literal["none", "preferred_device", "accessed_by", "both"]
OffloadStaging = Literal["host", "device"]
#: Liger Kernel's fused Triton kernels for Llama (fused_kernels.py)
LigerKernel = Literal["rms_norm", "rope", "swiglu", "fused_linear_cross_entropy"]
LIGER_KERNELS: tuple[str, ...] = get_args(LigerKernel)
#: the ``offload`` knob, the family's one declaration of it: each value and what it offloads
OFFLOADS: dict[str, frozenset[str]] = {
    "none": frozenset(), "activations": frozenset({"activations"}),
    "parameters": frozenset({"parameters"}), "both": frozenset({"activations", "parameters"})}

SUPPORTED_KNOBS = engine_knobs(num_workers=range(0, 65), offload=OFFLOADS,
                               memory=["device", "managed"], precision=["bf16", "fp8"])


@dataclass(frozen=True)
class TorchParams(LoraParams):
    #: the engine: transformers + peft in this process
    backend: Literal["torch"] = "torch"
    #: on CUDA with bfloat16 weights: forward under torch.autocast(bfloat16), so the float32
    #: adapters compute (and save their activations) in bf16 too
    autocast: bool = True
    lora_dropout: float = bounded(0.0, at_least=0, below=1)
    #: method full with bfloat16 weights: AdamW steps float32 master copies of the weights with
    #: float32 states (master_weights.py), as Megatron-LM's --bf16 and AMP training do: 16 bytes
    #: per parameter instead of 8
    master_weights: bool = False
    pin_memory: bool = True
    #: offload: activations|both: "async" (hopperlab.memory.activation_offload) or
    #: "save_on_cpu" (torch.autograd.graph.save_on_cpu(pin_memory=True), the reference)
    activation_offload: ActivationOffload = "async"
    #: the GPU-memory budget of the async activation offload, GiB (None: offload everything)
    offload_budget_gib: float | None = bounded(None, above=0)
    #: with offload_budget_gib: cap the caching allocator at the budget as well
    #: (torch.cuda.set_per_process_memory_fraction), so the memory it reserves stays under it
    #: too; not with memory: managed
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
    #: "device" (GPU memory: a diagnostic that takes the host link out of the step; it saves
    #: no memory and is not allowed with a budget)
    offload_staging: OffloadStaging = "host"
    #: Llama's RMSNorms and SiLU product recomputed in backward (memory.recompute_elementwise);
    #: combinable with offload and checkpointing, not with compile (inductor decides itself)
    recompute_elementwise: bool = False
    #: the causal-LM loss computed in chunks of this many tokens, its gradient with it, so the
    #: float32 logits of the whole batch never exist (memory.chunked_cross_entropy); None:
    #: transformers' own loss
    loss_chunk_tokens: int | None = bounded(None, at_least=1)
    #: CUDA caching allocator with expandable segments; not with memory: managed
    expandable_segments: bool = False
    #: offload: parameters|both: decoder layers kept resident on the GPU, and layers prefetched
    resident_layers: int = bounded(0, at_least=0)
    prefetch_layers: int = bounded(1, at_least=1, why="the layer being fetched while one computes")
    #: on CUDA: Liger Kernel's Triton kernels in the Llama (fused_kernels.py), each recorded
    #: (tag finetune.liger); a run without CUDA is skipped, saying so. Not with compile or fp8,
    #: nor with the techniques that replace the same forwards
    liger: tuple[LigerKernel, ...] = ()
    #: torch.compile each decoder layer (the bf16 + compile baseline of fp8; fp8 always compiles)
    compile: bool = False
    #: only the first N decoder layers of the architecture (None: all)
    num_layers: int | None = bounded(None, at_least=1)
    #: memory: managed: cudaMemAdvise of each new block and whether to prefetch it to the GPU
    managed_advise: ManagedAdvice = "preferred_device"
    managed_prefetch: bool = False
    #: memory: managed: this variant asks for more managed memory than the GPU has: run only on
    #: a Grace Hopper node or a site with allow_oversubscription: true, skipped elsewhere
    oversubscribe: bool = False
    #: the saved-tensor census (memory.saved_tensor_census) of one extra, unmeasured step after
    #: warm-up: census_* metrics, artifacts/census.json and census.csv
    census: bool = False

    def __post_init__(self) -> None:
        """Types and bounds are declared on the fields (``settle_fields``); here: the fields
        that go together."""
        settle_fields(self)
        if self.master_weights and (self.method != "full" or self.dtype != "bfloat16"):
            raise ValueError("master_weights: float32 masters of bfloat16 weights: needs method "
                             "full and dtype bfloat16")
        if self.offload_staging == "device" and self.offload_budget_gib is not None:
            raise ValueError("offload_staging: device keeps the copies in GPU memory (a "
                             "diagnostic); it cannot be combined with offload_budget_gib")
        if self.offload_budget_caps_allocator and self.offload_budget_gib is None:
            raise ValueError("offload_budget_caps_allocator: needs offload_budget_gib (the cap "
                             "is the budget)")
        if self.recompute_elementwise and self.compile:
            raise ValueError("recompute_elementwise: not with compile (torch.compile's partitioner "
                             "chooses what to recompute in a compiled layer itself)")
        self._check_liger()
        self.check_lora()

    def _check_liger(self) -> None:
        """What Liger's kernels cannot go with: a compiled layer, and the techniques that
        replace the same forwards."""
        if not self.liger:
            return
        twice = sorted({k for k in self.liger if self.liger.count(k) > 1})
        if twice:
            raise ValueError(f"liger: {', '.join(twice)} named twice")
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


def check(knobs: Knobs, params: TorchParams) -> None:
    """What the torch engine's techniques cannot combine with the knobs (techniques.py)."""
    if params.oversubscribe and knobs.memory != "managed":
        raise Contradiction("memory", f"{knobs.memory!r}, but oversubscribe: needs the knob memory: "
                            f"managed (only managed memory can exceed the GPU's)")
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
