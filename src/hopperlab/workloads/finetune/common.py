"""The params every finetune engine takes (``CommonParams``) and the ones both LoRA engines
(torch, mcore) take (``LoraParams``): each engine's own class adds only its own fields, so that
a field an engine would not read cannot be set on it (the matrix refuses it, naming the key).
Cheap to import (no torch): the spec layer reads it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Literal

from hopperlab.core.schema import bounded
from hopperlab.workloads.base import PROFILERS

Method = Literal["lora", "full"]
Weights = Literal["random", "pretrained"]
DataSource = Literal["prepared", "tokenize", "synthetic"]
Dtype = Literal["bfloat16", "float32"]


def engine_knobs(*, num_workers: Iterable[int], offload: Iterable[str], memory: Iterable[str],
                 precision: Iterable[str]) -> dict[str, frozenset[Any]]:
    """An engine's ``supported_knobs``: the values it honours of each knob (every engine runs
    its measured steps in ``measured_region``, so every profiler)."""
    return {"num_workers": frozenset(num_workers), "offload": frozenset(offload),
            "memory": frozenset(memory), "precision": frozenset(precision),
            "profiler": PROFILERS}


@dataclass(frozen=True)
class CommonParams:
    #: "lora" (frozen base, adapters) or "full" (every weight trained)
    method: Method = "lora"
    #: "random": the architecture of the model asset with random weights (performance studies);
    #: "pretrained": the asset's weights (a random-weights asset is refused)
    weights: Weights = "pretrained"
    #: dtype of the model's weights (LoRA adapters stay float32, as peft makes them)
    dtype: Dtype = "bfloat16"
    learning_rate: float = bounded(1e-4, above=0)
    weight_decay: float = 0.0
    seq_len: int = bounded(2048, at_least=1)
    micro_batch: int = bounded(4, at_least=1)
    #: steps run before the measured ones (compilation, allocator warm-up); excluded from figures
    warmup_steps: int = bounded(2, at_least=0)
    measured_steps: int = bounded(10, at_least=2, why="a loss drop needs two")
    seed: int = 0
    #: activation checkpointing (recompute) of each decoder layer
    checkpointing: bool = False


@dataclass(frozen=True)
class LoraParams(CommonParams):
    lora_rank: int = bounded(32, at_least=1)
    lora_alpha: int = bounded(64, at_least=1)
    lora_targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    #: "prepared" (the pre-tokenized asset of role data), "tokenize" (records of role records,
    #: tokenized with the tokenizer of role tokenizer) or "synthetic" (random tokens of the
    #: right shape)
    data: DataSource = "prepared"
    #: when the data assets are not built: use synthetic tokens (tagged) instead of failing
    synthetic_if_missing: bool = False

    def check_lora(self) -> None:
        """LoRA needs a target (the engines' ``__post_init__`` call it)."""
        if self.method == "lora" and not self.lora_targets:
            raise ValueError("lora_targets: LoRA needs at least one target module name")
