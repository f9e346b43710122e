"""finetune: LoRA and full fine-tuning of Llama models on Dolly, under the memory techniques.

The study of the source talk (LoRA of Llama-2-7B on Dolly-15k: data-loader workers, activation
offload, unified memory, FP8) and the slides' single-GPU 70B LoRA, as one training loop whose
knobs dispatch to ``hopperlab.memory``. Three engines, one folder each, named by the param
``backend`` (``ENGINES``): ``torch`` (transformers + peft), ``mcore`` (megatron-core in a child
process; ``nemo`` is its earlier name) and ``sharded`` (FSDP2 / torchao over our own Llama). Each
declares its own params class, the knob values it honours, its check, entry and repeat unit, so
the matrix refuses at load what an engine cannot do. What each knob does:
docs/benchmarks/finetune.md ("The family in one page").

This module is imported by the spec layer: it stays cheap (no torch).
"""

from __future__ import annotations

from typing import Any, Mapping, get_args

from hopperlab.core.errors import SpecError
from hopperlab.workloads.base import HIGHER, LOWER, EngineInfo, FamilyInfo, Knobs, WorkUnit
from hopperlab.workloads.finetune.common import (CommonParams, DataSource, Dtype, LoraParams,
                                                 Method, Weights)
from hopperlab.workloads.finetune.mcore import params as mcore
from hopperlab.workloads.finetune.mcore.params import McoreParams
from hopperlab.workloads.finetune.sharded import params as sharded
from hopperlab.workloads.finetune.sharded.params import SHAPES, ModelShape, ShardedParams, Sharding
from hopperlab.workloads.finetune.torch import params as torch_engine
from hopperlab.workloads.finetune.torch.moe_config import check_model_asset
from hopperlab.workloads.finetune.torch.params import (LIGER_KERNELS, OFFLOADS, ActivationOffload,
                                                       LigerKernel, ManagedAdvice, OffloadStaging,
                                                       TorchParams, check)

#: the torch engine's params (the family's default engine): the name its tests and benchmarks use
FinetuneParams = TorchParams
#: every engine's params class, by the engine's name
ENGINE_PARAMS: dict[str, type] = {"torch": TorchParams, "mcore": McoreParams,
                                  "sharded": ShardedParams}
BACKENDS: tuple[str, ...] = tuple(ENGINE_PARAMS)
SHARDINGS, METHODS, WEIGHTS = (get_args(t) for t in (Sharding, Method, Weights))
DATA_SOURCES, ACTIVATION_OFFLOADS, DTYPES = (get_args(t) for t in (DataSource, ActivationOffload,
                                                                    Dtype))
MANAGED_ADVICE, OFFLOAD_STAGINGS = get_args(ManagedAdvice), get_args(OffloadStaging)

#: The figures the report charts for every finetune run.
HEADLINE_METRICS: tuple[str, ...] = (
    "tokens_per_s", "step_time_p50_s", "peak_gpu_allocated_gib", "mfu", "data_wait_fraction",
    "loss_drop")

__all__ = ["CommonParams", "LoraParams", "TorchParams", "McoreParams", "ShardedParams",
           "FinetuneParams", "LigerKernel", "ModelShape", "SHAPES", "LIGER_KERNELS", "OFFLOADS",
           "check", "check_assets", "FAMILY", "HEADLINE_METRICS"]


def check_assets(params: FinetuneParams, knobs: Knobs, assets: Mapping[str, Any],
                 where: str) -> None:
    """The run against its model asset (``FamilyInfo.check_assets``): what a hopperlab-moe
    config cannot take (moe_config.py), and parameter offload, which moves transformers'
    decoder layers (our MoE decoder's layers are not those)."""
    if not isinstance(params, TorchParams):
        return  # our MoE decoder is the torch engine's (moe.py)
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

ENGINES = (
    EngineInfo("torch", TorchParams, "hopperlab.workloads.finetune.torch.workload:run",
               torch_engine.SUPPORTED_KNOBS, check=check,
               # building a 7B model takes longer than its measured steps: windows
               repeat_unit="windows"),
    EngineInfo("mcore", McoreParams, "hopperlab.workloads.finetune.mcore.engine:run",
               mcore.SUPPORTED_KNOBS, check=mcore.check, aliases=mcore.ALIASES,
               repeat_unit="reruns"),  # each rerun a child process of its own
    EngineInfo("sharded", ShardedParams, "hopperlab.workloads.finetune.sharded.entry:run",
               sharded.SUPPORTED_KNOBS, repeat_unit="windows"),
)

FAMILY = FamilyInfo(
    name="finetune",
    entry=ENGINES[0].entry,
    sameness="hopperlab.workloads.finetune.sameness:rule",
    predict="hopperlab.workloads.finetune.predict:MODEL",
    # the family's vocabulary: every value one of its engines implements (each engine refuses
    # the values it does not, at load: EngineInfo.supported_knobs)
    supported_knobs={k: frozenset().union(*(e.supported_knobs.get(k, ()) for e in ENGINES))
                     for k in ENGINES[0].supported_knobs},
    params=TorchParams,
    headline_metrics=HEADLINE_METRICS,
    charts="hopperlab.workloads.finetune.charts:charts",
    tables="hopperlab.workloads.finetune.tables:tables",
    directions=METRIC_DIRECTIONS,
    judged=("tokens_per_s", "step_time_p50_s"),
    work_units=WORK_UNITS,
    floors=FLOORS,
    check_assets=check_assets,
    engines=ENGINES,  # each with its own params, knobs, check, entry and repeat unit
    engine_param="backend",
)
