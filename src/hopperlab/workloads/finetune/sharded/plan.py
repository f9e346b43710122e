"""What one sharded run does (``Plan``), built from the engine's params by ``entry.run_sharded``
and read by the engine, its rates and its memory fits alike."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hopperlab.workloads.finetune.sharded.llama import Shape


@dataclass
class Plan:
    mode: str
    shape: Shape
    seq_len: int
    micro_batch: int
    global_batch: int
    steps: int
    warmup: int
    dtype: Any
    lr: float
    weight_decay: float
    seed: int
    checkpointing: bool
    #: FSDP2 offload: step each unit's AdamW during backward as its gradients land in host
    #: memory (``cpu_adamw``); one micro batch per step only (else after backward)
    overlap_optimizer: bool = False
    #: CPUs this rank was given (the job's thread plan); None: torch's current pool
    cpus: int | None = None
    #: FSDP2 offload: ZeRO-Offload's one-step delayed update (``cpu_adamw``; other maths)
    delayed_update: bool = False
    #: one extra step after the measured ones under torch.profiler, reduced to where the GPU's
    #: time went (``step_profile``: diag_* figures); GPU runs only
    diagnose_step: bool = False
    #: torch.compile each decoder layer (``compile_layers``; inductor on a GPU, dynamo's eager
    #: backend on a CPU); the compilation happens in the warm-up step
    compile: bool = False
    #: FSDP2's option for the decoder layers (``shard``); false keeps them gathered from
    #: forward to backward
    reshard_after_forward: bool = True
    #: FSDP2 offload at world size 1: stage the next layer's host shards on a side stream
    #: (``prefetch_h2d``)
    h2d_prefetch: bool = True
    #: under checkpointing, the last N decoder layers keep their MLP's up-projection instead
    #: of recomputing it (``keep_mlp_up``): GPU memory for fewer FLOPs
    mlp_up_saved_layers: int = 0
    #: ``mlp_up_saved_layers`` is the most: two sizing steps (two more warm-up steps) measure
    #: the GPU memory peak and what a keeping layer adds, and as many of the last layers keep
    #: as fit (``MlpUpFitting``); a CPU run keeps what was asked
    mlp_up_fit: bool = False
    #: the loss in chunks of this many tokens (``Llama.forward``); None: the whole batch's
    #: logits, upcast to float32
    loss_chunk_tokens: int | None = None
    #: the run's repeats (repeat_unit "windows"): after the one warm-up, ``windows`` windows of
    #: ``steps`` steps on the one built model, each recorded as a sample; 1: no samples
    windows: int = 1
    #: the CUDA caching allocator with expandable segments for the run (``caching_allocator``)
    expandable_segments: bool = False
