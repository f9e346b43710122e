"""What "the same recommendations" means for a recommender variant against the CPU-only one.

Every variant answers the same seeded queries, so each query's ranked top-n list is compared
(``artifacts/evidence.json`` ``topn``). Moving the features over another link or building them
in more workers computes the same numbers: the very same lists. Ranking on the GPU, with other
feature code (pandas) or with the item embeddings elsewhere sums in another order, so two items
of near-equal score may swap, within the bound below. docs/correctness.md lists them.
"""

from __future__ import annotations

from typing import Any, Mapping

from hopperlab.workloads.sameness import Sameness, bounded, differing, exact, not_comparable

MOVES_ONLY = frozenset({"num_workers", "workers_all_cores", "transfer", "memory", "profiler",
                        "host_chunks", "save_models", "warmup"})
REORDERS = frozenset({"pipeline", "augment", "item_embeddings", "cuda_graphs"})
#: near-equal scores swap in a few queries at most; a wrong ranking (a stale embedding table,
#: features of another user) changes most lists. 5 % of the queries: one in 20 (the smoke
#: matrix answers 30: at most one may differ; none did, 2026-12-02)
SWAP_SHARE = 0.05


def rule(variant: Mapping[str, Any], reference: Mapping[str, Any]) -> Sameness:
    """The declaration of ``variant`` against ``reference`` (both spec.json)."""
    keys = differing(variant, reference)
    if variant.get("assets") != reference.get("assets"):
        return not_comparable("another data set (assets differ)")
    others = keys - MOVES_ONLY - REORDERS
    if others:
        return not_comparable(f"another model or query set ({', '.join(sorted(others))} "
                              "differ)")
    if keys & REORDERS:
        return bounded("topn", SWAP_SHARE, f"{', '.join(sorted(keys & REORDERS))}: scores "
                       "summed in another order, near-ties may swap")
    return exact("topn")
