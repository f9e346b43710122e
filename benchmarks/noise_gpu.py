"""Does ``hopperlab check`` cry wolf, and does it catch a real 10 % slowdown? (issue 29)

One process per run of the check subset measures REF + HEALTHY + LOADED samples (``repeats``
as the family defines them: windows after one warm-up, or reruns), through the platform's own
runner. A second process (benchmarks/gpu_loader.py) loads the same GPU during the last LOADED
samples only: it is switched on when ``samples.jsonl`` reaches REF + HEALTHY lines. Then:

* the first REF samples of each run become its references (``hopperlab references update``
  over a copy of the machine's shipped file, so that the metrics a shipped check judges are
  the ones judged here);
* each of the next HEALTHY samples is one check of a healthy node: every run's sample i,
  judged against those references by the check's own code (a check fails on a regression);
* each of the last LOADED samples is one check of the loaded node.

It prints and writes ``OUT/noise.json``: per check the verdict, the false alarms (healthy checks
that fail) and the detections (loaded checks that fail), and per run and metric the slowdown
the loader really caused (loaded median over healthy median). From the repository root:

    python3 benchmarks/noise_gpu.py OUT [--runs KEY[:param=value;...],...] [--deadline-s 450]

docs/benchmarks/noise.md has the command the lead runs and what it measured.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from hopperlab.assets.registry import load_assets  # noqa: E402
from hopperlab.assets.store import materialize  # noqa: E402
from hopperlab.config.matrix import load_matrix  # noqa: E402
from hopperlab.core.rundir import (  # noqa: E402
    SAMPLES_FILE,
    new_run_uid,
    read_json,
    read_samples,
    write_json_atomic,
)
from hopperlab.core.stats import percentile  # noqa: E402
from hopperlab.results.machines import reference_update, references  # noqa: E402
from hopperlab.results.rows import collect_runs  # noqa: E402

#: the check subset of issue 29, cheapest windows first where the figure is the same: (run,
#: parameter overrides that shorten one sample without changing what the metric means)
SUBSET = ("recommender/latency/gpu:queries=300,"
          "membench/copy/h2d-pinned:sizes_mb=[256,1024];repeats=10,"
          "finetune/lora-llama2-7b/baseline:measured_steps=2,"
          "recommender/latency/cpu-only:queries=100,"
          "membench/copy/d2h-pinned:sizes_mb=[256,1024];repeats=10,"
          "finetune/lora-llama2-7b/fp8:measured_steps=2")


def _top_level(text: str, sep: str) -> list[str]:
    """``text`` split at ``sep`` outside brackets (a list value keeps its commas)."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += (ch == "[") - (ch == "]")
        if ch == sep and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    return [p.strip() for p in [*parts, cur] if p.strip()]


def parse_runs(text: str) -> list[tuple[str, dict[str, Any]]]:
    """``KEY[:param=JSON;...],...`` -> [(key, {param: value})]."""
    out = []
    for item in _top_level(text, ","):
        key, _, rest = item.partition(":")
        over = {}
        for pair in filter(None, rest.split(";")):
            name, _, value = pair.partition("=")
            over[name] = json.loads(value)
        out.append((key, over))
    return out


def prepare(key: str, over: dict[str, Any], args: argparse.Namespace, results: Path) -> Path:
    """Write the run's spec.json (the matrix's spec, ``over`` its params, ``repeats`` all the
    samples) and build its assets; return the spec file."""
    config = {"site": args.site, "scale": args.scale, "only": key, "profiler": "none",
              "families": key.split("/")[0],
              "results_dir": str(results), "repeats": str(args.ref + args.healthy + args.loaded)}
    if args.substitutes:
        config["asset_substitutes"] = args.substitutes
    matrix = load_matrix(ROOT, config)
    spec = matrix.get(key)
    if over:
        spec = dataclasses.replace(spec, params=dataclasses.replace(spec.params, **{
            k: tuple(v) if isinstance(v, list) else v for k, v in over.items()}))
    specs = load_assets(ROOT, matrix.config.get("asset_substitutes"))
    for name in sorted(set(spec.assets.values())):
        materialize(name, ROOT, matrix.site.assets_dir, specs=specs)
    data = spec.to_dict()
    data.update(attempt=1, run_uid=new_run_uid(), git_commit=None)
    run_dir = ROOT / spec.run_dir if not Path(spec.run_dir).is_absolute() else Path(spec.run_dir)
    if run_dir.exists():
        shutil.rmtree(run_dir)
    write_json_atomic(run_dir / "spec.json", data)
    return run_dir / "spec.json"


