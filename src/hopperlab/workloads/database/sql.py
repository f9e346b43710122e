"""The query text: TPC-H Q1, Q3, Q5, Q6, Q12, Q14 with the specification's validation parameters.

The text is what DuckDB's ``tpch_queries()`` gives (the TPC-H specification's queries), kept here
so that the GPU plans and DuckDB run the same query: the constants the plans use are the ones
formatted into this text (``PARAMS``), and Q6 can be written for other predicates (``q6_sql``),
which the property tests use.
"""

from __future__ import annotations

from dataclasses import dataclass

Q1 = """\
SELECT
    l_returnflag,
    l_linestatus,
    sum(l_quantity) AS sum_qty,
    sum(l_extendedprice) AS sum_base_price,
    sum(l_extendedprice * (1 - l_discount)) AS sum_disc_price,
    sum(l_extendedprice * (1 - l_discount) * (1 + l_tax)) AS sum_charge,
    avg(l_quantity) AS avg_qty,
    avg(l_extendedprice) AS avg_price,
    avg(l_discount) AS avg_disc,
    count(*) AS count_order
FROM
    lineitem
WHERE
    l_shipdate <= CAST('1998-09-02' AS date)
GROUP BY
    l_returnflag,
    l_linestatus
ORDER BY
    l_returnflag,
    l_linestatus;
"""

Q3 = """\
SELECT
    l_orderkey,
    sum(l_extendedprice * (1 - l_discount)) AS revenue,
    o_orderdate,
    o_shippriority
FROM
    customer,
    orders,
    lineitem
WHERE
    c_mktsegment = 'BUILDING'
    AND c_custkey = o_custkey
    AND l_orderkey = o_orderkey
    AND o_orderdate < CAST('1995-03-15' AS date)
    AND l_shipdate > CAST('1995-03-15' AS date)
GROUP BY
    l_orderkey,
    o_orderdate,
    o_shippriority
ORDER BY
    revenue DESC,
    o_orderdate
LIMIT 10;
"""

Q5 = """\
SELECT
    n_name,
    sum(l_extendedprice * (1 - l_discount)) AS revenue
FROM
    customer,
    orders,
    lineitem,
    supplier,
    nation,
    region
WHERE
    c_custkey = o_custkey
    AND l_orderkey = o_orderkey
    AND l_suppkey = s_suppkey
    AND c_nationkey = s_nationkey
    AND s_nationkey = n_nationkey
    AND n_regionkey = r_regionkey
    AND r_name = 'ASIA'
    AND o_orderdate >= CAST('1994-01-01' AS date)
    AND o_orderdate < CAST('1995-01-01' AS date)
GROUP BY
    n_name
ORDER BY
    revenue DESC;
"""

Q6 = """\
SELECT
    sum(l_extendedprice * l_discount) AS revenue
FROM
    lineitem
WHERE
    l_shipdate >= CAST('1994-01-01' AS date)
    AND l_shipdate < CAST('1995-01-01' AS date)
    AND l_discount BETWEEN 0.05
    AND 0.07
    AND l_quantity < 24;
"""

Q12 = """\
SELECT
    l_shipmode,
    sum(
        CASE WHEN o_orderpriority = '1-URGENT'
            OR o_orderpriority = '2-HIGH' THEN
            1
        ELSE
            0
        END) AS high_line_count,
    sum(
        CASE WHEN o_orderpriority <> '1-URGENT'
            AND o_orderpriority <> '2-HIGH' THEN
            1
        ELSE
            0
        END) AS low_line_count
FROM
    orders,
    lineitem
WHERE
    o_orderkey = l_orderkey
    AND l_shipmode IN ('MAIL', 'SHIP')
    AND l_commitdate < l_receiptdate
    AND l_shipdate < l_commitdate
    AND l_receiptdate >= CAST('1994-01-01' AS date)
    AND l_receiptdate < CAST('1995-01-01' AS date)
GROUP BY
    l_shipmode
ORDER BY
    l_shipmode;
"""

