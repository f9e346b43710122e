"""The mcore engine's params and check: megatron-core's GPT with LoRA (local layer spec, no
TransformerEngine layers), so LoRA of random weights only, bf16 only, device memory only, and
CPU offloading never with recompute (megatron-core refuses the pair). Cheap (no torch)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hopperlab.core.schema import settle_fields
from hopperlab.workloads.base import Contradiction, Knobs
from hopperlab.workloads.finetune.common import LoraParams, engine_knobs

#: the name of this engine in spec.json files written before it was named for what it is
ALIASES = ("nemo",)

#: num_workers: the tokens are written once for the child process; offload: megatron-core's
#: CPU offloading (activations, weights), which needs TransformerEngine's cpu_offload (a node
#: without it skips the run, saying so); memory: megatron-core has no managed-memory setting;
#: precision: fp8 needs TransformerEngine's layer spec, and this engine builds the local one
SUPPORTED_KNOBS = engine_knobs(num_workers=[0], offload=["none", "activations", "parameters",
                                                         "both"],
                               memory=["device"], precision=["bf16"])


@dataclass(frozen=True)
class McoreParams(LoraParams):
    #: the engine: megatron-core in a child process (alias ``nemo``)
    backend: Literal["mcore"] = "mcore"
    #: LoRA only (the runner builds megatron-core's LoRA adapters)
    method: Literal["lora"] = "lora"
    #: random only: loading Hugging Face weights into megatron-core is Megatron-Bridge's
    #: conversion, not importable here
    weights: Literal["random"] = "random"

    def __post_init__(self) -> None:
        settle_fields(self)
        self.check_lora()


def check(knobs: Knobs, params: McoreParams) -> None:
    """megatron-core refuses CPU offloading with activation recomputation."""
    if knobs.offload != "none" and params.checkpointing:
        raise Contradiction("offload", f"{knobs.offload}, but checkpointing: megatron-core "
                            f"refuses CPU offloading with activation recomputation")
