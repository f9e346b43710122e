"""Run every membench copy and alloc variant in this process, without Snakemake or submitit,
and print a table.

    python3 benchmarks/membench_sweep.py --out /tmp/membench [--scale full]

Each variant gets its own run directory (``<out>/<experiment>-<variant>/``, the usual
``steps.jsonl``, ``metrics.json`` and ``artifacts/``) written by a real Recorder, with the
node's ``hardware.fingerprint()``. The variants, their knobs and their params (sizes, repeats,
warmup, sample size) are those of ``experiments/membench.yaml`` at the scale, read through the
matrix (the scale is decided there, once); flags override them. This is what
``benchmarks/membench_gpu.sh`` runs on a GPU node. It was ``hopperlab.workloads.membench.sweep``:
a command line belongs to cli/ or benchmarks/, not to a family.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from hopperlab.config.matrix import load_matrix  # noqa: E402
from hopperlab.core.rundir import Recorder, SkipRun  # noqa: E402
from hopperlab.node import hardware  # noqa: E402
from hopperlab.workloads.base import RunView, fake_run  # noqa: E402
from hopperlab.workloads.membench import MembenchParams  # noqa: E402
from hopperlab.workloads.membench.workload import run  # noqa: E402

SCALES = ("smoke", "full")
#: the experiments of membench.yaml the sweep runs (collective needs several tasks)
EXPERIMENTS = ("copy", "alloc")
#: (experiment, variant, params over the experiment's, knobs): beyond the matrix, the
#: managed-memory copy path and the torch profiler
EXTRAS: list[tuple[str, str, dict[str, Any], dict[str, str]]] = [
    ("copy", "h2d-pinned-managed", {"direction": "h2d", "host_memory": "pinned"},
     {"memory": "managed"}),
    ("copy", "bidir-pinned-torchprof",
     {"direction": "bidir", "host_memory": "pinned", "sizes_mb": (1, 64), "repeats": 2,
      "warmup": 1}, {"profiler": "torch"}),
]


def variants(scale: str, root: Path = ROOT) -> list[tuple[str, str, MembenchParams, dict[str, str]]]:
    """(experiment, variant, params, knobs) of membench.yaml's copy and alloc runs at ``scale``
    (knobs other than their defaults), then the extras."""
    matrix = load_matrix(root, {"families": ["membench"], "scale": scale,
                                "only": [f"membench/{e}" for e in EXPERIMENTS]})
    out, base = [], {}
    for spec in matrix.runs.values():
        knobs = {f.name: getattr(spec.knobs, f.name) for f in dataclasses.fields(spec.knobs)
                 if getattr(spec.knobs, f.name) != f.default}
        out.append((spec.experiment, spec.variant, spec.params, knobs))
        base.setdefault(spec.experiment, spec.params)
    for exp, var, changes, knobs in EXTRAS:
        out.append((exp, var, dataclasses.replace(base[exp], **changes), knobs))
    return out


def make_spec(params: MembenchParams, scale: str, knobs: dict[str, str], gpus: int,
              allow_oversubscription: bool = False) -> RunView:
    """The run one variant of the sweep is (no project, no matrix: ``fake_run``)."""
    return fake_run(params, scale=scale, gpus=gpus, allow_oversubscription=allow_oversubscription,
                    family="membench", **knobs)


def run_one(out: Path, experiment: str, variant: str, params: MembenchParams, scale: str,
            knobs: dict[str, str], gpus: int, fingerprint: dict[str, Any]) -> dict[str, Any]:
    run_dir = out / f"{experiment}-{variant}"
    rec = Recorder(run_dir, identity={"key": f"membench/{experiment}/{variant}",
                                      "family": "membench", "experiment": experiment,
                                      "variant": variant})
    rec.hardware = fingerprint
    try:
        run(make_spec(params, scale, knobs, gpus), rec)
    except SkipRun as exc:
        return rec.finish("skipped", str(exc))
    except BaseException as exc:  # noqa: BLE001 - report and go on with the next variant
        (run_dir / "traceback.txt").write_text(traceback.format_exc())
        traceback.print_exc()
        return rec.finish("failed", f"{type(exc).__name__}: {exc}"[:2000])
    return rec.finish("ok")


def _steps(run_dir: Path) -> list[dict[str, float]]:
    path = run_dir / "steps.jsonl"
    if not path.exists():
        return []
    return [json.loads(line)["metrics"] for line in path.read_text().splitlines() if line.strip()]


def _f(v: Any, digits: int = 1) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    return f"{v:.{digits}f}"


COPY_HEAD = f"{'variant':<28}{'MiB':>6}{'GB/s':>9}{'min':>8}{'max':>8}{'h2d':>8}{'d2h':>8}"


def table(out: Path, results: list[tuple[str, str, dict[str, Any]]], heads: bool = True) -> str:
    """The short table: one line per variant and size."""
    lines = []
    copy_head = COPY_HEAD
    if heads:
        lines.append("== copy (GB/s = 1e9 B/s; median of repeats; bidir counts both directions)")
        lines.append(copy_head)
    for exp, var, rec in results:
        if exp != "copy":
            continue
        if rec["status"] != "ok":
            lines.append(f"{exp + '/' + var:<28}  {rec['status']}: {rec['reason']}")
            continue
        for s in _steps(out / f"{exp}-{var}"):
            lines.append(f"{exp + '/' + var:<28}{int(s['size_mb']):>6}{_f(s.get('gbps')):>9}"
                         f"{_f(s.get('gbps_min')):>8}{_f(s.get('gbps_max')):>8}"
                         f"{_f(s.get('h2d_gbps')):>8}{_f(s.get('d2h_gbps')):>8}")
    if heads:
        lines.append("")
        lines.append("== alloc (alloc/free: ms per allocation; others GB/s; median of repeats)")
    for exp, var, rec in results:
        if exp != "alloc":
            continue
        if rec["status"] != "ok":
            lines.append(f"{exp + '/' + var:<28}  {rec['status']}: {rec['reason']}")
            continue
        steps = _steps(out / f"{exp}-{var}")
        if var == "managed":
            cols = ["alloc_ms", "free_ms", "gpu_first_touch_gbps", "cpu_first_touch_gbps",
                    "migrate_h2d_gbps", "migrate_d2h_gbps", "prefetch_h2d_gbps",
                    "prefetch_d2h_gbps", "resident_read_gbps"]
            short = ["alloc", "free", "gpu1st", "cpu1st", "migH2D", "migD2H", "pfH2D", "pfD2H",
                     "resRd"]
        else:
            cols = ["alloc_ms", "free_ms", "first_touch_gbps", "write_gbps"]
            short = ["alloc", "free", "1st", "write"]
        lines.append(f"{exp + '/' + var:<28}{'MiB':>6}" + "".join(f"{c:>9}" for c in short))
        for s in steps:
            lines.append(f"{'':<28}{int(s['size_mb']):>6}" + "".join(
                f"{_f(s.get(c), 3 if c.endswith('_ms') else 1):>9}" for c in cols))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, type=Path, help="folder for the run directories")
    ap.add_argument("--scale", default="full", choices=SCALES)
    ap.add_argument("--gpus", type=int, default=1, help="resources.gpus of every variant")
    ap.add_argument("--only", default="", help="comma-separated experiment-variant names")
    ap.add_argument("--no-extras", action="store_true", help="only the matrix of membench.yaml")
    ap.add_argument("--copy-sizes", default=None, help="MiB, comma-separated")
    ap.add_argument("--alloc-sizes", default=None, help="MiB, comma-separated")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--budget-s", type=float, default=None,
                    help="start no further variant once this many seconds have passed")
    args = ap.parse_args(argv)
    started = time.monotonic()

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    try:  # CUDA initialised first, so that the fingerprint is the job's own view of its GPUs
        import torch  # noqa: PLC0415

        if torch.cuda.is_available():
            torch.cuda.init()
    except ImportError:
        pass
    fp = hardware.fingerprint()
    (out / "fingerprint.json").write_text(json.dumps(fp, indent=2) + "\n")
    print("fingerprint:", json.dumps(fp), flush=True)
    print(hardware.summary_line(fp), flush=True)

    only = {s for s in args.only.split(",") if s}
    extras = {(e, v) for e, v, _, _ in EXTRAS}
    results = []
    for exp, var, params, knobs in variants(args.scale):
        if (only and f"{exp}-{var}" not in only) or (args.no_extras and (exp, var) in extras):
            continue
        override = args.copy_sizes if exp == "copy" else args.alloc_sizes
        changes: dict[str, Any] = {}
        if override:
            changes["sizes_mb"] = tuple(int(s) for s in override.split(","))
        if args.repeats:
            changes["repeats"] = args.repeats
        if args.warmup is not None:
            changes["warmup"] = args.warmup
        params = dataclasses.replace(params, **changes)
        if args.budget_s is not None and time.monotonic() - started > args.budget_s:
            print(f"[budget] {exp}/{var}: not run (past --budget-s {args.budget_s:g})", flush=True)
            continue
        t0 = time.monotonic()
        rec = run_one(out, exp, var, params, args.scale, knobs, args.gpus, fp)
        print(f"[{time.monotonic() - t0:6.1f}s] {exp}/{var}: {rec['status']}"
              + (f" ({rec['reason']})" if rec["reason"] else "")
              + (f" gbps_at_largest={rec['metrics'].get('gbps_at_largest', float('nan')):.2f}"
                 if rec["status"] == "ok" else ""), flush=True)
        results.append((exp, var, rec))
        print(table(out, [(exp, var, rec)], heads=False), flush=True)  # in the log at once
    text = table(out, results)
    (out / "table.txt").write_text(text + "\n")
    print()
    print(text, flush=True)
    return 1 if any(r["status"] == "failed" for _, _, r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
