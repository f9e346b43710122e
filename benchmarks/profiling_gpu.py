"""Profile real hopperlab runs on a GPU node with nsys and print their ``prof_`` metrics.

What it runs (everything under OUT/results, one run directory each):

* membench ``copy`` variants through ``hopperlab.run.submit.submit`` with the **local executor**
  (submitit -> hopperlab's profile wrapper -> ``nsys profile`` -> the runner), exactly what a
  Snakemake rule runs, minus the MLflow upload (done afterwards from the run directories with
  ``hopperlab sync``);
* the tiny training loop of ``profiling_trainloop.py`` under the same wrapper and nsys command
  line (``hopperlab.profiling.command``): num_workers 0 vs 4, device vs managed memory, and the
  torch profiler for comparison;
* an export of a given ``.nsys-rep`` (``--rep``), e.g. the lent machine's matmul report.

Then it prints one table of the derived metrics and writes ``table.json``; with ``--fixtures`` it
copies each run's trimmed ``profile.sqlite`` there (test fixtures).

    python benchmarks/profiling_gpu.py OUT --nsys /path/to/nsys [--rep X.nsys-rep] [--fixtures DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from hopperlab.core.rundir import load_record
from hopperlab.profiling.command import (
    ProfilingSettings,
    nsys_profile_args,
    wrapper_args,
)
from hopperlab.profiling.finish import TRIMMED_SQLITE

ROOT = Path(__file__).resolve().parents[1]
SHOWN = ("prof_capture_s", "prof_gpu_busy_frac", "prof_top_kernel_share", "prof_memops_share",
         "prof_memcpy_h2d_share", "prof_memcpy_h2d_bytes", "prof_memcpy_d2h_share",
         "prof_um_share", "prof_um_bytes", "prof_um_gpu_faults", "prof_gpu_idle_gaps",
         "prof_gpu_idle_gap_s", "prof_nvtx_step_mean_ms", "prof_nvtx_data.wait_s")


def membench_runs(root: Path, nsys: str, site_file: Path) -> list[Path]:
    from hopperlab.config.spec import (
        ContainerSettings,
        Matrix,
        Resources,
        RunSpec,
        SiteSpec,
    )
    from hopperlab.run.submit import submit
    from hopperlab.workloads.base import Knobs
    from hopperlab.workloads.membench import MembenchParams

    site = SiteSpec(name="gpu", executor="local", poll_interval_s=0.2,
                    container=ContainerSettings(), tracking_uri="sqlite:///unused.db",
                    nsys_path=nsys, source=str(site_file), assets_dir=str(root / "assets"))
    variants = {
        "h2d-pinned": (Knobs(profiler="nsys"), dict(direction="h2d", host_memory="pinned")),
        "h2d-pinned-managed": (Knobs(profiler="nsys", memory="managed"),
                               dict(direction="h2d", host_memory="pinned")),
        "bidir-pinned": (Knobs(profiler="nsys"), dict(direction="bidir", host_memory="pinned")),
        "h2d-pinned-torch": (Knobs(profiler="torch"), dict(direction="h2d", host_memory="pinned")),
    }
    runs: dict[str, RunSpec] = {}
    for name, (knobs, params) in variants.items():
        spec = RunSpec(family="membench", experiment="copy-profiled", variant=name, scale="full",
                       knobs=knobs, params=MembenchParams(test="copy", sizes_mb=(16, 256),
                                                          repeats=5, warmup=1, **params),
                       resources=Resources(gpus=1, cpus=4, mem_gb=16, time_min=5), site=site,
                       run_dir=f"results/membench/copy-profiled/{name}", baseline="h2d-pinned",
                       headline_metrics=("gbps_peak",), source="benchmarks/profiling_gpu.py")
        runs[spec.key] = spec
    matrix = Matrix(runs=runs, config={"results_dir": "results"}, site=site, root=root)
    done = []
    for key in runs:
        t0 = time.time()
        try:
            rc = submit(matrix, key)
        except Exception as exc:  # noqa: BLE001 - report and go on with the next run
            rc = f"{type(exc).__name__}: {exc}"
        print(f"  {key}: {rc} in {time.time() - t0:.1f} s", flush=True)
        done.append(root / runs[key].run_dir)
    return done


def trainloop_runs(root: Path, nsys: str) -> list[Path]:
    variants = {"w0-device-nsys": (0, "device", "nsys"), "w4-device-nsys": (4, "device", "nsys"),
                "w0-managed-nsys": (0, "managed", "nsys"), "w0-device-torch": (0, "device", "torch")}
    done = []
    for name, (workers, memory, profiler) in variants.items():
        run_dir = (root / "results" / "trainloop" / "loop" / name).resolve()
        (run_dir / "artifacts" / "profile").mkdir(parents=True, exist_ok=True)
        # the managed run keeps its full export once, so its schema can be described
        settings = ProfilingSettings(keep_sqlite=memory == "managed")
        cmd = wrapper_args(sys.executable, run_dir, profiler, settings,
                           nsys if profiler == "nsys" else None)
        if profiler == "nsys":
            cmd += nsys_profile_args(nsys, run_dir / "artifacts" / "profile" / "report",
                                     memory=memory, settings=settings)
        cmd += [sys.executable, str(ROOT / "benchmarks" / "profiling_trainloop.py"), str(run_dir),
                "--num-workers", str(workers), "--memory", memory, "--profiler", profiler]
        t0 = time.time()
        out = subprocess.run(cmd, capture_output=True, text=True)
        (run_dir / "logs").mkdir(exist_ok=True)
        (run_dir / "logs" / "job.out").write_text(out.stdout)
        (run_dir / "logs" / "job.err").write_text(out.stderr)
        print(f"  trainloop/{name}: rc {out.returncode}, {time.time() - t0:.1f} s; "
              f"{out.stderr.strip().splitlines()[-1] if out.stderr.strip() else ''}", flush=True)
        full = run_dir / "artifacts" / "profile" / "report.sqlite"
        if full.is_file():
            describe_schema(full, root / f"trainloop-{name}.schema.txt")
            full.unlink()
        done.append(run_dir)
    return done


def export_rep(rep: Path, out: Path, nsys: str) -> Path:
    from hopperlab.profiling.finish import export_sqlite
    from hopperlab.profiling.nsys_sqlite import trim

    full = export_sqlite(nsys, rep, out / (rep.stem + ".full.sqlite"))
    describe_schema(full, out / (rep.stem + ".schema.txt"))
    small = trim(full, out / (rep.stem + ".sqlite"))
    full.unlink()
    return small


def describe_schema(db_path: Path, dest: Path) -> None:
    """Tables, columns and the small enum/analysis tables of a full export (for the docs)."""
    import sqlite3

    db = sqlite3.connect(db_path)
    lines = []
    for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY name"):
        (n,) = db.execute(f'SELECT COUNT(*) FROM "{name}"').fetchone()
        cols = [r[1] for r in db.execute(f'PRAGMA table_info("{name}")')]
        span = db.execute(f'SELECT MIN(start), MAX("end") FROM "{name}"').fetchone() \
            if {"start", "end"} <= set(cols) else None
        lines.append(f"{name} ({n} rows): {', '.join(cols)}" + (f"; span {span}" if span else ""))
        if name.startswith(("ENUM_CUDA_MEMCPY", "ENUM_NSYS_EVENT", "ANALYSIS", "TARGET_INFO_SESSION")):
            lines += [f"    {row}" for row in db.execute(f'SELECT * FROM "{name}" LIMIT 80')]
    dest.write_text("\n".join(lines) + "\n")
    db.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--nsys", required=True)
    ap.add_argument("--rep", type=Path, action="append", default=[])
    ap.add_argument("--fixtures", type=Path)
    ap.add_argument("--site", type=Path, default=ROOT / "configs" / "sites" / "local.yaml")
    args = ap.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    from hopperlab.profiling.finish import nsys_version

    print("nsys", nsys_version(args.nsys), flush=True)
    help_text = subprocess.run([args.nsys, "stats", "--help-reports"], capture_output=True,
                               text=True).stdout
    (out / "nsys-help-reports.txt").write_text(help_text)
    runs = membench_runs(out, args.nsys, args.site.resolve()) + trainloop_runs(out, args.nsys)
    rows = {}
    for run_dir in runs:
        rec = load_record(run_dir) or {}
        key = str(run_dir.relative_to(out / "results"))
        rows[key] = {"status": rec.get("status"), "reason": (rec.get("reason") or "")[:200],
                     **{k: v for k, v in (rec.get("metrics") or {}).items()
                        if k.startswith("prof_") or k in ("gbps_peak", "step_s")},
                     "top_kernel": (rec.get("tags") or {}).get("prof.top_kernel", ""),
                     "prof_error": (rec.get("tags") or {}).get("prof.error", "")}
        if args.fixtures and (run_dir / "artifacts/profile" / TRIMMED_SQLITE).is_file():
            args.fixtures.mkdir(parents=True, exist_ok=True)
            shutil.copy(run_dir / "artifacts/profile" / TRIMMED_SQLITE,
                        args.fixtures / (key.replace("/", "__") + ".sqlite"))
    for rep in args.rep:
        small = export_rep(rep, out, args.nsys)
        if args.fixtures:
            shutil.copy(small, args.fixtures / small.name)
    (out / "table.json").write_text(json.dumps(rows, indent=1, default=str))
    print(f"{'run':44s} {'status':7s} " + " ".join(f"{c[5:][:14]:>14s}" for c in SHOWN))
    for key, row in rows.items():
        cells = []
        for c in SHOWN:
            v = row.get(c)
            cells.append(f"{v:14.4g}" if isinstance(v, (int, float)) else f"{'-':>14s}")
        print(f"{key:44s} {str(row['status']):7s} " + " ".join(cells))
        if row["prof_error"] or row["reason"]:
            print(f"    {row['prof_error'] or row['reason']}")
        if row["top_kernel"]:
            print(f"    top kernel: {row['top_kernel'][:100]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
