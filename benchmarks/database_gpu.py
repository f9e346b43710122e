"""TPC-H on the GPU in every placement and encoding, against DuckDB, on one node.

Standalone (needs torch, numpy, pyarrow, duckdb 1.5.5 + duckdb-extension-tpch; a GPU for the
GPU figures): generates the data (``hopperlab.assets.tpch``), loads the columns, runs each query
in DuckDB on all cores (oracle and peer: answer and median time), measures the pinned
host->device bandwidth, then times every plan in each (placement, encoding) and checks every
answer. Prints a table and writes ``database_gpu.json`` to ``--out``.

    PYTHONPATH=src python3 benchmarks/database_gpu.py --sf 10 --parts 16 --out OUT

The workload (``hopperlab run database/...``) measures the same way, one variant per run; this
script shares the loaded data and DuckDB's answers across variants to fit a short lease.
The GH200 column is a *prediction*, not a measurement: max(bytes_read / C2C GB/s, the same
plan's device-resident time), with C2C at 346 GB/s host->device (measured by others; the
datasheet says 450 GB/s per direction).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path

GH200_C2C_GBPS = 346.0
#: placement[-torch]:encoding; "-torch": PyTorch operators only (no fused Triton kernels)
COMBOS = ("device:plain", "device-torch:plain", "device:compact", "host-pinned-torch:plain", "host-pinned:plain", "host-pinned:compact",
          "zero-copy:plain", "zero-copy:compact", "managed:plain", "managed-noprefetch:plain",
          "managed:compact", "pageable:plain", "pageable:compact")


def _log(msg: str) -> None:
    print(msg, flush=True)


def machine() -> dict:
    import torch

    info = {"python": sys.version.split()[0], "torch": torch.__version__,
            "cuda": getattr(torch.version, "cuda", None), "cpus": os.cpu_count(),
            "platform": platform.platform()}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,"
                                  "pcie.link.gen.current,pcie.link.width.current",
                                  "--format=csv,noheader"], capture_output=True, text=True,
                                 timeout=20)
            info["nvidia_smi"] = out.stdout.strip()
        except (OSError, subprocess.SubprocessError) as exc:
            info["nvidia_smi"] = f"unavailable: {exc}"
    import duckdb

    info["duckdb"] = duckdb.__version__
    return info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sf", type=float, default=10.0)
    ap.add_argument("--parts", type=int, default=16)
    ap.add_argument("--data", default="/tmp/hopperlab-tpch")
    ap.add_argument("--out", default=".")
    ap.add_argument("--queries", default="q1,q3,q5,q6,q12,q14")
    ap.add_argument("--combos", default=",".join(COMBOS))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--chunk-rows", type=int, default=16 * 2**20)
    ap.add_argument("--fused-block", type=int, default=None, help="rows per Triton program")
    ap.add_argument("--fused-warps", type=int, default=None, help="warps per Triton program")
    ap.add_argument("--zero-copy-chunked", action="store_true",
                    help="zero-copy fused kernels read the columns in chunk_rows pieces, "
                         "not whole (placement.ZERO_COPY_WHOLE_COLUMN)")
    ap.add_argument("--budget-s", type=float, default=1e9,
                    help="start no new variant after this many seconds")
    args = ap.parse_args(argv)
    t_start = time.monotonic()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)

    import torch

    from hopperlab.assets.tpch import generate
    from hopperlab.workloads.database.columns import load_tables
    from hopperlab.workloads.database.engine import HOST_RESIDENT, QueryFigures, run_query
    from hopperlab.workloads.database.oracle import DuckPeer, compare
    from hopperlab.workloads.database.placement import make_source
    from hopperlab.workloads.database.plans import needs_of
    from hopperlab.workloads.database.sql import SQL

    from hopperlab.workloads.database import fused

    if args.fused_block:
        fused.BLOCK = args.fused_block
    if args.fused_warps:
        fused.NUM_WARPS = args.fused_warps
    if args.zero_copy_chunked:
        from hopperlab.workloads.database import placement as _placement

        _placement.ZERO_COPY_WHOLE_COLUMN = False
    queries = args.queries.split(",")
    report: dict = {"machine": machine(), "args": vars(args), "timings_s": {}, "results": [],
                    "errors": []}
    _log(f"machine: {report['machine']}")
    data = Path(args.data) / f"sf{args.sf:g}"
    if not (data / "lineitem").is_dir():
        t = time.monotonic()
        rows = generate(data, args.sf, args.parts)
        report["timings_s"]["generate"] = time.monotonic() - t
        report["rows"] = rows
        _log(f"generated SF {args.sf:g} in {report['timings_s']['generate']:.1f} s: {rows}")
    needs = needs_of(queries)
    t = time.monotonic()
    tables = load_tables(data, needs)
    report["timings_s"]["load_columns"] = time.monotonic() - t
    _log(f"columns loaded in {report['timings_s']['load_columns']:.1f} s")

    t = time.monotonic()
    peer = DuckPeer(data, needs)
    report["timings_s"]["duckdb_load"] = time.monotonic() - t
    expected, duck_ms = {}, {}
    for q in queries:
        rows, times = peer.timed(SQL[q], 1, args.repeats)
        expected[q], duck_ms[q] = rows, sorted(times)[len(times) // 2]
        _log(f"duckdb {q}: {duck_ms[q]:.2f} ms ({peer.threads} threads)")
    peer.close()
    report["duckdb_ms"] = duck_ms

    cuda = torch.cuda.is_available()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    link = None
    if cuda:
        from hopperlab.cuda.link import MIB, pinned_copy_gbps

        link = pinned_copy_gbps(device, "h2d", 256 * MIB, copies=4, samples=3, verify=True)
        _log(f"pinned H2D: {link:.1f} GB/s")
    report["link_gbps"] = link

    runtime = None
    device_ms: dict[tuple[str, str], float] = {}
    for combo in args.combos.split(","):
        if time.monotonic() - t_start > args.budget_s:
            report["errors"].append(f"{combo}: not run (time budget of {args.budget_s} s spent)")
            _log(report["errors"][-1])
            continue
        placement, encoding = combo.split(":")
        use_fused = None
        if placement.endswith("-torch"):
            placement, use_fused = placement[: -len("-torch")], False
        prefetch = placement != "managed-noprefetch"
        placement = "managed" if placement.startswith("managed") else placement
        if placement == "managed":
            if not cuda:
                continue
            from hopperlab.workloads.database.workload import managed_runtime
            from hopperlab.workloads.database.encoding import encode

            need = sum(encode(c, encoding).data.nbytes for tb in tables.values()
                       for c in tb.columns.values())
            try:
                runtime = managed_runtime(device, need, False)
            except Exception as exc:  # SkipRun: the free-memory rule said no
                report["errors"].append(f"{combo}: skipped: {exc}")
                continue
        t = time.monotonic()
        try:
            source = make_source(placement, tables, encoding, device, args.chunk_rows,
                                 runtime=runtime, prefetch=prefetch, fused=use_fused)
        except Exception as exc:  # noqa: BLE001 - recorded, the next variant runs
            report["errors"].append(f"{combo}: setup failed: {type(exc).__name__}: {exc}")
            _log(report["errors"][-1])
            traceback.print_exc()
            continue
        setup_s = time.monotonic() - t
        try:
            for q in queries:
                try:
                    res = run_query(source, q, args.warmup, args.repeats)
                except Exception as exc:  # noqa: BLE001
                    report["errors"].append(f"{combo} {q}: {type(exc).__name__}: {exc}")
                    _log(report["errors"][-1])
                    traceback.print_exc()
                    continue
                diffs = compare(expected[q], res.rows)
                fig = QueryFigures(q, res.time_ms, res.bytes_read, duck_ms[q], not diffs, link,
                                   placement in HOST_RESIDENT)
                m = {k.split("_", 1)[1]: v for k, v in fig.metrics().items()}
                if placement == "device" and source.fused:
                    device_ms[(q, encoding)] = res.time_ms
                row = {"query": q, "placement": combo.split(":")[0], "encoding": encoding,
                       "fused": source.fused and q in ("q1", "q6"),
                       **m, "times_ms": res.times_ms, "differences": diffs,
                       "setup_s": setup_s}
                if placement in HOST_RESIDENT and (q, encoding) in device_ms:
                    row["gh200_predicted_ms"] = max(res.bytes_read / (GH200_C2C_GBPS * 1e9) * 1e3,
                                                    device_ms[(q, encoding)])
                report["results"].append(row)
                _log(f"{combo:26s} {q:4s} {res.time_ms:9.2f} ms {m.get('gbps', 0):7.1f} GB/s "
                     f"link {m.get('link_fraction', float('nan')):5.2f} "
                     f"x{m.get('speedup_vs_duckdb', 0):6.2f} vs duckdb "
                     f"{'ok' if not diffs else 'WRONG ' + '; '.join(diffs)}")
        finally:
            source.close()
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
        (out_dir / "database_gpu.json").write_text(json.dumps(report, indent=1, default=str))
    report["timings_s"]["total"] = time.monotonic() - t_start
    (out_dir / "database_gpu.json").write_text(json.dumps(report, indent=1, default=str))
    print_table(report)
    return 0 if all(not r["differences"] for r in report["results"]) else 1


def print_table(report: dict) -> None:
    _log("\n| query | placement | encoding | ms | GB read | GB/s | link | floor ms | DuckDB ms "
         "| x DuckDB | correct | GH200 pred. ms | kernels |")
    _log("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---|")
    for r in sorted(report["results"], key=lambda r: (r["query"], r["placement"], r["encoding"])):
        def f(k: str, fmt: str) -> str:
            return format(r[k], fmt) if k in r else ""
        _log(f"| {r['query']} | {r['placement']} | {r['encoding']} | {f('time_ms', '.2f')} | "
             f"{r['bytes_read'] / 1e9:.3f} | {f('gbps', '.1f')} | {f('link_fraction', '.2f')} | "
             f"{f('floor_ms', '.2f')} | {f('duckdb_ms', '.1f')} | {f('speedup_vs_duckdb', '.2f')}"
             f" | {'yes' if r['correct'] else 'NO'} | {f('gh200_predicted_ms', '.2f')} | "
             f"{'fused' if r.get('fused') else 'torch'} |")
    for e in report["errors"]:
        _log(f"error: {e}")
    _log(f"link {report['link_gbps']} GB/s; timings {report['timings_s']}")


if __name__ == "__main__":
    sys.exit(main())
