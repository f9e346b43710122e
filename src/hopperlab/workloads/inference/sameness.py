"""What "the same generation" means for an inference variant against its reference run.

Every study decodes greedily from seeded prompts, so the generated token ids are compared
(``artifacts/evidence.json`` ``tokens``). Keeping a KV cache or the weights elsewhere (host
memory, managed memory, streamed layer by layer, accelerate's hooks) copies the same bytes back:
the very same tokens. Recomputing an evicted cache, or splitting the model over ranks, sums in
another order: a near-tied greedy choice may flip, within the bound below. Another prompt,
length or concurrency is another workload. docs/correctness.md lists them.
"""

from __future__ import annotations

from typing import Any, Mapping

from hopperlab.workloads.sameness import (Sameness, bounded, differing, exact, not_comparable,
                                          world_size)

#: where the cache or the weights live, and how they come back: the arithmetic is the same
MOVES_ONLY = frozenset({"memory", "profiler", "layered_reload", "streamer",
                        "resident_fractions", "gpu_sessions", "pinned_gbps", "num_workers",
                        "offload", "warmup", "requests", "num_layers",
                        # the batches both runs measured are compared
                        "batch_sizes"})
#: a flipped near-tie changes the rest of its reply; a wrong cache or a wrong layer changes
#: every reply that reads it (5 of 9 at smoke). float32: none differed, on the CPU and on an
#: H200; more than one reply in ten is no rounding
REORDER_SHARE_FLOAT32 = 0.1
#: bfloat16 rounds at 2^-8: recompute flipped 1 reply of 9 on an H200 (smoke shapes,
#: 2026-12-02); more than one in four is no rounding
REORDER_SHARE_BF16 = 0.25


def rule(variant: Mapping[str, Any], reference: Mapping[str, Any]) -> Sameness:
    """The declaration of ``variant`` against ``reference`` (both spec.json)."""
    keys = differing(variant, reference)
    tasks = [world_size(s) for s in (variant, reference)]
    policies = {(s.get("params") or {}).get("policy") for s in (variant, reference)}
    if variant.get("assets") != reference.get("assets"):
        return not_comparable("another model (assets differ)")
    others = keys - MOVES_ONLY - {"policy", "compile_kernels"}
    if others:
        return not_comparable(f"another workload ({', '.join(sorted(others))} differ)")
    share = REORDER_SHARE_FLOAT32 if (variant.get("params") or {}).get("dtype") == "float32" \
        else REORDER_SHARE_BF16
    if tasks[0] != tasks[1]:
        return bounded("tokens", share, "tensor parallel sums partial products over the ranks "
                       "in another order: a near-tied greedy token may flip")
    if "recompute" in policies and "policy" in keys:
        return bounded("tokens", share, "recompute prefills the history in one pass where the "
                       "cache was built token by token: a near-tied greedy token may flip")
    if "compile_kernels" in keys:
        return bounded("tokens", share, "compiled kernels fuse and sum in another order: a "
                       "near-tied greedy token may flip")
    return exact("tokens")
