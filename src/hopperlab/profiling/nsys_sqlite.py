"""Read an Nsight Systems SQLite export (``nsys export --type sqlite``) into a ``Timeline``.

Plain ``sqlite3``: no nsys is needed to read an export, so CI tests this against small exports
made on a GPU machine (tests/fixtures/profiling/). Table and column names are those of the
nsys export schema; tables that a profile did not record (no memsets, no unified-memory
tracing, no NVTX) are simply absent from an export, and the reader takes absence as "none".

``trim`` writes a small copy holding only what this reader uses, cut to the capture: the run
keeps that as ``profile.sqlite`` (a few hundred KB where the full export is tens of MB).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Iterable

from hopperlab.profiling.timeline import KERNEL, MEMSET, GpuOp, Range, Timeline
from hopperlab.core.errors import HopperlabError

KERNEL_TABLE = "CUPTI_ACTIVITY_KIND_KERNEL"
MEMCPY_TABLE = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET_TABLE = "CUPTI_ACTIVITY_KIND_MEMSET"
RUNTIME_TABLE = "CUPTI_ACTIVITY_KIND_RUNTIME"
NVTX_TABLE = "NVTX_EVENTS"
STRINGS_TABLE = "StringIds"
COPY_KIND_ENUM = "ENUM_CUDA_MEMCPY_OPER"
NVTX_KIND_ENUM = "ENUM_NSYS_EVENT_TYPE"
ANALYSIS_TABLE = "ANALYSIS_DETAILS"
UM_FAULT_TABLES = {"cpu": "CUDA_UM_CPU_PAGE_FAULT_EVENTS", "gpu": "CUDA_UM_GPU_PAGE_FAULT_EVENTS"}

#: ENUM_CUDA_MEMCPY_OPER labels as nsys writes them, when an export lacks the enum table
_COPY_KIND_FALLBACK = {1: "Host-to-Device", 2: "Device-to-Host", 8: "Device-to-Device",
                       9: "Host-to-Host", 10: "Peer-to-Peer", 11: "Unified Host-to-Device",
                       12: "Unified Device-to-Host"}
#: NVTX event types that are ranges (push/pop and start/end), when the enum table is absent
_RANGE_EVENT_TYPES_FALLBACK = (59, 60, 70, 71)


class NotAnExport(HopperlabError, ValueError):
    """The file is not an nsys SQLite export (or holds no capture at all)."""


def copy_direction(label: str) -> str:
    """``memcpy_h2d``, ``um_h2d``, ... from an ENUM_CUDA_MEMCPY_OPER label."""
    text = label.lower().replace(" ", "").replace("_", "-")
    unified = "unified" in text
    text = text.replace("unified", "")
    names = {"host-to-device": "h2d", "device-to-host": "d2h", "device-to-device": "d2d",
             "host-to-host": "h2h", "peer-to-peer": "p2p"}
    direction = next((short for long, short in names.items() if long in text), "other")
    if unified:
        return f"um_{direction if direction in ('h2d', 'd2h') else 'other'}"
    return f"memcpy_{direction}"


def _tables(db: sqlite3.Connection) -> set[str]:
    return {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def _columns(db: sqlite3.Connection, table: str) -> list[str]:
    return [r[1] for r in db.execute(f'PRAGMA table_info("{table}")')]


def _enum(db: sqlite3.Connection, table: str, tables: set[str]) -> dict[int, str]:
    if table not in tables:
        return {}
    cols = _columns(db, table)
    label = "label" if "label" in cols else "name"
    return {int(i): str(v) for i, v in db.execute(f'SELECT id, "{label}" FROM "{table}"')}


def _strings(db: sqlite3.Connection, tables: set[str]) -> dict[int, str]:
    if STRINGS_TABLE not in tables:
        return {}
    return {int(i): str(v) for i, v in db.execute(f"SELECT id, value FROM {STRINGS_TABLE}")}


def _range_event_types(db: sqlite3.Connection, tables: set[str]) -> tuple[int, ...]:
    kinds = _enum(db, NVTX_KIND_ENUM, tables)
    found = tuple(i for i, name in kinds.items()
                  if "nvtx" in name.lower() and "range" in name.lower())
    return found or _RANGE_EVENT_TYPES_FALLBACK


def activity_span(db: sqlite3.Connection, tables: set[str] | None = None
                  ) -> tuple[int, int] | None:
    """First start and last end of the GPU work and CUDA API calls recorded (not NVTX: a range
    opened before the capture keeps its earlier start, seen 0.5 s before it)."""
    tables = _tables(db) if tables is None else tables
    starts, ends = [], []
    for table in (KERNEL_TABLE, MEMCPY_TABLE, MEMSET_TABLE, RUNTIME_TABLE):
        if table in tables:
            lo, hi = db.execute(f'SELECT MIN(start), MAX("end") FROM "{table}"').fetchone()
            if lo is not None and hi is not None:
                starts.append(int(lo))
                ends.append(int(hi))
    return (min(starts), max(ends)) if starts else None


def capture_window(db: sqlite3.Connection, tables: set[str] | None = None
                   ) -> tuple[int, int] | None:
    """The recorded window in ns.

    ANALYSIS_DETAILS' startTime/stopTime where they enclose what was recorded (a whole-process
    profile: the window then includes the idle start-up, as it should). Under
    ``--capture-range=cudaProfilerApi`` nsys 2025.3 writes there the right duration but at
    another origin than the events' timestamps (seen on the lent H100: a 0.92 s window that
    held none of the run's 880 kernels), so there the window is the span of the recorded
    activity: under a capture range nothing outside the capture is recorded.
    """
    tables = _tables(db) if tables is None else tables
    span = activity_span(db, tables)
    if ANALYSIS_TABLE in tables:
        cols = _columns(db, ANALYSIS_TABLE)
        if "startTime" in cols and "stopTime" in cols:
            row = db.execute(f"SELECT MIN(startTime), MAX(stopTime) FROM {ANALYSIS_TABLE}").fetchone()
            if row and row[0] is not None and row[1] is not None and row[1] > row[0]:
                window = int(row[0]), int(row[1])
                if span is None or (window[0] <= span[0] and span[1] <= window[1]):
                    return window
    return span


def read_timeline(path: Path | str) -> Timeline:
    """The Timeline of an export (see the module docstring)."""
    path = Path(path)
    if not path.is_file():
        raise NotAnExport(f"{path}: no such file")
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        tables = _tables(db)
        if not tables & {KERNEL_TABLE, MEMCPY_TABLE, MEMSET_TABLE, NVTX_TABLE, RUNTIME_TABLE,
                         ANALYSIS_TABLE}:
            raise NotAnExport(f"{path}: not an nsys SQLite export (none of its tables)")
        window = capture_window(db, tables)
        if window is None:
            raise NotAnExport(f"{path}: the export recorded no GPU work and no capture window")
        strings = _strings(db, tables)
        ops: list[GpuOp] = []
        if KERNEL_TABLE in tables:
            cols = _columns(db, KERNEL_TABLE)
            # grouped by the demangled name, as nsys' cuda_gpu_kern_sum and torch traces do
            name_col = "demangledName" if "demangledName" in cols else "shortName"
            for start, end, name_id in db.execute(
                    f'SELECT start, "end", "{name_col}" FROM {KERNEL_TABLE}'):
                ops.append(GpuOp(int(start), int(end), KERNEL, strings.get(name_id, str(name_id))))
        if MEMCPY_TABLE in tables:
            labels = _enum(db, COPY_KIND_ENUM, tables) or _COPY_KIND_FALLBACK
            for start, end, nbytes, kind in db.execute(
                    f'SELECT start, "end", bytes, copyKind FROM {MEMCPY_TABLE}'):
                label = labels.get(int(kind), f"kind {kind}")
                ops.append(GpuOp(int(start), int(end), copy_direction(label), label,
                                 int(nbytes or 0)))
        if MEMSET_TABLE in tables:
            for start, end, nbytes in db.execute(
                    f'SELECT start, "end", bytes FROM {MEMSET_TABLE}'):
                ops.append(GpuOp(int(start), int(end), MEMSET, "memset", int(nbytes or 0)))
        ranges = list(_nvtx_ranges(db, tables, strings))
        faults: dict[str, int] | None = None
        missing: list[str] = []
        present = {w: t for w, t in UM_FAULT_TABLES.items() if t in tables}
        if present:
            faults = {}
            for where, table in present.items():
                # a GPU fault record groups numberOfPageFaults faults (as nsys' um_total_sum counts)
                count = "SUM(numberOfPageFaults)" if "numberOfPageFaults" in _columns(db, table) \
                    else "COUNT(*)"
                (n,) = db.execute(f"SELECT {count} FROM {table} WHERE start >= ? AND start <= ?",
                                  window).fetchone()
                faults[where] = int(n or 0)
        if faults is None and not any(op.kind.startswith("um_") for op in ops):
            missing.append("unified memory")  # not traced (no --cuda-um-*-page-faults)
        if NVTX_TABLE not in tables:
            missing.append("NVTX")
        return Timeline("nsys", window[0], window[1], ops, ranges, faults, missing)
    except sqlite3.DatabaseError as exc:
        raise NotAnExport(f"{path}: {exc}") from None
    finally:
        db.close()


def _nvtx_ranges(db: sqlite3.Connection, tables: set[str], strings: dict[int, str]
                 ) -> Iterable[Range]:
    if NVTX_TABLE not in tables:
        return
    cols = _columns(db, NVTX_TABLE)
    kinds = _range_event_types(db, tables)
    text = "text" if "text" in cols else "NULL"
    text_id = "textId" if "textId" in cols else "NULL"
    marks = ",".join("?" * len(kinds))
    rows = db.execute(
        f'SELECT start, "end", {text}, {text_id} FROM {NVTX_TABLE} '
        f'WHERE "end" IS NOT NULL AND "end" > start AND eventType IN ({marks})', kinds)
    for start, end, txt, tid in rows:
        name = txt if txt is not None else strings.get(tid, "") if tid is not None else ""
        yield Range(int(start), int(end), str(name))


# --------------------------------------------------------------------------- trimming
#: the columns ``read_timeline`` reads, per table (all other tables and columns are dropped)
_KEEP = {
    KERNEL_TABLE: ("start", "end", "deviceId", "streamId", "shortName", "demangledName"),
    MEMCPY_TABLE: ("start", "end", "deviceId", "streamId", "bytes", "copyKind"),
    MEMSET_TABLE: ("start", "end", "deviceId", "streamId", "bytes"),
    RUNTIME_TABLE: ("start", "end"),
    NVTX_TABLE: ("start", "end", "eventType", "text", "textId", "globalTid"),
    UM_FAULT_TABLES["cpu"]: ("start", "end"),
    UM_FAULT_TABLES["gpu"]: ("start", "end", "numberOfPageFaults"),
}
_KEEP_WHOLE = (COPY_KIND_ENUM, NVTX_KIND_ENUM, ANALYSIS_TABLE)


def trim(src: Path | str, dst: Path | str) -> Path:
    """Copy of ``src`` with only what ``read_timeline`` reads, rows cut to the capture window.

    Rows that end before the capture or start after it go; StringIds keeps the strings still
    referenced. The result reads to the same metrics as the full export.
    """
    src, dst = Path(src), Path(dst)
    dst.unlink(missing_ok=True)
    db = sqlite3.connect(f"file:{src}?mode=ro", uri=True)
    out = sqlite3.connect(dst)
    try:
        tables = _tables(db)
        window = capture_window(db, tables)
        if window is None:
            raise NotAnExport(f"{src}: nothing to keep (no capture window)")
        used_strings: set[int] = set()
        for table, wanted in _KEEP.items():
            if table not in tables:
                continue
            cols = [c for c in wanted if c in _columns(db, table)]
            quoted = ", ".join(f'"{c}"' for c in cols)
            out.execute(f'CREATE TABLE "{table}" ({quoted})')
            end = '"end"' if "end" in cols else "start"
            rows = db.execute(f'SELECT {quoted} FROM "{table}" WHERE {end} >= ? AND start <= ?',
                              window).fetchall()
            out.executemany(f'INSERT INTO "{table}" VALUES ({",".join("?" * len(cols))})', rows)
            for name in ("shortName", "demangledName", "textId"):
                if name in cols:
                    i = cols.index(name)
                    used_strings.update(r[i] for r in rows if r[i] is not None)
        for table in _KEEP_WHOLE:
            if table in tables:
                sql = db.execute("SELECT sql FROM sqlite_master WHERE name = ?",
                                 (table,)).fetchone()[0]
                out.execute(sql)
                rows = db.execute(f'SELECT * FROM "{table}"').fetchall()
                if rows:
                    out.executemany(f'INSERT INTO "{table}" VALUES '
                                    f'({",".join("?" * len(rows[0]))})', rows)
        if STRINGS_TABLE in tables:
            out.execute(f"CREATE TABLE {STRINGS_TABLE} (id INTEGER PRIMARY KEY, value TEXT)")
            ids = sorted(used_strings)
            for i in range(0, len(ids), 500):
                chunk = ids[i:i + 500]
                rows = db.execute(f"SELECT id, value FROM {STRINGS_TABLE} WHERE id IN "
                                  f"({','.join('?' * len(chunk))})", chunk).fetchall()
                out.executemany(f"INSERT INTO {STRINGS_TABLE} VALUES (?, ?)", rows)
        out.commit()
        out.execute("VACUUM")
    finally:
        db.close()
        out.close()
    return dst
