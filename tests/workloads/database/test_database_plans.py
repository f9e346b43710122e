"""The database family's plans on the CPU path against DuckDB, at TPC-H SF 0.01 and 0.1.

Every query, every placement that runs without a GPU, both encodings: the answer must equal
DuckDB's running the same query text (exact for integers and decimals, 1e-9 relative for
floats). Data are generated here by the ``tpch`` asset kind's generator (DuckDB dbgen).
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("duckdb")

from hopperlab.assets.tpch import generate  # noqa: E402
from hopperlab.workloads.database import QUERIES  # noqa: E402
from hopperlab.workloads.database.columns import load_tables  # noqa: E402
from hopperlab.workloads.database.encoding import encode  # noqa: E402
from hopperlab.workloads.database.oracle import DuckPeer, compare  # noqa: E402
from hopperlab.workloads.database.placement import make_source  # noqa: E402
from hopperlab.workloads.database.plans import PLANS, needs_of  # noqa: E402
from hopperlab.workloads.database.sql import SQL  # noqa: E402

CPU = torch.device("cpu")


class Dataset:
    def __init__(self, folder, sf):
        self.folder, self.sf = folder, sf
        self.needs = needs_of(QUERIES)
        self.tables = load_tables(folder, self.needs)
        peer = DuckPeer(folder, self.needs, threads=2)
        self.expected = {q: peer.run(SQL[q]) for q in QUERIES}
        peer.close()


@pytest.fixture(scope="session")
def sf001(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tpch-sf0.01")
    generate(folder, 0.01)
    return Dataset(folder, 0.01)


@pytest.fixture(scope="session")
def sf01(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tpch-sf0.1")
    generate(folder, 0.1, parts=2, workers=2)  # two parts made by two processes
    return Dataset(folder, 0.1)


def check_all(data: Dataset, placement: str, encoding: str, chunk_rows: int) -> None:
    source = make_source(placement, data.tables, encoding, CPU, chunk_rows)
    for q in QUERIES:
        rows = PLANS[q](source)
        assert not compare(data.expected[q], rows), (q, compare(data.expected[q], rows))
        assert rows == rows and len(rows) == len(data.expected[q])
        source.reset()


def test_answers_are_not_trivial(sf001):
    """The oracle's answers have rows and values (a test against empty answers proves little)."""
    e = sf001.expected
    assert len(e["q1"]) == 4 and len(e["q3"]) == 10 and len(e["q12"]) == 2
    assert e["q6"][0][0] > 0 and 0 < e["q14"][0][0] < 100 and len(e["q5"]) >= 1


@pytest.mark.parametrize("placement", ["device", "host-pinned", "zero-copy", "pageable"])
@pytest.mark.parametrize("encoding", ["plain", "compact"])
def test_every_plan_equals_duckdb_sf001(sf001, placement, encoding):
    # small chunks: lineitem (60k rows) streams in 8 chunks, orders in 2
    check_all(sf001, placement, encoding, chunk_rows=8_000)


@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
@pytest.mark.parametrize("placement,encoding", [("device", "plain"),
                                                ("host-pinned", "compact"),
                                                ("zero-copy", "plain")])
def test_every_plan_equals_duckdb_sf01(sf01, placement, encoding):
    check_all(sf01, placement, encoding, chunk_rows=250_000)


@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
def test_parallel_parts_equal_one_process(sf01, tmp_path):
    """dbgen(children, step) slices: two parts hold exactly the rows of one process's data."""
    import duckdb

    single = tmp_path / "single"
    rows = generate(single, 0.1)
    assert rows["lineitem"] == sf01.tables["lineitem"].rows
    con = duckdb.connect()
    sums = []
    for folder in (single, sf01.folder):
        sums.append(con.execute(
            f"SELECT count(*), sum(l_orderkey * 7 + l_linenumber), sum(l_extendedprice) "
            f"FROM read_parquet('{folder}/lineitem/part-*.parquet')").fetchone())
    assert sums[0] == sums[1]


def test_bytes_read_follow_the_encoding(sf001):
    plain = make_source("host-pinned", sf001.tables, "plain", CPU, 10_000)
    compact = make_source("host-pinned", sf001.tables, "compact", CPU, 10_000)
    PLANS["q6"](plain), PLANS["q6"](compact)
    n = sf001.tables["lineitem"].rows
    assert plain.bytes_read == n * (4 + 8 + 8 + 8)  # int32 date, three int64 cents columns
    assert compact.bytes_read == n * (2 + 1 + 1 + 4)  # int16 days, uint8, uint8, int32


def test_compact_encoding_is_exact_and_narrow(sf001):
    li = sf001.tables["lineitem"]
    kinds = {"l_shipdate": np.int16, "l_quantity": np.uint8, "l_discount": np.uint8,
             "l_tax": np.uint8, "l_extendedprice": np.int32, "l_returnflag": np.uint8,
             "l_orderkey": np.int32}  # keys: 4 bytes in place of 8
    for name, dtype in kinds.items():
        enc = encode(li[name], "compact")
        assert enc.data.dtype == dtype, name
        assert np.array_equal(enc.decode_numpy(), li[name].values)
        back = enc.decode(torch, torch.from_numpy(enc.data))
        assert back.dtype == torch.from_numpy(li[name].values).dtype
        assert torch.equal(back, torch.from_numpy(li[name].values))
    assert encode(li["l_quantity"], "compact").factor == 100  # whole units stored, cents back


def test_columns_are_exact(sf001):
    li = sf001.tables["lineitem"]
    import duckdb

    con = duckdb.connect()
    first = con.execute(f"SELECT l_extendedprice, l_shipdate, l_returnflag FROM read_parquet("
                        f"'{sf001.folder}/lineitem/part-0.parquet') LIMIT 1").fetchone()
    assert Decimal(int(li["l_extendedprice"].values[0])).scaleb(-2) == first[0]
    assert dt.date(1970, 1, 1) + dt.timedelta(days=int(li["l_shipdate"].values[0])) == first[1]
    rf = li["l_returnflag"]
    assert rf.dictionary[rf.values[0]] == first[2]
    assert list(rf.dictionary) == sorted(rf.dictionary)