def measure(spec_file: Path, switch_at: int, flag: Path, limit_s: float) -> dict[str, Any]:
    """Run the spec through the runner; switch the loader on at ``switch_at`` samples."""
    flag.unlink(missing_ok=True)
    code = ("import sys; from hopperlab.run.runner import execute; "
            "sys.exit(0 if execute(sys.argv[1])['status'] == 'ok' else 3)")
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", code, str(spec_file)], cwd=ROOT)
    samples = spec_file.parent / SAMPLES_FILE
    switched = None
    while proc.poll() is None:
        if switched is None and samples.exists() and \
                sum(1 for _ in samples.open()) >= switch_at:
            flag.touch()
            switched = time.monotonic() - t0
        if time.monotonic() - t0 > limit_s:
            proc.kill()
            break
        time.sleep(0.005)
    flag.unlink(missing_ok=True)
    return {"exit": proc.wait(), "seconds": round(time.monotonic() - t0, 1),
            "loader_on_at_s": switched}


def _view(run_dir: Path, dest: Path, samples: list[dict[str, float]]) -> None:
    """A copy of the run's small files whose samples (and metrics) are ``samples`` only."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("spec.json", "hardware.json"):
        if (run_dir / name).exists():
            shutil.copy(run_dir / name, dest / name)
    record = read_json(run_dir / "record.json")
    names = {m for s in samples for m in s}
    record["metrics"] = {m: percentile([s[m] for s in samples if m in s], 50) for m in names}
    write_json_atomic(dest / "record.json", record)
    write_json_atomic(dest / "metrics.json", record)
    if len(samples) > 1:
        (dest / SAMPLES_FILE).write_text("".join(
            json.dumps({"repeat": i, "metrics": s}) + "\n" for i, s in enumerate(samples)))


def judge(results: Path, out: Path, ref: int, healthy: int, loaded: int) -> dict[str, Any]:
    """References from the first ``ref`` samples; one check per later sample; the rates."""
    runs = {r.key: r for r in collect_runs(results) if r.status == "ok"}
    views = out / "views"
    shutil.rmtree(views, ignore_errors=True)
    complete = {}
    for key, row in runs.items():
        samples = read_samples(row.run_dir)
        if len(samples) < ref + healthy + loaded:
            print(f"[noise] {key}: {len(samples)} samples, wanted {ref + healthy + loaded}: "
                  f"left out")
            continue
        complete[key] = samples
        _view(row.run_dir, views / "ref" / key, samples[:ref])
        for i in range(healthy + loaded):
            _view(row.run_dir, views / f"check-{i:02d}" / key, [samples[ref + i]])
    if not complete:
        raise SystemExit("[noise] no run measured all its samples")
    refs_dir = out / "references"
    shutil.rmtree(refs_dir, ignore_errors=True)
    refs_dir.mkdir(parents=True)
    for machine in {r.machine for r in collect_runs(views / "ref")}:
        shipped = ROOT / references.REFERENCES_DIR / f"{machine}.yaml"
        if shipped.is_file():  # the metrics the shipped check judges, per run (update keeps them)
            shutil.copy(shipped, refs_dir / shipped.name)
    reference_update.update(views / "ref", refs_dir)
    checks = []
    for i in range(healthy + loaded):
        rows = collect_runs(views / f"check-{i:02d}")
        judged = references.judge_rows(rows, refs_dir)
        bad = [f"{f.key} {f.metric}" for f in references.regressions(judged)]
        checks.append({"check": i, "loaded": i >= healthy, "fails": bool(bad),
                       "verdicts": {r.key: r.reference_check for r in rows}, "regressions": bad})
    slowdown = {}
    for key, samples in complete.items():
        h, lo = samples[ref:ref + healthy], samples[ref + healthy:]
        family = key.split("/")[0]
        for metric in runs[key].headline_metrics:
            if not all(metric in s for s in samples) or \
                    references.direction(family, metric) is None:
                continue
            hm, lm = percentile([s[metric] for s in h], 50), percentile([s[metric] for s in lo], 50)
            worse = lm / hm if references.direction(family, metric) == "lower" else hm / lm
            slowdown[f"{key} {metric}"] = round(worse - 1, 4) if hm and lm else None
    false_alarms = sum(c["fails"] for c in checks if not c["loaded"])
    detected = sum(c["fails"] for c in checks if c["loaded"])
    return {"runs": sorted(complete), "healthy_checks": healthy, "loaded_checks": loaded,
            "false_alarms": false_alarms, "detected": detected, "slowdown": slowdown,
            "checks": checks, "references": str(refs_dir)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--runs", default=SUBSET)
    ap.add_argument("--site", default="gpu-node")
    ap.add_argument("--scale", default="full")
    ap.add_argument("--substitutes", default="dolly-15k:dolly-synthetic,"
                                             "llama-2-tokenizer:tiny-tokenizer")
    ap.add_argument("--ref", type=int, default=10)
    ap.add_argument("--healthy", type=int, default=20)
    ap.add_argument("--loaded", type=int, default=20)
    ap.add_argument("--loader", default=f"{sys.executable} benchmarks/gpu_loader.py "
                                        f"{{flag}} --duty 0.1")
    ap.add_argument("--deadline-s", type=float, default=450.0,
                    help="start no run after this long; what ran is judged")
    args = ap.parse_args()
    out = args.out.resolve()
    results = out / "results"
    out.mkdir(parents=True, exist_ok=True)
    flag = out / "loader.on"
    loader = subprocess.Popen(shlex.split(args.loader.format(flag=flag)), cwd=ROOT)
    t0, log = time.monotonic(), {}
    try:
        for key, over in parse_runs(args.runs):
            left = args.deadline_s - (time.monotonic() - t0)
            if left < 30:
                log[key] = {"skipped": "deadline"}
                print(f"[noise] {key}: skipped (deadline)")
                continue
            try:
                spec_file = prepare(key, over, args, results)
                log[key] = {"params": over, **measure(spec_file, args.ref + args.healthy, flag,
                                                      left + 60)}
            except Exception as exc:  # noqa: BLE001 - one run's mistake must not lose the rest
                log[key] = {"params": over, "error": f"{type(exc).__name__}: {exc}"}
            print(f"[noise] {key}: {log[key]}", flush=True)
    finally:
        flag.unlink(missing_ok=True)
        loader.kill()
    summary = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "argv": sys.argv,
               "measure": log, **judge(results, out, args.ref, args.healthy, args.loaded)}
    write_json_atomic(out / "noise.json", summary)
    for c in summary["checks"]:
        print(f"[noise] check {c['check']:2d} {'loaded ' if c['loaded'] else 'healthy'} "
              f"{'FAIL' if c['fails'] else 'pass'} {' '.join(c['regressions'])}")
    for name, s in summary["slowdown"].items():
        print(f"[noise] slowdown under load {name}: {s:+.1%}" if s is not None else name)
    print(f"[noise] healthy checks failing: {summary['false_alarms']} of {args.healthy}; "
          f"loaded checks failing (detected): {summary['detected']} of {args.loaded}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
