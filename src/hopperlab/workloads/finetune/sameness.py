"""What "the same training" means for a finetune variant against the run it is compared with.

Both runs see the same batches in the same order (one seed, one data set), so the per-step
losses and trainable-gradient norms are what is compared (steps.jsonl). A technique that only
moves or keeps tensors elsewhere (offload, save_on_cpu, managed memory, loader workers,
checkpointing in float32) must give the very same numbers; one that recomputes or fuses in
another order, or computes in fewer bits, may differ within a bound stated here with its
reason; a variant that trains something else (another engine, model, batch or learning rate)
is not comparable. docs/correctness.md lists them.
"""

from __future__ import annotations

from typing import Any, Mapping

from hopperlab.workloads.sameness import (Sameness, bounded, differing, exact, not_comparable,
                                          world_size)

#: params and knobs that only say where tensors live or how the data arrives: the arithmetic
#: is the same, so the losses and gradient norms are bit for bit the same
MOVES_ONLY = frozenset({
    "num_workers", "offload", "memory", "profiler", "activation_offload", "offload_budget_gib",
    "offload_budget_caps_allocator", "offload_min_bytes", "offload_keep_last_layers",
    "offload_keep_head", "offload_max_inflight_mib", "offload_staging", "expandable_segments",
    "resident_layers", "prefetch_layers", "managed_advise", "managed_prefetch", "oversubscribe",
    "census", "pin_memory", "h2d_prefetch", "reshard_after_forward", "diagnose_step",
    "measured_steps", "synthetic_if_missing", "mlp_up_fit",
})

#: float32: a recompute, a fused or compiled kernel, a chunked loss or another sharding sums in
#: another order; float32 rounds at 2^-24 (6e-8) an operation and a few optimizer steps grow
#: it. The smoke matrix measured at most 3.1e-7 (offload-budget-recompute, 2026-12-02); 1e-5
#: leaves room for longer runs while a wrong tensor (a dropped backward: 1e-2 at step 1) is far
REORDER_FLOAT32 = 1e-5
#: bfloat16 rounds at 2^-8 (0.4 %) an element; a recomputed or fused kernel rounds elsewhere
#: and the loss of 10-24 steps moves by a fraction of that: 2 % (not yet measured on a GPU)
REORDER_BF16 = 2e-2
#: FP8 (e4m3, 3 mantissa bits, tensorwise scaling) against the same model compiled in bf16:
#: the smoke matrix measured 3.4 % (full-1b, 2026-12-02); 5 %
FP8 = 5e-2

#: params that change the order of the arithmetic but not what is computed
REORDERS = frozenset({
    "recompute_elementwise", "loss_chunk_tokens", "liger", "compile", "checkpointing",
    "sharding", "overlap_optimizer", "mlp_up_saved_layers", "autocast", "tasks_per_node",
})


def rule(variant: Mapping[str, Any], reference: Mapping[str, Any]) -> Sameness:
    """The declaration of ``variant`` against ``reference`` (both spec.json)."""
    keys = differing(variant, reference) | _world(variant, reference)
    if variant.get("assets") != reference.get("assets"):
        return not_comparable("another model or data set (assets differ)", "losses")
    others = keys - MOVES_ONLY - REORDERS - {"precision"}
    if "backend" in others:
        return not_comparable("another engine: its own model code and initialisation, so its "
                              "losses start from other values", "losses")
    if others:
        return not_comparable(f"trains something else ({', '.join(sorted(others))} differ)",
                              "losses")
    dtype = (variant.get("params") or {}).get("dtype")
    if "precision" in keys:
        return bounded("losses", FP8, "FP8 e4m3 with tensorwise scaling: 3.4 % measured at "
                       "smoke, 5 % allowed")
    reorders = keys & REORDERS
    if _save_on_cpu(variant) and not _save_on_cpu(reference):
        # its copies come back contiguous where the saved tensor was a view: a GPU's backward
        # may take another kernel for them (an H200 in float32: 8.1e-8 relative at step 12,
        # bitwise in bf16; 2026-12-02, docs/correctness.md); the CPU: bitwise
        reorders = reorders | {"save_on_cpu"}
    if reorders and (dtype != "float32" or reorders - {"checkpointing"}):
        bound = REORDER_FLOAT32 if dtype == "float32" else REORDER_BF16
        return bounded("losses", bound, f"{', '.join(sorted(reorders))} sum in another order: "
                       f"{dtype} rounding, {bound:g} relative a step")
    # checkpointing in float32 recomputes the same kernels on the same inputs: bit for bit
    return exact("losses")


def _save_on_cpu(spec: Mapping[str, Any]) -> bool:
    """The run keeps its saved tensors through torch's save_on_cpu."""
    return ((spec.get("knobs") or {}).get("offload") in ("activations", "both")
            and (spec.get("params") or {}).get("activation_offload") == "save_on_cpu")


def _world(variant: Mapping[str, Any], reference: Mapping[str, Any]) -> set[str]:
    """``tasks_per_node`` where the two runs split the batch over other numbers of ranks
    (``world_size``: tasks at smoke, GPUs per node at full scale)."""
    return {"tasks_per_node"} if world_size(variant) != world_size(reference) else set()
