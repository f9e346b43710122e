"""Physical plans of TPC-H Q1, Q3, Q5, Q6, Q12 and Q14 over the operators.

A plan reads its tables through a *source* (``placement``): ``src.scan(table, columns)`` yields
chunks (dicts of plain tensors on the compute device), ``src.meta(table, column)`` the host-side
column (dictionary, largest value). The same plan runs for every placement and encoding, on a GPU
or on the CPU (CI). Dimension tables are scanned first into sorted build sides; the fact table
(``lineitem``) is streamed last, each chunk filtered, joined and reduced to partial aggregates that
are combined at the end. Every answer is a list of rows of Python values in the query's column
order: ``Decimal`` for decimals (exact), ``datetime.date``, ``str``, ``int``, ``float`` (averages,
Q14's ratio).

Decimal scales: every TPC-H decimal column has 2 digits (cents); ``1 - l_discount`` is
``100 - discount`` cents, so ``price * (1 - discount)`` has 4 digits and ``... * (1 + tax)`` 6.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any, Callable, Iterable

import torch

from hopperlab.workloads.database import fused, sql
from hopperlab.workloads.database.columns import date_of, day_number
from hopperlab.workloads.database.operators import (compact, filter_mask, group_by_key,
                                                    group_sums, in_codes, join_build,
                                                    masked_sum,
                                                    join_payload, join_probe, op, top_k)

ONE = 100  # 1.00 in cents

#: the columns each query reads, per table, in scan order (dimension tables first)
NEEDS: dict[str, dict[str, list[str]]] = {
    "q1": {"lineitem": ["l_shipdate", "l_returnflag", "l_linestatus", "l_quantity",
                        "l_extendedprice", "l_discount", "l_tax"]},
    "q3": {"customer": ["c_custkey", "c_mktsegment"],
           "orders": ["o_orderkey", "o_custkey", "o_orderdate", "o_shippriority"],
           "lineitem": ["l_orderkey", "l_extendedprice", "l_discount", "l_shipdate"]},
    "q5": {"region": ["r_regionkey", "r_name"],
           "nation": ["n_nationkey", "n_regionkey", "n_name"],
           "supplier": ["s_suppkey", "s_nationkey"],
           "customer": ["c_custkey", "c_nationkey"],
           "orders": ["o_orderkey", "o_custkey", "o_orderdate"],
           "lineitem": ["l_orderkey", "l_suppkey", "l_extendedprice", "l_discount"]},
    "q6": {"lineitem": ["l_shipdate", "l_discount", "l_quantity", "l_extendedprice"]},
    "q12": {"orders": ["o_orderkey", "o_orderpriority"],
            "lineitem": ["l_orderkey", "l_shipmode", "l_commitdate", "l_receiptdate",
                         "l_shipdate"]},
    "q14": {"part": ["p_partkey", "p_type"],
            "lineitem": ["l_partkey", "l_extendedprice", "l_discount", "l_shipdate"]},
}


def needs_of(queries: Iterable[str]) -> dict[str, list[str]]:
    """The union of the columns ``queries`` read, per table."""
    out: dict[str, list[str]] = {}
    for q in queries:
        for table, cols in NEEDS[q].items():
            have = out.setdefault(table, [])
            have.extend(c for c in cols if c not in have)
    return out


def dec(unscaled: int, digits: int) -> Decimal:
    """The exact decimal ``unscaled * 10**-digits``."""
    return Decimal(int(unscaled)).scaleb(-digits)


def _cat(parts: list[torch.Tensor], dtype: torch.dtype, device: Any) -> torch.Tensor:
    return torch.cat(parts) if parts else torch.zeros(0, dtype=dtype, device=device)


def _codes(src: Any, table: str, column: str, texts: Iterable[str]) -> list[int]:
    meta = src.meta(table, column)
    return [c for c in (meta.code(t) for t in texts) if c is not None]


def _check_cents(src: Any, table: str, *columns: str) -> None:
    for c in columns:
        meta = src.meta(table, c)
        if meta.kind != "decimal" or meta.scale != 2:
            raise TypeError(f"{table}.{c}: the plans expect DECIMAL(_, 2), got {meta.kind} "
                            f"scale {meta.scale}")


def _revenue_bound(src: Any) -> int:
    """Largest ``l_extendedprice * (1 - l_discount)`` (4 digits) in magnitude."""
    price = src.meta("lineitem", "l_extendedprice").max_abs
    disc = src.meta("lineitem", "l_discount").max_abs
    return price * (ONE + disc)


# --------------------------------------------------------------------------- Q1
def q1(src: Any) -> list[tuple]:
    """Pricing summary: 8 aggregates per (returnflag, linestatus) over ~98% of lineitem."""
    li = "lineitem"
    _check_cents(src, li, "l_quantity", "l_extendedprice", "l_discount", "l_tax")
    rf, ls = src.meta(li, "l_returnflag"), src.meta(li, "l_linestatus")
    n_ls = max(1, len(ls.dictionary))
    n_groups = max(1, len(rf.dictionary)) * n_ls
    bound = (src.meta(li, "l_extendedprice").max_abs
             * (ONE + src.meta(li, "l_discount").max_abs)
             * (ONE + src.meta(li, "l_tax").max_abs))
    limit = day_number(sql.Q1_SHIPDATE_MAX)
    # sums per group: qty, price, disc_price, charge, discount, count
    sums = [[0] * 6 for _ in range(n_groups)]
    if getattr(src, "fused", False):  # one Triton kernel per chunk, on the stored columns
        encs = {c: src.encoded(li, c) for c in NEEDS["q1"][li]}
        for c in src.scan(li, NEEDS["q1"][li], raw=True):
            part = fused.q1_chunk(c, encs, limit, n_ls, n_groups, bound)
            for g in range(n_groups):
                for k in range(6):
                    sums[g][k] += part[g][k]
        return _q1_rows(rf, ls, n_ls, sums)
    for c in src.scan(li, NEEDS["q1"][li]):
        mask = filter_mask(c["l_shipdate"] <= limit)
        with op("project"):
            group = c["l_returnflag"].to(torch.int64) * n_ls + c["l_linestatus"]
            price = c["l_extendedprice"]
            disc_price = price * (ONE - c["l_discount"])
            charge = disc_price * (ONE + c["l_tax"])
            ones = torch.ones_like(price)
        part = group_sums(group, n_groups, [c["l_quantity"], price, disc_price, charge,
                                            c["l_discount"], ones], mask, bound)
        for g in range(n_groups):
            for k in range(6):
                sums[g][k] += part[g][k]
    return _q1_rows(rf, ls, n_ls, sums)


def _q1_rows(rf: Any, ls: Any, n_ls: int, sums: list[list[int]]) -> list[tuple]:
    rows = []
    for g in range(len(sums)):
        qty, price, disc_price, charge, disc, count = sums[g]
        if count == 0:
            continue
        rows.append((rf.dictionary[g // n_ls], ls.dictionary[g % n_ls],
                     dec(qty, 2), dec(price, 2), dec(disc_price, 4), dec(charge, 6),
                     qty / (100 * count), price / (100 * count), disc / (100 * count), count))
    return rows  # group ids follow the sorted dictionaries: ORDER BY returnflag, linestatus


# --------------------------------------------------------------------------- Q3
def q3(src: Any) -> list[tuple]:
    """Shipping priority: customer -> orders -> lineitem joins, revenue per order, top 10."""
    _check_cents(src, "lineitem", "l_extendedprice", "l_discount")
    dev = src.device
    day = day_number(sql.Q3_DATE)
    segment = _codes(src, "customer", "c_mktsegment", [sql.Q3_SEGMENT])
    keys = []
    for c in src.scan("customer", NEEDS["q3"]["customer"]):
        (k,) = compact(in_codes(c["c_mktsegment"], segment), c["c_custkey"])
        keys.append(k)
    customers = join_build(_cat(keys, torch.int64, dev))

    okeys, odates, oprio = [], [], []
    for c in src.scan("orders", NEEDS["q3"]["orders"]):
        found, _ = join_probe(customers, c["o_custkey"])
        mask = filter_mask(c["o_orderdate"] < day, found)
        k, d, p = compact(mask, c["o_orderkey"], c["o_orderdate"], c["o_shippriority"])
        okeys.append(k), odates.append(d), oprio.append(p)
    orders = join_build(_cat(okeys, torch.int64, dev), _cat(odates, torch.int32, dev),
                        _cat(oprio, torch.int32, dev))

    part_rows, part_sums = [], []
    for c in src.scan("lineitem", NEEDS["q3"]["lineitem"]):
        okey, price, disc = compact(c["l_shipdate"] > day, c["l_orderkey"],
                                    c["l_extendedprice"], c["l_discount"])
        found, pos = join_probe(orders, okey)
        pos, price, disc = compact(found, pos, price, disc)
        with op("project"):
            revenue = price * (ONE - disc)
        rows, (sums,) = group_by_key(pos, [revenue])
        part_rows.append(rows), part_sums.append(sums)
    rows, (revenue,) = group_by_key(_cat(part_rows, torch.int64, dev),
                                    [_cat(part_sums, torch.int64, dev)])
    with op("project"):
        orderdate = join_payload(orders, rows, 0)
        priority = join_payload(orders, rows, 1)
        orderkey = orders.keys.index_select(0, rows)
    best = top_k(sql.Q3_LIMIT, [(revenue, True), (orderdate, False)])
    out = zip(*(t.index_select(0, best).cpu().tolist()
                for t in (orderkey, revenue, orderdate, priority)))
    return [(int(k), dec(r, 4), date_of(d), int(p)) for k, r, d, p in out]


# --------------------------------------------------------------------------- Q5
def q5(src: Any) -> list[tuple]:
    """Local supplier volume: six tables, revenue per nation of one region, customer and
    supplier of the same nation."""
    _check_cents(src, "lineitem", "l_extendedprice", "l_discount")
    dev = src.device
    region = _codes(src, "region", "r_name", [sql.Q5_REGION])
    rkeys = []
    for c in src.scan("region", NEEDS["q5"]["region"]):
        (k,) = compact(in_codes(c["r_name"], region), c["r_regionkey"])
        rkeys.append(k)
    regions = join_build(_cat(rkeys, torch.int64, dev))
    names = src.meta("nation", "n_name").dictionary
    nkeys, ncodes = [], []
    for c in src.scan("nation", NEEDS["q5"]["nation"]):
        found, _ = join_probe(regions, c["n_regionkey"])
        k, n = compact(found, c["n_nationkey"], c["n_name"])
        nkeys.append(k), ncodes.append(n)
    nation_keys = _cat(nkeys, torch.int64, dev)
    nation_name = dict(zip(nation_keys.cpu().tolist(), _cat(ncodes, torch.int32, dev).cpu().tolist()))
    nations = join_build(nation_keys)

    def keyed_by_nation(table: str, key: str, nation: str):
        ks, ns = [], []
        for c in src.scan(table, NEEDS["q5"][table]):
            found, _ = join_probe(nations, c[nation])
            k, n = compact(found, c[key], c[nation])
            ks.append(k), ns.append(n)
        return join_build(_cat(ks, torch.int64, dev), _cat(ns, torch.int64, dev))

    suppliers = keyed_by_nation("supplier", "s_suppkey", "s_nationkey")
    customers = keyed_by_nation("customer", "c_custkey", "c_nationkey")
    lo, hi = day_number(sql.Q5_DATE_FROM), day_number(sql.Q5_DATE_TO)
    okeys, onat = [], []
    for c in src.scan("orders", NEEDS["q5"]["orders"]):
        k, cust = compact(filter_mask(c["o_orderdate"] >= lo, c["o_orderdate"] < hi),
                          c["o_orderkey"], c["o_custkey"])
        found, pos = join_probe(customers, cust)
        k, pos = compact(found, k, pos)
        okeys.append(k), onat.append(join_payload(customers, pos, 0))
    orders = join_build(_cat(okeys, torch.int64, dev), _cat(onat, torch.int64, dev))

    n_groups = int(src.meta("nation", "n_nationkey").max_abs) + 1
    bound = _revenue_bound(src)
    sums = [[0, 0] for _ in range(n_groups)]
    for c in src.scan("lineitem", NEEDS["q5"]["lineitem"]):
        found, pos = join_probe(orders, c["l_orderkey"])
        okey_pos, supp, price, disc = compact(found, pos, c["l_suppkey"], c["l_extendedprice"],
                                              c["l_discount"])
        s_found, s_pos = join_probe(suppliers, supp)
        cust_nation = join_payload(orders, okey_pos, 0)
        supp_nation = join_payload(suppliers, s_pos, 0)
        mask = filter_mask(s_found, cust_nation == supp_nation)
        with op("project"):
            revenue = price * (ONE - disc)
            ones = torch.ones_like(revenue)
        part = group_sums(cust_nation, n_groups, [revenue, ones], mask, bound)
        for g in range(n_groups):
            sums[g][0] += part[g][0]
            sums[g][1] += part[g][1]
    rows = [(names[nation_name[g]], dec(rev, 4)) for g, (rev, count) in enumerate(sums)
            if count > 0]
    rows.sort(key=lambda r: r[1], reverse=True)
    return rows


# --------------------------------------------------------------------------- Q6
def q6(src: Any, p: sql.Q6Params | None = None) -> list[tuple]:
    """Forecasting revenue change: one filter and one sum over four lineitem columns."""
    p = p or sql.Q6Params()
    li = "lineitem"
    _check_cents(src, li, "l_quantity", "l_extendedprice", "l_discount")
    bound = src.meta(li, "l_extendedprice").max_abs * src.meta(li, "l_discount").max_abs
    lo, hi = day_number(p.date_from), day_number(p.date_to)
    total = count = 0
    if getattr(src, "fused", False):  # one Triton kernel per chunk, on the stored columns
        encs = {c: src.encoded(li, c) for c in NEEDS["q6"][li]}
        for c in src.scan(li, NEEDS["q6"][li], raw=True):
            part_total, part_count = fused.q6_chunk(c, encs, p, lo, hi, bound)
            total += part_total
            count += part_count
        return [(dec(total, 4) if count else None,)]
    for c in src.scan(li, NEEDS["q6"][li]):
        ship, disc = c["l_shipdate"], c["l_discount"]
        mask = filter_mask(ship >= lo, ship < hi, disc >= p.discount_lo, disc <= p.discount_hi,
                           c["l_quantity"] < p.quantity_below)
        with op("project"):
            revenue = c["l_extendedprice"] * disc
        total += masked_sum(revenue, mask, max(bound, 1))
        with op("aggregate"):
            count += int(mask.sum())
    return [(dec(total, 4) if count else None,)]


# --------------------------------------------------------------------------- Q12
def q12(src: Any) -> list[tuple]:
    """Shipping modes and order priority: lineitem filtered, joined to orders, two counts."""
    modes_meta = src.meta("lineitem", "l_shipmode")
    modes = _codes(src, "lineitem", "l_shipmode", sql.Q12_SHIPMODES)
    high = _codes(src, "orders", "o_orderpriority", sql.Q12_HIGH_PRIORITIES)
    dev = src.device
    okeys, ohigh = [], []
    for c in src.scan("orders", NEEDS["q12"]["orders"]):
        okeys.append(c["o_orderkey"].clone())
        ohigh.append(in_codes(c["o_orderpriority"], high).to(torch.int64))
    orders = join_build(_cat(okeys, torch.int64, dev), _cat(ohigh, torch.int64, dev))
    lo, hi = day_number(sql.Q12_DATE_FROM), day_number(sql.Q12_DATE_TO)
    n_groups = max(1, len(modes_meta.dictionary))
    counts = [[0, 0] for _ in range(n_groups)]
    for c in src.scan("lineitem", NEEDS["q12"]["lineitem"]):
        commit, receipt = c["l_commitdate"], c["l_receiptdate"]
        mask = filter_mask(in_codes(c["l_shipmode"], modes), commit < receipt,
                           c["l_shipdate"] < commit, receipt >= lo, receipt < hi)
        okey, mode = compact(mask, c["l_orderkey"], c["l_shipmode"])
        found, pos = join_probe(orders, okey)
        with op("project"):
            is_high = join_payload(orders, pos, 0)
            is_low = 1 - is_high
        part = group_sums(mode.to(torch.int64), n_groups, [is_high, is_low], found, 1)
        for g in range(n_groups):
            counts[g][0] += part[g][0]
            counts[g][1] += part[g][1]
    return [(modes_meta.dictionary[g], h, l) for g, (h, l) in enumerate(counts) if h + l > 0]


# --------------------------------------------------------------------------- Q14
def q14(src: Any) -> list[tuple]:
    """Promotion effect: one month of lineitem joined to part, share of promotional revenue."""
    _check_cents(src, "lineitem", "l_extendedprice", "l_discount")
    dev = src.device
    types = src.meta("part", "p_type")
    promo = torch.zeros(max(1, len(types.dictionary)), dtype=torch.int64, device=dev)
    codes = types.codes_where(lambda s: s.startswith(sql.Q14_TYPE_PREFIX))
    if codes:
        promo[torch.tensor(codes, dtype=torch.int64, device=dev)] = 1
    pkeys, pflag = [], []
    for c in src.scan("part", NEEDS["q14"]["part"]):
        pkeys.append(c["p_partkey"].clone())
        with op("project"):
            pflag.append(promo[c["p_type"].to(torch.int64)])
    parts = join_build(_cat(pkeys, torch.int64, dev), _cat(pflag, torch.int64, dev))
    lo, hi = day_number(sql.Q14_DATE_FROM), day_number(sql.Q14_DATE_TO)
    bound = _revenue_bound(src)
    sums = [0, 0]  # promotional revenue, all revenue (4 digits)
    count = 0
    for c in src.scan("lineitem", NEEDS["q14"]["lineitem"]):
        ship = c["l_shipdate"]
        pkey, price, disc = compact(filter_mask(ship >= lo, ship < hi), c["l_partkey"],
                                    c["l_extendedprice"], c["l_discount"])
        found, pos = join_probe(parts, pkey)
        with op("project"):
            revenue = price * (ONE - disc)
            is_promo = join_payload(parts, pos, 0)
        (part,) = group_sums(torch.zeros_like(is_promo), 1,
                             [revenue * is_promo, revenue, torch.ones_like(revenue)], found,
                             bound)
        sums[0] += part[0]
        sums[1] += part[1]
        count += part[2]
    if count == 0 or sums[1] == 0:
        return [(None,)]
    return [(100 * sums[0] / sums[1],)]


PLANS: dict[str, Callable[[Any], list[tuple]]] = {
    "q1": q1, "q3": q3, "q5": q5, "q6": q6, "q12": q12, "q14": q14}