Q14 = """\
SELECT
    100.00 * sum(
        CASE WHEN p_type LIKE 'PROMO%' THEN
            l_extendedprice * (1 - l_discount)
        ELSE
            0
        END) / sum(l_extendedprice * (1 - l_discount)) AS promo_revenue
FROM
    lineitem,
    part
WHERE
    l_partkey = p_partkey
    AND l_shipdate >= date '1995-09-01'
    AND l_shipdate < CAST('1995-10-01' AS date);
"""


@dataclass(frozen=True)
class Q6Params:
    """A Q6-style predicate: ``l_shipdate`` in [date_from, date_to), ``l_discount`` between two
    values (cents, inclusive), ``l_quantity`` below a bound (cents)."""

    date_from: str = "1994-01-01"
    date_to: str = "1995-01-01"
    discount_lo: int = 5
    discount_hi: int = 7
    quantity_below: int = 2400


def _money(cents: int) -> str:
    """A decimal literal of ``cents`` / 100, whole numbers without a fraction (as the spec)."""
    sign = "-" if cents < 0 else ""
    whole, frac = divmod(abs(cents), 100)
    return f"{sign}{whole}" if frac == 0 else f"{sign}{whole}.{frac:02d}"


def q6_sql(p: Q6Params) -> str:
    """Q6 with the predicate ``p`` (the defaults give the specification's text, ``Q6``)."""
    return f"""\
SELECT
    sum(l_extendedprice * l_discount) AS revenue
FROM
    lineitem
WHERE
    l_shipdate >= CAST('{p.date_from}' AS date)
    AND l_shipdate < CAST('{p.date_to}' AS date)
    AND l_discount BETWEEN {_money(p.discount_lo)}
    AND {_money(p.discount_hi)}
    AND l_quantity < {_money(p.quantity_below)};
"""


# The constants of the other plans, as they appear in the text above.
Q1_SHIPDATE_MAX = "1998-09-02"
Q3_SEGMENT = "BUILDING"
Q3_DATE = "1995-03-15"
Q3_LIMIT = 10
Q5_REGION = "ASIA"
Q5_DATE_FROM, Q5_DATE_TO = "1994-01-01", "1995-01-01"
Q12_SHIPMODES = ("MAIL", "SHIP")
Q12_HIGH_PRIORITIES = ("1-URGENT", "2-HIGH")
Q12_DATE_FROM, Q12_DATE_TO = "1994-01-01", "1995-01-01"
Q14_TYPE_PREFIX = "PROMO"
Q14_DATE_FROM, Q14_DATE_TO = "1995-09-01", "1995-10-01"

SQL = {"q1": Q1, "q3": Q3, "q5": Q5, "q6": Q6, "q12": Q12, "q14": Q14}


def _check_text() -> None:
    """The constants above must be the ones in the text (a typo would make plan != SQL)."""
    pairs = [(Q1, Q1_SHIPDATE_MAX), (Q3, Q3_SEGMENT), (Q3, Q3_DATE), (Q3, f"LIMIT {Q3_LIMIT}"),
             (Q5, Q5_REGION), (Q5, Q5_DATE_FROM), (Q5, Q5_DATE_TO), (Q12, Q12_DATE_FROM),
             (Q12, Q12_DATE_TO), (Q14, Q14_TYPE_PREFIX + "%"), (Q14, Q14_DATE_FROM),
             (Q14, Q14_DATE_TO)] + [(Q12, f"'{m}'") for m in Q12_SHIPMODES + Q12_HIGH_PRIORITIES]
    for text, needle in pairs:
        if needle not in text:
            raise AssertionError(f"query text and plan constants disagree: {needle!r}")
    if " ".join(q6_sql(Q6Params()).split()) != " ".join(Q6.split()):
        raise AssertionError("q6_sql(Q6Params()) differs from the specification's Q6")


_check_text()
