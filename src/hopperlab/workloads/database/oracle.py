"""DuckDB as peer and oracle: the same query text on the CPU, its answer, its time.

The tables are loaded once into DuckDB's own memory (only the columns the queries read), so the
timed query measures query processing on all of the node's cores, not Parquet decoding: the
fair peer of a GPU query whose columns are already in host or GPU memory.

``compare`` decides whether two answers are equal: same rows in the same order; integers,
decimals, dates and strings exactly; floating values (averages, ratios) to 1e-9 relative.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any, Mapping, Sequence

from hopperlab.core.errors import HopperlabError
from hopperlab.workloads.database.columns import table_files

FLOAT_RTOL = 1e-9


class AnswerMismatch(HopperlabError, AssertionError):
    """A GPU answer that differs from DuckDB's (the run ends ``failed``, the difference shown)."""


class DuckPeer:
    def __init__(self, folder: Path | str, needs: Mapping[str, Sequence[str]],
                 threads: int | None = None) -> None:
        import duckdb

        self.threads = int(threads or os.cpu_count() or 1)
        self.con = duckdb.connect()
        self.con.execute(f"SET threads={self.threads}")
        self.version = duckdb.__version__
        #: queries executed so far (``run``): what an energy window around the peer counts
        self.executed = 0
        for table, cols in needs.items():
            files = ", ".join(f"'{p}'" for p in table_files(Path(folder), table))
            self.con.execute(f"CREATE TABLE {table} AS SELECT {', '.join(cols)} "
                             f"FROM read_parquet([{files}])")

    def run(self, text: str) -> list[tuple]:
        """The answer to ``text``, every row fetched; counted in ``executed``."""
        rows = [tuple(r) for r in self.con.execute(text).fetchall()]
        self.executed += 1
        return rows

    def timed(self, text: str, warmup: int, repeats: int) -> tuple[list[tuple], list[float]]:
        """The answer and ``repeats`` wall times (ms) after ``warmup`` untimed runs."""
        rows: list[tuple] = []
        for _ in range(warmup):
            rows = self.run(text)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            rows = self.run(text)
            times.append((time.perf_counter() - t0) * 1e3)
        return rows, times

    def close(self) -> None:
        self.con.close()


def _same(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, float) or isinstance(b, float):
        x, y = float(a), float(b)
        if math.isnan(x) or math.isnan(y):
            return False
        return abs(x - y) <= FLOAT_RTOL * max(abs(x), abs(y)) or x == y
    if isinstance(a, Decimal) or isinstance(b, Decimal):
        return Decimal(a) == Decimal(b)
    return a == b


def compare(expected: Sequence[tuple], got: Sequence[tuple], limit: int = 5) -> list[str]:
    """The differences between two answers (empty when equal), at most ``limit`` described."""
    diffs: list[str] = []
    if len(expected) != len(got):
        diffs.append(f"{len(got)} rows, DuckDB has {len(expected)}")
    for i, (e, g) in enumerate(zip(expected, got)):
        if len(e) != len(g):
            diffs.append(f"row {i}: {len(g)} values, DuckDB has {len(e)}")
            continue
        for j, (x, y) in enumerate(zip(e, g)):
            if not _same(x, y):
                diffs.append(f"row {i} column {j}: got {y!r}, DuckDB {x!r}"
                             + (f" (difference {_difference(x, y)})" if _numeric(x, y) else ""))
        if len(diffs) >= limit:
            break
    return diffs[:limit]


def _numeric(x: Any, y: Any) -> bool:
    ok = (int, float, Decimal)
    return isinstance(x, ok) and isinstance(y, ok) and not isinstance(x, bool)


def _difference(x: Any, y: Any) -> str:
    if isinstance(x, float) or isinstance(y, float):
        d = float(y) - float(x)
        rel = abs(d) / max(abs(float(x)), 1e-300)
        return f"{d:+.3e}, relative {rel:.3e}"
    return f"{Decimal(y) - Decimal(x):+}"


@dataclass
class Timing:
    median_ms: float
    min_ms: float
    max_ms: float
    samples: list[float]


def summarize(times: Sequence[float]) -> Timing:
    return Timing(float(statistics.median(times)), float(min(times)), float(max(times)),
                  list(times))
