"""The database family's contract, operators, oracle and property tests (CPU).

* the family declaration, params validation, the experiments file resolving through the spec layer;
* the workload into a real Recorder: per-query metrics, a wrong answer failing the run with the
  difference shown, managed placement skipped without a GPU, knob/placement consistency;
* exact aggregation (no overflow, bins, blocks), top-k tie order, the answer comparison;
* hypothesis: Q6-style predicates (any date range, discount range, quantity bound) give DuckDB's
  answer, through the device and the streamed compact sources.
"""

from __future__ import annotations

import json
from decimal import Decimal

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("duckdb")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from hopperlab.assets.tpch import generate  # noqa: E402
from hopperlab.core.rundir import Recorder, SkipRun  # noqa: E402
from hopperlab.workloads import family_info  # noqa: E402
from hopperlab.workloads.base import fake_run  # noqa: E402
from hopperlab.workloads.database import (  # noqa: E402
    FAMILY,
    QUERIES,
    DatabaseParams,
    workload,  # noqa: E402
)
from hopperlab.workloads.database import plans as plans_module  # noqa: E402
from hopperlab.workloads.database.columns import load_tables  # noqa: E402
from hopperlab.workloads.database.operators import group_sums, safe_rows, top_k  # noqa: E402
from hopperlab.workloads.database.oracle import AnswerMismatch, DuckPeer, compare  # noqa: E402
from hopperlab.workloads.database.placement import make_source  # noqa: E402
from hopperlab.workloads.database.sql import Q6, Q6Params, q6_sql  # noqa: E402

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def tpch(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tpch")
    generate(folder, 0.01)
    (folder / "MANIFEST.sha256").write_text("")  # what spec.asset_path checks for
    return folder


def spec(folder, placement="device", memory="device", profiler="none", **params):
    values = {"repeats": 1, "warmup": 0, "chunk_rows": 16384, "placement": placement, **params}
    return fake_run(DatabaseParams(**values), assets={"tables": folder}, memory=memory,
                    profiler=profiler)


# --------------------------------------------------------------------------- contract
def test_family_is_discovered_and_cheap():
    info = family_info("database")
    assert info is FAMILY and info.entry.endswith("workload:run")
    assert info.supported_knobs["memory"] == {"device", "managed", "system"}
    assert "q6_time_ms" in info.headline_metrics and "all_correct" in info.headline_metrics


@pytest.mark.parametrize("bad,needle", [
    ({"queries": ("q2",)}, "queries: expected each one of"), ({"queries": ()}, "at least one"),
    ({"queries": ("q1", "q1")}, "at most once"), ({"placement": "gpu"}, "placement"),
    ({"encoding": "zstd"}, "encoding"), ({"chunk_rows": 0}, "chunk_rows"),
    ({"repeats": True}, "repeats"), ({"link_gbps": -1.0}, "link_gbps"),
    ({"prefetch": "yes"}, "prefetch")])
def test_params_are_validated(bad, needle):
    with pytest.raises(ValueError, match=needle):
        DatabaseParams(**bad)


def test_experiments_file_resolves():
    from hopperlab.config.matrix import load_matrix

    matrix = load_matrix(".", {"families": ["database"]})
    runs = {k: r for k, r in matrix.runs.items() if k.startswith("database/")}
    # the system placement skips on a CPU node before the tables load (Grace Hopper only)
    working = [k for k, r in runs.items() if r.params.placement != "system"]
    assert len(working) <= 8, "the family's smoke matrix must stay small"
    for key, run in runs.items():
        assert run.assets == {"tables": "tpch-sf0.01"}, key
        assert (run.knobs.memory == "managed") == (run.params.placement == "managed"), key
        assert (run.knobs.memory == "system") == (run.params.placement == "system"), key
    full = load_matrix(".", {"families": ["database"], "scale": "full"})
    for key, run in full.runs.items():
        if key.startswith("database/"):
            assert run.assets == {"tables": "tpch-sf10"} and run.resources.gpus == 1


# --------------------------------------------------------------------------- workload
def finish(tmp_path, s):
    rec = Recorder(tmp_path / "run", identity={"family": "database"})
    try:
        workload.run(s, rec)
    except SkipRun as exc:
        return rec.finish("skipped", str(exc)), rec
    return rec.finish("ok"), rec


@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
def test_workload_records_every_query(tmp_path, tpch):
    record, rec = finish(tmp_path, spec(tpch, "host-pinned", encoding="compact"))
    m = record["metrics"]
    assert record["status"] == "ok" and m["all_correct"] == 1.0
    for q in QUERIES:
        assert m[f"{q}_correct"] == 1.0
        assert m[f"{q}_time_ms"] > 0 and m[f"{q}_duckdb_ms"] > 0 and m[f"{q}_bytes_read"] > 0
        assert m[f"{q}_speedup_vs_duckdb"] == pytest.approx(m[f"{q}_duckdb_ms"]
                                                            / m[f"{q}_time_ms"])
        assert f"{q}_link_fraction" not in m  # no GPU: no link was measured
    assert record["tags"]["database.target"] == "cpu"
    answers = json.loads((tmp_path / "run/artifacts/answers.json").read_text())
    assert answers["q6"]["plan"] == answers["q6"]["duckdb"]


def test_wrong_answer_fails_the_run_with_the_difference(tmp_path, tpch, monkeypatch):
    real = plans_module.PLANS["q6"]

    def off_by_one_cent(src):
        (value,), = real(src)
        return [(value + Decimal("0.0001"),)]

    monkeypatch.setitem(plans_module.PLANS, "q6", off_by_one_cent)
    s = spec(tpch, queries=("q1", "q6"))
    rec = Recorder(tmp_path / "run", identity={"family": "database"})
    with pytest.raises(AnswerMismatch, match=r"q6: row 0 column 0: .*difference \+0\.0001"):
        workload.run(s, rec)
    assert rec.metrics["q6_correct"] == 0.0 and rec.metrics["q1_correct"] == 1.0
    assert rec.metrics["all_correct"] == 0.0


def test_managed_skips_without_gpu(tmp_path, tpch):
    record, _ = finish(tmp_path, spec(tpch, "managed", memory="managed"))
    assert record["status"] == "skipped" and "CUDA device" in record["reason"]


def test_memory_knob_must_match_placement():
    from hopperlab.workloads.base import Contradiction, Knobs

    with pytest.raises(Contradiction, match="memory: managed goes with placement: managed"):
        FAMILY.check(Knobs(memory="managed"), DatabaseParams(placement="device"))
    FAMILY.check(Knobs(memory="managed"), DatabaseParams(placement="managed"))


def test_torch_profiler_trace(tmp_path, tpch):
    record, _ = finish(tmp_path, spec(tpch, queries=("q6",), profiler="torch"))
    trace = (tmp_path / "run/artifacts/profile/torch_trace.json").read_text()
    assert record["status"] == "ok" and "query.filter" in trace and "query.aggregate" in trace


# --------------------------------------------------------------------------- operators
def test_group_sums_exact_past_int64():
    """Values whose total exceeds int64: the bins/blocks keep every partial sum in range."""
    big = 2**61 - 1
    n = 40
    vals = torch.full((n,), big, dtype=torch.int64)
    groups = torch.arange(n) % 3
    mask = torch.ones(n, dtype=torch.bool)
    mask[::5] = False
    got = group_sums(groups, 3, [vals, torch.ones(n, dtype=torch.int64)], mask, big)
    for g in range(3):
        rows = [i for i in range(n) if i % 3 == g and i % 5]
        assert got[g] == [big * len(rows), len(rows)]
    one = group_sums(torch.zeros(n, dtype=torch.int64), 1, [vals], None, big)
    assert one == [[big * n]] and safe_rows(big) == 2


def test_top_k_breaks_ties_like_order_by():
    revenue = torch.tensor([5, 9, 9, 1, 9, 7])
    date = torch.tensor([3, 2, 1, 0, 1, 5])
    idx = top_k(3, [(revenue, True), (date, False)]).tolist()
    assert idx == [2, 4, 1]  # 9 (date 1, first row), 9 (date 1, later row), 9 (date 2)


def test_compare_rules():
    assert compare([(Decimal("1.50"), 2.0)], [(Decimal("1.5"), 2.0 * (1 + 5e-10))]) == []
    assert compare([(1.0,)], [(1.0 + 1e-8,)])[0].startswith("row 0 column 0")
    assert compare([(Decimal("1.00"),)], [(Decimal("1.01"),)]) != []
    assert compare([("A", 1)], [("A", 1), ("B", 2)])[0] == "2 rows, DuckDB has 1"
    assert compare([(None,)], [(None,)]) == []


def test_q6_text_is_the_specification():
    assert " ".join(q6_sql(Q6Params()).split()) == " ".join(Q6.split())


# --------------------------------------------------------------------------- properties
@pytest.fixture(scope="module")
def q6_world(tpch):
    needs = {"lineitem": plans_module.NEEDS["q6"]["lineitem"]}
    tables = load_tables(tpch, needs)
    peer = DuckPeer(tpch, needs, threads=1)
    sources = [make_source("device", tables, "plain", CPU, 1 << 20),
               make_source("host-pinned", tables, "compact", CPU, 7_000)]
    yield peer, sources
    peer.close()


days = st.dates(min_value=__import__("datetime").date(1991, 12, 1),
                max_value=__import__("datetime").date(1999, 1, 31))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(start=days, length=st.integers(0, 900), lo=st.integers(-1, 11), width=st.integers(-1, 6),
       qty=st.integers(0, 52).map(lambda u: u * 100) | st.integers(0, 5100))
def test_q6_style_predicates_match_duckdb(q6_world, start, length, lo, width, qty):
    import datetime as dt

    peer, sources = q6_world
    p = Q6Params(date_from=start.isoformat(),
                 date_to=(start + dt.timedelta(days=length)).isoformat(),
                 discount_lo=lo, discount_hi=lo + width, quantity_below=qty)
    expected = peer.run(q6_sql(p))
    for src in sources:
        got = plans_module.q6(src, p)
        assert not compare(expected, got), (p, expected, got, src.placement)


@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
def test_fused_kernels_under_triton_interpreter(tpch):
    """The fused Q1/Q6 Triton kernels (GPU only otherwise) run in Triton's CPU interpreter and
    give DuckDB's answers, from plain and compact stored columns, whole or in chunks."""
    pytest.importorskip("triton")
    import os
    import subprocess
    import sys

    code = f"""
import torch
from hopperlab.workloads.database import fused
from hopperlab.workloads.database.columns import load_tables
from hopperlab.workloads.database.oracle import DuckPeer, compare
from hopperlab.workloads.database.placement import make_source
from hopperlab.workloads.database.plans import PLANS, needs_of, q6
from hopperlab.workloads.database.sql import SQL, Q6Params, q6_sql
folder = {str(tpch)!r}
needs = needs_of(["q1", "q6"])
tables = load_tables(folder, needs)
peer = DuckPeer(folder, needs, threads=1)
other = Q6Params("1993-03-01", "1996-07-15", 2, 9, 3050)
for placement, encoding in [("device", "plain"), ("zero-copy", "compact")]:
    src = make_source(placement, tables, encoding, torch.device("cpu"), 25_000)
    assert src.fused and fused.available(src.device)
    for q in ("q1", "q6"):
        assert not compare(peer.run(SQL[q]), PLANS[q](src)), (placement, encoding, q)
    assert not compare(peer.run(q6_sql(other)), q6(src, other))
print("fused ok")
"""
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode == 0 and "fused ok" in out.stdout, out.stderr[-3000:]


def test_repeats_are_windows_of_the_queries_after_one_load(tmp_path, tpch):
    """repeats: 2 loads the tables and asks DuckDB once, then times the queries twice."""
    from hopperlab.run import repeats
    from hopperlab.workloads.database import FAMILY as DB

    s = spec(tpch, queries=("q1", "q6"))
    s.repeats, s.headline_metrics = 2, DB.headline_metrics
    rec = Recorder(tmp_path / "run")
    repeats.measure(workload.run, s, rec, DB)
    assert len(rec.samples) == 2 and {"q1_time_ms", "q6_time_ms"} <= set(rec.samples[1])
    assert rec.metrics["q6_time_ms_n"] == 2 and rec.metrics["all_correct"] == 1.0


@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
def test_the_duckdb_queries_counted_are_those_its_window_ran(tmp_path, tpch, monkeypatch):
    """Issue 36: the DuckDB peer's work done is every query it executed while its own energy
    window was open (warm-ups too: they run inside), so its J per query is the window's joules
    over them; the GPU side's count is its own window's."""
    from hopperlab.core.window import listening

    open_windows: list[str] = []
    ran = {"duckdb": 0, "other": 0}
    real_run = DuckPeer.run

    def counting_run(self, text):
        ran["duckdb" if "duckdb" in open_windows else "other"] += 1
        return real_run(self, text)

    def listener(event, name):
        if event == "start":
            open_windows.append(name)
        else:
            open_windows.remove(name)

    monkeypatch.setattr(DuckPeer, "run", counting_run)
    with listening(listener):
        record, _ = finish(tmp_path, spec(tpch, queries=("q1", "q6"), warmup=1, repeats=2))
    m = record["metrics"]
    assert record["status"] == "ok"
    assert ran["duckdb"] > 0 and m["duckdb_measured_queries"] == ran["duckdb"]
    assert m["measured_queries"] == 2 * (1 + 2)


def test_each_plan_runs_once_before_the_measured_window(tmp_path, tpch, monkeypatch):
    """Issue 36: the energy window holds the queries, not their first call (kernel compiles,
    the allocator's first blocks): each plan runs once before it opens, and every run inside it
    is counted as work done."""
    from hopperlab.core.window import MEASURED, listening

    open_windows: list[str] = []
    calls: list[tuple[str, bool, int]] = []   # (query, window open, executions)
    real = workload.run_query

    def spy(source, q, warmup, repeats, on_sample=None):
        calls.append((q, MEASURED in open_windows, warmup + repeats))
        return real(source, q, warmup, repeats, on_sample)

    def listener(event, name):
        (open_windows.append if event == "start" else open_windows.remove)(name)

    monkeypatch.setattr(workload, "run_query", spy)
    with listening(listener):
        record, _ = finish(tmp_path, spec(tpch, queries=("q1", "q6"), warmup=1, repeats=2))
    assert record["status"] == "ok"
    assert calls[:2] == [("q1", False, 1), ("q6", False, 1)]
    inside = [c for c in calls if c[1]]
    assert [c[0] for c in inside] == ["q1", "q6"] and len(calls) == 4
    assert record["metrics"]["measured_queries"] == sum(c[2] for c in inside) == 6
