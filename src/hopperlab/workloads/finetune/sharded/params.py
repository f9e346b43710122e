"""The sharded engine's params: full fine-tuning of our own Llama shape (random weights, random
tokens) sharded by FSDP2 or torchao's CPU offload. It honours none of the knobs' techniques
(no offload knob, device memory, bf16; no data loader): what it offloads is ``sharding``'s.
Cheap (no torch)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hopperlab.core.schema import bounded, settle_fields
from hopperlab.workloads.finetune.common import CommonParams, engine_knobs

#: how the full fine-tune is spread (engine.py)
Sharding = Literal["fsdp2", "fsdp2-cpu-offload", "torchao-cpu-offload"]
#: Llama shapes built with random weights (hidden, heads, ffn, vocab, layers)
ModelShape = Literal["llama-2-13b", "tiny"]
SHAPES: dict[str, tuple[int, int, int, int, int]] = {
    "llama-2-13b": (5120, 40, 13824, 32000, 40), "tiny": (64, 4, 128, 256, 2)}

#: random tokens (no data loader); what it offloads is the sharding's (fsdp2-cpu-offload,
#: torchao-cpu-offload), not the offload knob's; device memory; the dtype param says bfloat16 or
#: float32, and no layer is fp8
SUPPORTED_KNOBS = engine_knobs(num_workers=[0], offload=["none"], memory=["device"],
                               precision=["bf16"])


@dataclass(frozen=True)
class ShardedParams(CommonParams):
    #: the engine: FSDP2 / torchao over our own Llama (engine.py)
    backend: Literal["sharded"] = "sharded"
    method: Literal["full"] = "full"
    weights: Literal["random"] = "random"
    #: fsdp2 | fsdp2-cpu-offload | torchao-cpu-offload, over the Llama ``model_shape`` (SHAPES;
    #: ``num_layers`` overrides its layers); ``global_batch`` rows per optimizer step (0:
    #: micro_batch x world size)
    sharding: Sharding = "fsdp2"
    model_shape: ModelShape = "tiny"
    global_batch: int = bounded(0, at_least=0)
    num_layers: int | None = bounded(None, at_least=1)
    #: torch.compile each layer's forward with its checkpoint inside (llama.compile_layers)
    compile: bool = False
    #: the chunked loss inside the Llama's forward (llama.Llama); None: the whole batch's logits
    loss_chunk_tokens: int | None = bounded(None, at_least=1)
    #: CUDA caching allocator with expandable segments (memory/caching_allocator.py)
    expandable_segments: bool = False
    #: one extra step after the measured ones under torch.profiler (diag_* figures;
    #: step_profile.py); GPU runs only
    diagnose_step: bool = False
    #: with checkpointing: the last N decoder layers keep their MLP's up-projection output and
    #: input instead of recomputing them in backward (llama.keep_mlp_up)
    mlp_up_saved_layers: int = bounded(0, at_least=0)
    #: on a GPU: as many of the last ``mlp_up_saved_layers`` keep as the GPU's memory holds,
    #: measured in two more warm-up steps (mlp_up_fit.py; the record says how many and why)
    mlp_up_fit: bool = False
    #: fsdp2-cpu-offload: step each FSDP unit's CPU AdamW during backward as its gradients land
    #: in host memory (memory/cpu_adamw.py); false: one step after backward
    overlap_optimizer: bool = False
    #: fsdp2-cpu-offload: ZeRO-Offload's one-step delayed parameter update (tag
    #: finetune.cpu_optimizer says so; memory/cpu_adamw.py)
    delayed_update: bool = False
    #: fsdp2-cpu-offload at world size 1: copy the next decoder layer's host shards to the GPU on
    #: a side stream (memory/h2d_prefetch.py); ignored (and said so) at larger world sizes
    h2d_prefetch: bool = True
    #: fsdp2 and fsdp2-cpu-offload: FSDP2's option for the decoder layers; false keeps each
    #: layer's gathered parameters from its forward to its backward
    reshard_after_forward: bool = True

    def __post_init__(self) -> None:
        settle_fields(self)
        if self.delayed_update and self.sharding != "fsdp2-cpu-offload":
            raise ValueError(f"delayed_update: only with sharding fsdp2-cpu-offload (its CPU "
                             f"AdamW), not {self.sharding}")
        if self.overlap_optimizer and self.sharding != "fsdp2-cpu-offload":
            raise ValueError(f"overlap_optimizer: only with sharding fsdp2-cpu-offload (its CPU "
                             f"AdamW), not {self.sharding}")
        if not self.reshard_after_forward and not self.sharding.startswith("fsdp2"):
            raise ValueError(f"reshard_after_forward: false is FSDP2's option (sharding fsdp2 or "
                             f"fsdp2-cpu-offload), not sharding {self.sharding}")
        if self.mlp_up_saved_layers and not self.checkpointing:
            raise ValueError("mlp_up_saved_layers: what the checkpointed layers keep: needs "
                             "checkpointing: true")
        if self.mlp_up_fit and not self.mlp_up_saved_layers:
            raise ValueError("mlp_up_fit: fits up to mlp_up_saved_layers keeping layers into the "
                             "GPU's memory: set mlp_up_saved_layers (the most) too")
