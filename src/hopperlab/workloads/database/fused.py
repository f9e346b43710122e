"""Fused scan-filter-aggregate kernels (Triton) for the two single-table queries, Q1 and Q6.

Why: with PyTorch operators every predicate, product and reduction is its own kernel that reads
and writes whole columns, so a GPU-resident Q6 moves several times the bytes of its four columns
through device memory; one kernel that loads each column once, filters, multiplies and reduces
per block moves each byte once. For the host-resident placements it matters more: the kernel
reads the *stored* form (``plain = stored * factor + offset`` is applied in registers), so in
``zero-copy`` it reads the mapped host pages directly, once, with no staging and no decode pass.

Exactness: each program sums at most ``BLOCK`` rows in int64 (``BLOCK * bound`` stays far under
2**62 for TPC-H), writes its partial sums, and the partials are added in int64 slices that cannot
overflow, then as Python integers (``exact_totals``).

``available(device)``: CUDA and Triton, or ``TRITON_INTERPRET=1`` (Triton's CPU interpreter,
which the tests use to check these kernels on a machine without a GPU).
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import torch

from hopperlab.workloads.database.operators import op, safe_rows

#: rows per Triton program, and warps per program (module attributes: the benchmark can set them)
BLOCK = 2048
NUM_WARPS = 8

try:  # Triton is optional: GPU nodes have it, CPU machines usually do not
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the node
    triton = None
    tl = None


def available(device: torch.device) -> bool:
    if triton is None:
        return False
    if os.environ.get("TRITON_INTERPRET") == "1":
        return True
    return device.type == "cuda"


def exact_totals(partials: torch.Tensor, bound: int) -> list[int]:
    """Column sums of ``partials`` (rows x k, each entry of magnitude <= bound) as exact ints."""
    rows = int(partials.shape[0])
    step = safe_rows(bound)
    parts = [partials[lo:lo + step].sum(dim=0) for lo in range(0, rows, step)]
    totals = [0] * int(partials.shape[1])
    for row in torch.stack(parts).cpu().tolist():
        for k, v in enumerate(row):
            totals[k] += int(v)
    return totals


if triton is not None:

    @triton.jit
    def _plain(ptr, offs, mask, factor, offset):
        """Load stored values and map them to plain int64 (``stored * factor + offset``)."""
        return tl.load(ptr + offs, mask=mask, other=0).to(tl.int64) * factor + offset

    @triton.jit
    def _q6_kernel(ship, disc, qty, price, n, out,
                   ship_f, ship_o, disc_f, disc_o, qty_f, qty_o, price_f, price_o,
                   date_lo, date_hi, disc_lo, disc_hi, qty_below, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        inside = offs < n
        s = _plain(ship, offs, inside, ship_f, ship_o)
        d = _plain(disc, offs, inside, disc_f, disc_o)
        q = _plain(qty, offs, inside, qty_f, qty_o)
        p = _plain(price, offs, inside, price_f, price_o)
        keep = inside & (s >= date_lo) & (s < date_hi) & (d >= disc_lo) & (d <= disc_hi) \
            & (q < qty_below)
        revenue = tl.where(keep, p * d, 0)
        tl.store(out + pid * 2, tl.sum(revenue, axis=0))
        tl.store(out + pid * 2 + 1, tl.sum(keep.to(tl.int64), axis=0))

    @triton.jit
    def _q1_kernel(ship, rf, ls, qty, price, disc, tax, n, out,
                   ship_f, ship_o, rf_f, rf_o, ls_f, ls_o, qty_f, qty_o, price_f, price_o,
                   disc_f, disc_o, tax_f, tax_o, ship_max, n_ls,
                   GROUPS: tl.constexpr, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        inside = offs < n
        keep = inside & (_plain(ship, offs, inside, ship_f, ship_o) <= ship_max)
        group = _plain(rf, offs, inside, rf_f, rf_o) * n_ls + _plain(ls, offs, inside, ls_f, ls_o)
        q = _plain(qty, offs, inside, qty_f, qty_o)
        p = _plain(price, offs, inside, price_f, price_o)
        d = _plain(disc, offs, inside, disc_f, disc_o)
        t = _plain(tax, offs, inside, tax_f, tax_o)
        disc_price = p * (100 - d)
        charge = disc_price * (100 + t)
        base = out + pid * (GROUPS * 6)
        for g in tl.static_range(GROUPS):
            sel = keep & (group == g)
            tl.store(base + g * 6 + 0, tl.sum(tl.where(sel, q, 0), axis=0))
            tl.store(base + g * 6 + 1, tl.sum(tl.where(sel, p, 0), axis=0))
            tl.store(base + g * 6 + 2, tl.sum(tl.where(sel, disc_price, 0), axis=0))
            tl.store(base + g * 6 + 3, tl.sum(tl.where(sel, charge, 0), axis=0))
            tl.store(base + g * 6 + 4, tl.sum(tl.where(sel, d, 0), axis=0))
            tl.store(base + g * 6 + 5, tl.sum(sel.to(tl.int64), axis=0))


def _affine(enc: Any) -> tuple[int, int]:
    return int(enc.factor), int(enc.offset)


def q6_chunk(cols: dict[str, torch.Tensor], encs: dict[str, Any], p: Any, lo: int, hi: int,
             bound: int) -> tuple[int, int]:
    """(revenue in 4 digits, matching rows) of one chunk of stored Q6 columns."""
    n = int(cols["l_shipdate"].numel())
    if n == 0:
        return 0, 0
    block = BLOCK
    grid = (triton.cdiv(n, block),)
    out = torch.empty((grid[0], 2), dtype=torch.int64, device=cols["l_shipdate"].device)
    with op("filter_aggregate"):
        _q6_kernel[grid](cols["l_shipdate"], cols["l_discount"], cols["l_quantity"],
                         cols["l_extendedprice"], n, out,
                         *_affine(encs["l_shipdate"]), *_affine(encs["l_discount"]),
                         *_affine(encs["l_quantity"]), *_affine(encs["l_extendedprice"]),
                         lo, hi, p.discount_lo, p.discount_hi, p.quantity_below,
                         BLOCK=block, num_warps=NUM_WARPS)
        revenue, count = exact_totals(out, block * max(bound, 1))
    return revenue, count


def q1_chunk(cols: dict[str, torch.Tensor], encs: dict[str, Any], ship_max: int, n_ls: int,
             groups: int, bound: int) -> list[list[int]]:
    """Per-group sums (qty, price, disc_price, charge, discount, count) of one Q1 chunk."""
    names = ("l_shipdate", "l_returnflag", "l_linestatus", "l_quantity", "l_extendedprice",
             "l_discount", "l_tax")
    n = int(cols[names[0]].numel())
    if n == 0:
        return [[0] * 6 for _ in range(groups)]
    block = BLOCK
    grid = (triton.cdiv(n, block),)
    out = torch.empty((grid[0], groups * 6), dtype=torch.int64, device=cols[names[0]].device)
    affine: list[int] = []
    for c in names:
        affine.extend(_affine(encs[c]))
    with op("filter_aggregate"):
        _q1_kernel[grid](*(cols[c] for c in names), n, out, *affine, ship_max, n_ls,
                         GROUPS=groups, BLOCK=block, num_warps=NUM_WARPS)
        flat = exact_totals(out, block * max(bound, 1))
    return [flat[g * 6:(g + 1) * 6] for g in range(groups)]


__all__: Sequence[str] = ("available", "q1_chunk", "q6_chunk", "exact_totals", "BLOCK")
