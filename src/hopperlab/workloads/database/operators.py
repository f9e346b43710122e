"""The physical operators of the query plans, over PyTorch tensors (GPU, or CPU in CI).

Each operator runs inside an NVTX range ``query.<operator>`` (also a torch-profiler range), so
an Nsight Systems timeline shows where a query spends its time: ``query.filter``,
``query.project``, ``query.join.build``, ``query.join.probe``, ``query.aggregate``,
``query.topk`` (and ``query.scan`` / ``query.decode`` in ``placement``).

Arithmetic is exact: decimals are integers (cents, or cents x cents after a product), sums are
int64 over slices short enough never to overflow (``safe_rows``), and the slice sums are added
as Python integers on the host, so an answer equals DuckDB's DECIMAL digit for digit.
"""

from __future__ import annotations

import math
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from hopperlab.cuda.nvtx import nvtx_range, query_operator

INT64_HEADROOM = 2**62
#: privatized bins per group of the scatter-add aggregation (a power of two)
PRIVATE_BINS = 1024


def op(name: str) -> AbstractContextManager[Any]:
    """The NVTX / profiler range of one operator: ``query.<name>``."""
    return nvtx_range(query_operator(name))


def safe_rows(bound: int) -> int:
    """How many rows of values of magnitude <= ``bound`` an int64 sum may add up safely."""
    return max(1, INT64_HEADROOM // max(1, int(bound)))


# --------------------------------------------------------------------------- filter
def filter_mask(*terms: torch.Tensor) -> torch.Tensor:
    """The conjunction of boolean predicate terms (one mask; rows are not moved)."""
    with op("filter"):
        mask = terms[0].clone()
        for t in terms[1:]:
            mask &= t
        return mask


def in_codes(codes: torch.Tensor, wanted: Sequence[int]) -> torch.Tensor:
    """``codes IN wanted`` for a dictionary column (the strings were matched once, on the host)."""
    with op("filter"):
        if not wanted:
            return torch.zeros_like(codes, dtype=torch.bool)
        mask = codes == int(wanted[0])
        for w in wanted[1:]:
            mask |= codes == int(w)
        return mask


def code_lookup(codes: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """``table[codes]``: a per-dictionary-value answer (e.g. ``p_type LIKE 'PROMO%'``) per row."""
    with op("project"):
        return table[codes.long()]


def compact(mask: torch.Tensor, *columns: torch.Tensor) -> list[torch.Tensor]:
    """The rows where ``mask`` holds, of each column (new tensors: safe after the chunk goes)."""
    with op("filter"):
        idx = torch.nonzero(mask, as_tuple=True)[0]
        return [c.index_select(0, idx) for c in columns]


# --------------------------------------------------------------------------- join
@dataclass
class SortedBuild:
    """The build side of a sort join: unique keys in ascending order and payloads in that order."""

    keys: torch.Tensor
    payloads: list[torch.Tensor]

    @property
    def rows(self) -> int:
        return int(self.keys.numel())


def join_build(keys: torch.Tensor, *payloads: torch.Tensor) -> SortedBuild:
    """Sort the build side by key (TPC-H joins here are key -> primary key: keys are unique)."""
    with op("join.build"):
        sorted_keys, order = torch.sort(keys)
        return SortedBuild(sorted_keys, [p.index_select(0, order) for p in payloads])


def join_probe(build: SortedBuild, probe_keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For each probe key: whether the build side holds it, and the build row (binary search)."""
    with op("join.probe"):
        if build.rows == 0:
            return (torch.zeros_like(probe_keys, dtype=torch.bool),
                    torch.zeros_like(probe_keys, dtype=torch.int64))
        keys = probe_keys.to(build.keys.dtype)
        pos = torch.searchsorted(build.keys, keys).clamp_(max=build.rows - 1)
        found = build.keys.index_select(0, pos) == keys
        return found, pos


def join_payload(build: SortedBuild, pos: torch.Tensor, k: int) -> torch.Tensor:
    with op("join.probe"):
        return build.payloads[k].index_select(0, pos)


# --------------------------------------------------------------------------- aggregation
def group_sums(group: torch.Tensor, n_groups: int, values: Sequence[torch.Tensor],
               mask: torch.Tensor | None, bound: int) -> list[list[int]]:
    """Exact per-group sums of each value over the rows where ``mask`` holds.

    ``group`` holds small group ids (0..n_groups-1, e.g. dictionary codes combined); ``bound`` is
    the largest magnitude any value can have. Returns sums[group][value] as Python integers.

    One group: a masked reduction per int64 slice short enough not to overflow. Several groups:
    a scatter-add into *privatized* bins, ``bin = group * P + row % P``: neighbouring rows add
    into different bins, so the atomic adds of a warp rarely meet (with a handful of groups and
    one bin each, every row of a chunk would hit the same few addresses), and each bin gets at
    most ``ceil(rows / P)`` rows, few enough for int64. Masked rows go to P spare bins of their
    own. The bins are summed on the GPU in blocks that cannot overflow, the blocks on the host.
    """
    with op("aggregate"):
        n = int(group.numel())
        out = [[0] * len(values) for _ in range(n_groups)]
        if n == 0:
            return out
        safe = safe_rows(bound)
        if n_groups == 1:
            parts = []
            for lo in range(0, n, safe):
                hi = min(n, lo + safe)
                cols = torch.stack([v[lo:hi].to(torch.int64) for v in values])
                parts.append((cols * mask[lo:hi]).sum(dim=1) if mask is not None
                             else cols.sum(dim=1))
            for row in torch.stack(parts).cpu().tolist():
                for k, v in enumerate(row):
                    out[0][k] += int(v)
            return out
        bins = PRIVATE_BINS
        while math.ceil(n / bins) > safe:
            bins *= 2
        g = group.to(torch.int64)
        if mask is not None:
            g = torch.where(mask, g, n_groups)
        lane = torch.arange(n, device=group.device, dtype=torch.int64).bitwise_and_(bins - 1)
        index = g.mul_(bins).add_(lane) if g is not group else g * bins + lane
        src = torch.stack([v.to(torch.int64) for v in values], dim=1)
        acc = torch.zeros(((n_groups + 1) * bins, len(values)), dtype=torch.int64,
                          device=group.device)
        acc.index_add_(0, index, src)
        per_bin = math.ceil(n / bins)
        block = min(bins, max(1, safe // per_bin))  # bins whose rows stay under the bound
        acc = acc[: n_groups * bins].view(n_groups, bins, len(values))
        n_blocks = math.ceil(bins / block)
        if n_blocks * block != bins:
            pad = torch.zeros((n_groups, n_blocks * block - bins, len(values)),
                              dtype=torch.int64, device=group.device)
            acc = torch.cat([acc, pad], dim=1)
        blocks = acc.view(n_groups, n_blocks, block, len(values)).sum(dim=2).cpu().tolist()
        for gid in range(n_groups):
            for b in blocks[gid]:
                for k, v in enumerate(b):
                    out[gid][k] += int(v)
        return out


def masked_sum(values: torch.Tensor, mask: torch.Tensor | None, bound: int) -> int:
    """Exact sum of ``values`` where ``mask`` holds, in int64 slices that cannot overflow."""
    with op("aggregate"):
        n = int(values.numel())
        step = safe_rows(bound)
        parts = []
        for lo in range(0, n, step):
            v = values[lo:lo + step].to(torch.int64)
            parts.append((v * mask[lo:lo + step]).sum() if mask is not None else v.sum())
        return sum(int(x) for x in torch.stack(parts).cpu().tolist()) if parts else 0


def group_by_key(keys: torch.Tensor, values: Sequence[torch.Tensor]
                 ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Group rows by a many-valued key: (distinct keys ascending, int64 sums per key).

    Sort-based (``torch.unique``) with scatter-add: each key holds few rows, so the atomic adds
    rarely meet. The caller keeps each sum within int64 (TPC-H: a few lines per order)."""
    with op("aggregate"):
        uniq, inverse = torch.unique(keys, sorted=True, return_inverse=True)
        sums = []
        for v in values:
            acc = torch.zeros(uniq.numel(), dtype=torch.int64, device=keys.device)
            acc.index_add_(0, inverse, v.to(torch.int64))
            sums.append(acc)
        return uniq, sums


# --------------------------------------------------------------------------- top-k
def top_k(k: int, order: Sequence[tuple[torch.Tensor, bool]]) -> torch.Tensor:
    """Row indices of the first ``k`` rows by ``order`` ([(column, descending)], first key first).

    A ``topk`` on the first key keeps the rows tied with the k-th; those few candidates are then
    sorted by every key (stable sorts, last key first), so ties break as ``ORDER BY`` says."""
    with op("topk"):
        first, desc = order[0]
        n = int(first.numel())
        if n == 0:
            return torch.zeros(0, dtype=torch.int64, device=first.device)
        kth = torch.topk(first, min(k, n), largest=desc, sorted=True).values[-1]
        keep = first >= kth if desc else first <= kth
        cand = torch.nonzero(keep, as_tuple=True)[0]
        for col, descending in reversed(order):
            vals = col.index_select(0, cand)
            perm = torch.sort(vals, descending=descending, stable=True).indices
            cand = cand.index_select(0, perm)
        return cand[:k]
