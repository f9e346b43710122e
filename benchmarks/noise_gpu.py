"""Does ``hopperlab check`` cry wolf, and does it catch a real, measured 10 % slowdown? (#29, #36)

One process per run of the check subset measures many windows (``repeats``, the family's unit)
through the platform's own runner. A co-runner (benchmarks/gpu_loader.py) shares the same GPU in
interleaved phases: off for OFF_WINDOWS windows, on for ON_WINDOWS, again and again, from the
run's first measured window on. Each window is classified by its time span (from steps.jsonl)
against the phases: wholly in an off phase = healthy, wholly in an on phase = loaded, else left
out. The first CALIBRATION (or CALIBRATION_MAX) on/off cycles tune the co-runner's duty from
the run's own step figures (on-phase over off-phase median) towards the TARGET slowdown; the
later cycles count. Then:

* HEALTHY healthy windows of each run, evenly spaced over the run, are the checks of a healthy
  node (check i = the i-th of every run, judged by the check's own code; it fails on a
  regression); every other healthy window (REF at least) becomes the run's reference
  (``hopperlab references update`` over a copy of the machine's shipped file). Spread over the
  run, the reference sees the slow regimes its checks will see: the GPU recommender's latency
  sat at 0.8 ms, then 1.2 ms for seconds, in healthy windows (2026-11-28), which ten windows of
  the first three seconds never showed;
* a run whose reference's minimum effect (any judged metric) is above TARGET is
  ``insensitive``: its noise hides a TARGET slowdown, so it is reported and judged (healthy
  checks) but its loaded windows are not counted as detections;
* each counted loaded window is one check of a slowed node, over the runs whose measured
  slowdown (loaded median over healthy median, every judged metric) is TARGET +- TOLERANCE; a
  run the co-runner cannot slow that much is reported as such and not counted.

It writes ``OUT/noise.json``: per check the verdict, the false alarms, the detections, per run
the co-runner's duty, its calibration and the slowdown it really caused. From the repository
root:

    python3 benchmarks/noise_gpu.py OUT [--runs KEY[:param=value;...],...] [--deadline-s 300]
    python3 benchmarks/noise_gpu.py OUT --rejudge NOISE_JSON   # judge OUT/results again, offline

docs/benchmarks/noise.md has the command the lead runs and what it measured.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from hopperlab.assets.registry import load_assets  # noqa: E402
from hopperlab.assets.store import materialize  # noqa: E402
from hopperlab.config.matrix import load_matrix  # noqa: E402
from hopperlab.core.rundir import (  # noqa: E402
    SAMPLES_FILE,
    STEPS_FILE,
    new_run_uid,
    read_json,
    read_samples,
    write_json_atomic,
)
from hopperlab.core.stats import percentile  # noqa: E402
from hopperlab.node.hardware import host_cpu  # noqa: E402
from hopperlab.results.machines import reference_update, references  # noqa: E402
from hopperlab.results.rows import collect_runs  # noqa: E402

#: the check subset on the GPU, most telling first (a run past the deadline is not started):
#: (run, parameter overrides that shorten one window without changing what the metric means).
#: recommender/latency/cpu-only and finetune/lora-llama2-7b/baseline are left out of the
#: one-call measurement for time (the CPU-only latency has no GPU to share; the resampling
#: study judges both): add them with --runs.
SUBSET = ("finetune/lora-llama2-7b/fp8:measured_steps=2,"
          "membench/copy/h2d-pinned:sizes_mb=[256,1024];repeats=10,"
          "recommender/latency/gpu:queries=300,"
          "membench/copy/d2h-pinned:sizes_mb=[256,1024];repeats=10")
#: what the co-runner shares with each run (default: the SMs)
MODES = {"membench/copy/h2d-pinned": "h2d", "membench/copy/d2h-pinned": "d2h",
         "membench/copy/bidir-pinned": "h2d"}
#: a step's own figure per family, for tuning the duty while the run runs: (step metric, which
#: way is better, the step metric that must be at its largest for the step to count)
STEP_FIGURES = {"finetune": ("step_time_s", "lower", None),
                "membench": ("gbps", "higher", "size_mb"),
                "recommender": ("e2e_ms", "lower", None),
                "inference": ("step_s", "lower", None),
                "database": ("time_ms", "lower", None)}
#: windows per off phase and per on phase (off is longer: a check wants more healthy windows)
OFF_WINDOWS, ON_WINDOWS = 6.0, 5.0
#: on/off cycles that tune the duty before loaded windows count: at least CALIBRATION, one
#: more (CALIBRATION_MAX) unless the last one's slowdown was within CONVERGED of the target
CALIBRATION, CALIBRATION_MAX, CONVERGED = 2, 3, 0.02
#: the slowdown the co-runner is tuned to, and how far off a counted run may be
TARGET, TOLERANCE = 0.10, 0.03
#: seconds after a phase switch before a window counts (the co-runner's period is 20 ms)
SETTLE_S = 0.05


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
              "results_dir": str(results), "repeats": str(args.windows)}
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



def windows(steps: Sequence[Mapping[str, Any]], per_window: int | None
            ) -> list[tuple[float, float]]:
    """Each sample's time span from the run's step lines: steps carrying ``repeat`` grouped by
    it; else the measured steps (``measured`` 1) in chunks of ``per_window``. A window starts
    when the step before its first one ended (a step's time is its end)."""
    if any("repeat" in s for s in steps):
        groups: dict[int, list[int]] = {}
        for i, s in enumerate(steps):
            if "repeat" in s:
                groups.setdefault(int(s["repeat"]), []).append(i)
        idx = [groups[r] for r in sorted(groups)]
    else:
        measured = [i for i, s in enumerate(steps)
                    if s.get("metrics", {}).get("measured", 1) == 1]
        n = max(1, per_window or 1)
        idx = [measured[k:k + n] for k in range(0, len(measured) - n + 1, n)]
    out = []
    for ids in idx:
        first, last = ids[0], ids[-1]
        start = steps[first - 1]["time"] if first > 0 else steps[first]["time"]
        out.append((float(start), float(steps[last]["time"])))
    return out


def classify(span: tuple[float, float], phases: Sequence[Mapping[str, Any]]) -> str | None:
    """``healthy`` (no on phase touches the window), ``loaded`` (wholly inside a counted on
    phase) or None (mixed, or in a calibration on phase)."""
    start, end = span
    ons = [p for p in phases if p["on"]]
    for p in ons:
        if p["counted"] and start >= p["t0"] + SETTLE_S and end <= p["t1"]:
            return "loaded"
    if any(start < p["t1"] + SETTLE_S and end > p["t0"] for p in ons):
        return None
    return "healthy"


def worse_ratio(loaded: Sequence[float], healthy: Sequence[float], way: str | None) -> float | None:
    """How much worse the loaded median is than the healthy one (0.10: 10 % slower)."""
    if not loaded or not healthy:
        return None
    lm, hm = percentile(list(loaded), 50), percentile(list(healthy), 50)
    if lm <= 0 or hm <= 0:
        return None
    return (lm / hm if way == "lower" else hm / lm) - 1


def step_figures(family: str, steps: Sequence[Mapping[str, Any]],
                 t0: float, t1: float) -> list[float]:
    """The family's step figure of the steps that ended inside [t0, t1]."""
    metric, _, largest = STEP_FIGURES.get(family, (None, None, None))
    if metric is None:
        return []
    rows = [s["metrics"] for s in steps if s.get("metrics", {}).get("measured", 1) == 1
            and metric in s.get("metrics", {})]
    if largest:
        top = max((r.get(largest, 0) for r in rows), default=0)
        rows = [r for r in rows if r.get(largest, 0) == top]
    times = [s["time"] for s in steps if s.get("metrics", {}).get("measured", 1) == 1
             and metric in s.get("metrics", {})
             and (not largest or s["metrics"].get(largest, 0) == top)]
    return [float(r[metric]) for r, t in zip(rows, times) if t0 <= t <= t1]


def next_duty(duty: float, measured: float | None,
              tried: Sequence[tuple[float, float | None]] = ()) -> float:
    """The duty that should give TARGET, from the slowdown ``duty`` gave (about proportional,
    at most 4x either way a cycle). Once the duties ``tried`` (with this one: (duty, slowdown)
    pairs) bracket TARGET, the next lies inside the closest bracket, interpolated: a run whose
    slowdown jumps with the duty (the GPU recommender, 2026-11-28: +4.4 % at 0.25, +30.9 % at
    0.569) is never sent back below a duty already known to be too weak."""
    if measured is None or not math.isfinite(measured):
        return duty
    points = [(d, m) for d, m in (*tried, (duty, measured))
              if m is not None and math.isfinite(m)]
    below = [p for p in points if p[1] < TARGET]
    above = [p for p in points if p[1] > TARGET]
    if below and above:
        lo, hi = max(below), min(above)
        if lo[0] < hi[0]:
            return lo[0] + (TARGET - lo[1]) * (hi[0] - lo[0]) / (hi[1] - lo[1])
    factor = TARGET / max(measured, 0.005)
    return min(1.0, max(0.01, duty * min(4.0, max(0.25, factor))))


class Controller:
    """The co-runner's phases for one run: waits for three windows (their length sets the
    phases'), then off/on cycles; the first CALIBRATION cycles tune the duty."""

    def __init__(self, family: str, flag: Path, per_window: int | None, duty: float):
        self.family, self.flag, self.per_window, self.duty = family, flag, per_window, duty
        self.phases: list[dict[str, Any]] = []
        self.calibration: list[dict[str, float | None]] = []
        self.window_s: float | None = None
        self._steps: list[dict[str, Any]] = []
        self._offset = 0

    def _read_steps(self, path: Path) -> None:
        if not path.exists():
            return
        with path.open() as fh:
            fh.seek(self._offset)
            chunk = fh.read()
        done = chunk[:chunk.rfind("\n") + 1]
        self._offset += len(done.encode())
        self._steps.extend(json.loads(line) for line in done.splitlines() if line.strip())

    def _switch(self, on: bool, now: float) -> None:
        if self.phases:
            self.phases[-1]["t1"] = now
        cycle = sum(1 for p in self.phases if p["on"]) if on else \
            sum(1 for p in self.phases if not p["on"])
        last = self.calibration[-1]["slowdown"] if self.calibration else None
        settled = last is not None and abs(last - TARGET) <= CONVERGED
        self.phases.append({"on": on, "t0": now, "t1": None, "duty": self.duty,
                            "counted": on and (cycle >= CALIBRATION_MAX
                                               or (cycle >= CALIBRATION and settled))})
        if on:
            self.flag.with_name(self.flag.name + ".duty").write_text(f"{self.duty:.4f}")
            self.flag.touch()
        else:
            self.flag.unlink(missing_ok=True)

    def tick(self, steps_file: Path, now: float) -> None:
        self._read_steps(steps_file)
        if self.window_s is None:
            spans = windows(self._steps, self.per_window)
            if len(spans) >= 3:
                self.window_s = percentile([b - a for a, b in spans], 50)
                self._switch(False, now)
            return
        cur = self.phases[-1]
        length = (ON_WINDOWS if cur["on"] else OFF_WINDOWS) * self.window_s
        if now - cur["t0"] < length:
            return
        if cur["on"] and not cur["counted"] and len(self.phases) >= 2:
            prev = self.phases[-2]
            _, way, _ = STEP_FIGURES.get(self.family, (None, None, None))
            est = worse_ratio(step_figures(self.family, self._steps, cur["t0"] + SETTLE_S, now),
                              step_figures(self.family, self._steps, prev["t0"] + SETTLE_S,
                                           prev["t1"]), way)
            tried = [(c["duty"], c["slowdown"]) for c in self.calibration]
            self.calibration.append({"duty": self.duty, "slowdown": est})
            self.duty = next_duty(self.duty, est, tried)
        self._switch(not cur["on"], now)

    def close(self, now: float) -> None:
        if self.phases and self.phases[-1]["t1"] is None:
            self.phases[-1]["t1"] = now
        self.flag.unlink(missing_ok=True)


def measure(spec_file: Path, family: str, mode: str, per_window: int | None, flag: Path,
            duty: float, limit_s: float) -> dict[str, Any]:
    """Run the spec through the runner while the controller interleaves the co-runner."""
    flag.unlink(missing_ok=True)
    flag.with_name(flag.name + ".mode").write_text(mode)
    code = ("import sys; from hopperlab.run.runner import execute; "
            "sys.exit(0 if execute(sys.argv[1])['status'] == 'ok' else 3)")
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", code, str(spec_file)], cwd=ROOT)
    ctl = Controller(family, flag, per_window, duty)
    try:
        while proc.poll() is None:
            ctl.tick(spec_file.parent / STEPS_FILE, time.time())
            if time.monotonic() - t0 > limit_s:
                proc.kill()
                break
            time.sleep(0.01)
    finally:
        ctl.close(time.time())
    return {"exit": proc.wait(), "seconds": round(time.monotonic() - t0, 1), "mode": mode,
            "window_s": ctl.window_s, "duty": ctl.duty, "calibration": ctl.calibration,
            "phases": ctl.phases}


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


def split(run_dir: Path, phases: Sequence[Mapping[str, Any]], per_window: int | None
          ) -> tuple[list[dict[str, float]], list[dict[str, float]]]:
    """The run's samples: (healthy ones, loaded ones), each in time order."""
    samples = read_samples(run_dir)
    steps = [json.loads(line) for line in (run_dir / STEPS_FILE).read_text().splitlines()
             if line.strip()] if (run_dir / STEPS_FILE).exists() else []
    spans = windows(steps, per_window)
    healthy, loaded = [], []
    for sample, span in zip(samples, spans):
        kind = classify(span, phases)
        if kind == "healthy":
            healthy.append(sample)
        elif kind == "loaded":
            loaded.append(sample)
    return healthy, loaded


def check_windows(n: int, count: int, ref: int) -> list[int]:
    """Which of ``n`` healthy windows are the checks: ``count`` (fewer when ``ref`` must stay
    for the reference) evenly spaced from the first to the last."""
    count = max(0, min(count, n - ref))
    if count <= 1:
        return [n - 1] if count == 1 else []
    return sorted({round(i * (n - 1) / (count - 1)) for i in range(count)})


def judge(results: Path, out: Path, log: Mapping[str, Mapping[str, Any]], ref: int,
          healthy: int, loaded: int) -> dict[str, Any]:
    """References from the first ``ref`` healthy windows; a check per later window; the rates."""
    runs = {r.key: r for r in collect_runs(results) if r.status == "ok"}
    views = out / "views"
    shutil.rmtree(views, ignore_errors=True)
    per_run: dict[str, dict[str, Any]] = {}
    for key, row in runs.items():
        entry = log.get(key, {})
        h, lo = split(row.run_dir, entry.get("phases", []), entry.get("per_window"))
        info: dict[str, Any] = {"healthy_windows": len(h), "loaded_windows": len(lo)}
        per_run[key] = info
        if len(h) < ref + 1:
            info["left_out"] = f"{len(h)} healthy windows; references need {ref} and a check"
            continue
        picked = check_windows(len(h), healthy, ref)
        _view(row.run_dir, views / "ref" / key, [s for i, s in enumerate(h) if i not in picked])
        checks_h, checks_l = [h[i] for i in picked], lo[:loaded]
        info["reference_windows"] = len(h) - len(picked)
        family = key.split("/")[0]
        slow: dict[str, float | None] = {}
        for metric in sorted({m for s in h for m in s}):
            if not references.judged(family, metric) or \
                    references.direction(family, metric) is None:
                continue
            slow[metric] = worse_ratio([s[metric] for s in checks_l if metric in s],
                                       [s[metric] for s in h if metric in s],
                                       references.direction(family, metric))
        info["slowdown"] = slow
        ok = bool(slow) and all(v is not None and abs(v - TARGET) <= TOLERANCE
                                for v in slow.values())
        info["counted"] = ok and len(checks_l) > 0
        if not info["counted"]:
            said = ", ".join(f"{m} {v:+.1%}" if v is not None else f"{m} ?"
                             for m, v in slow.items())
            info["not_counted"] = (f"the co-runner slowed it by {said}, not {TARGET:.0%} +- "
                                   f"{TOLERANCE:.0%}" if slow else "no loaded window")
        for i, s in enumerate(checks_h):
            _view(row.run_dir, views / f"healthy-{i:02d}" / key, [s])
        if info["counted"]:
            for i, s in enumerate(checks_l):
                _view(row.run_dir, views / f"loaded-{i:02d}" / key, [s])
    if not (views / "ref").is_dir():
        raise SystemExit("[noise] no run gave enough healthy windows")
    refs_dir = out / "references"
    shutil.rmtree(refs_dir, ignore_errors=True)
    refs_dir.mkdir(parents=True)
    for machine in {r.machine for r in collect_runs(views / "ref")}:
        shipped = ROOT / references.REFERENCES_DIR / f"{machine}.yaml"
        if shipped.is_file():  # the metrics the shipped check judges, per run (update keeps them)
            shutil.copy(shipped, refs_dir / shipped.name)
    reference_update.update(views / "ref", refs_dir)
    for key, info in per_run.items():  # a run its own noise makes blind to TARGET: not counted
        found, family = references.references_for(refs_dir, runs[key].machine), key.split("/")[0]
        cpu = host_cpu(runs[key].hardware or {})
        picked_refs = {m: references.pick(opts, cpu, references.cpu_driven(family, m))
                       for m, opts in (found.candidates(key) if found else {}).items()}
        effects_of = {m: r.effect_floor for m, r in picked_refs.items()
                      if r is not None and m in info.get("slowdown", {})}
        info["min_effect"] = effects_of
        blind = {m: e for m, e in effects_of.items() if e > TARGET}
        if blind and info.get("counted"):
            info["counted"] = False
            info["not_counted"] = "insensitive: its minimum effect " + ", ".join(
                f"{m} {e:.1%}" for m, e in blind.items()) + f" is above {TARGET:.0%}"
        elif blind:
            info["insensitive"] = True
            for folder in views.glob("loaded-*"):
                shutil.rmtree(folder / key, ignore_errors=True)
    checks = []
    for kind, count in (("healthy", healthy), ("loaded", loaded)):
        for i in range(count):
            folder = views / f"{kind}-{i:02d}"
            if not folder.is_dir():
                continue
            rows = collect_runs(folder)
            if not rows:
                continue
            judged = references.judge_rows(rows, refs_dir)
            bad = [f"{f.key} {f.metric}" for f in references.regressions(judged)]
            checks.append({"check": i, "loaded": kind == "loaded", "fails": bool(bad),
                           "runs": sorted(r.key for r in rows),
                           "verdicts": {r.key: r.reference_check for r in rows},
                           "regressions": bad})
            for r in rows:
                per_run[r.key].setdefault(f"{kind}_failing", 0)
                per_run[r.key][f"{kind}_failing"] += any(b.startswith(r.key + " ") for b in bad)
    hc = [c for c in checks if not c["loaded"]]
    lc = [c for c in checks if c["loaded"]]
    return {"runs": per_run, "healthy_checks": len(hc), "loaded_checks": len(lc),
            "false_alarms": sum(c["fails"] for c in hc), "detected": sum(c["fails"] for c in lc),
            "checks": checks, "references": str(refs_dir)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--runs", default=SUBSET)
    ap.add_argument("--site", default="gpu-node")
    ap.add_argument("--scale", default="full")
    ap.add_argument("--substitutes", default="dolly-15k:dolly-synthetic,"
                                             "llama-2-tokenizer:tiny-tokenizer")
    ap.add_argument("--ref", type=int, default=10,
                    help="the fewest healthy windows left for a reference (all but the checks)")
    ap.add_argument("--healthy", type=int, default=20)
    ap.add_argument("--loaded", type=int, default=20)
    ap.add_argument("--windows", type=int, default=100,
                    help="windows per run (repeats): enough for ref + healthy healthy windows "
                         "and loaded counted ones after the calibration")
    ap.add_argument("--duty", type=float, default=0.25, help="the co-runner's first duty")
    ap.add_argument("--loader", default=f"{sys.executable} benchmarks/gpu_loader.py {{flag}}")
    ap.add_argument("--deadline-s", type=float, default=300.0,
                    help="start no run after this long; what ran is judged")
    ap.add_argument("--rejudge", type=Path, default=None,
                    help="a noise.json: judge OUT/results again with its measure log (offline, "
                         "no GPU: the returned runs of a GPU call, unpacked into OUT)")
    args = ap.parse_args()
    out = args.out.resolve()
    results = out / "results"
    out.mkdir(parents=True, exist_ok=True)
    if args.rejudge:
        before = json.loads(args.rejudge.read_text())
        summary = {"when": before.get("when"), "rejudged": time.strftime(
            "%Y-%m-%d %H:%M UTC", time.gmtime()), "argv": sys.argv, "target": TARGET,
            "tolerance": TOLERANCE, "measure": before["measure"],
            **judge(results, out, before["measure"], args.ref, args.healthy, args.loaded)}
        return report(out, summary)
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
            per_window = over.get("measured_steps")
            try:
                spec_file = prepare(key, over, args, results)
                log[key] = {"params": over, "per_window": per_window,
                            **measure(spec_file, key.split("/")[0], MODES.get(key, "sm"),
                                      per_window, flag, args.duty, left + 60)}
            except Exception as exc:  # noqa: BLE001 - one run's mistake must not lose the rest
                log[key] = {"params": over, "error": f"{type(exc).__name__}: {exc}"}
            shown = {k: v for k, v in log[key].items() if k != "phases"}
            print(f"[noise] {key}: {shown}", flush=True)
    finally:
        flag.unlink(missing_ok=True)
        loader.kill()
    summary = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "argv": sys.argv,
               "target": TARGET, "tolerance": TOLERANCE, "measure": log,
               **judge(results, out, log, args.ref, args.healthy, args.loaded)}
    return report(out, summary)


def report(out: Path, summary: dict[str, Any]) -> int:
    """Write ``OUT/noise.json`` and print the ``[noise]`` lines."""
    write_json_atomic(out / "noise.json", summary)
    for c in summary["checks"]:
        print(f"[noise] check {c['check']:2d} {'loaded ' if c['loaded'] else 'healthy'} "
              f"{'FAIL' if c['fails'] else 'pass'} {' '.join(c['regressions'])}")
    for key, info in summary["runs"].items():
        slow = ", ".join(f"{m} {v:+.1%}" for m, v in info.get("slowdown", {}).items()
                         if v is not None)
        verdict = "counted" if info.get("counted") else \
            f"NOT counted: {info.get('not_counted') or info.get('left_out')}"
        effect = ", ".join(f"{m} {v:.1%}" for m, v in info.get("min_effect", {}).items())
        blind = " (insensitive)" if info.get("insensitive") else ""
        print(f"[noise] run {key}: {info['healthy_windows']} healthy / {info['loaded_windows']} "
              f"loaded windows; reference of {info.get('reference_windows', 0)}, min effect "
              f"{effect or '-'}{blind}; slowdown {slow or '-'}; {verdict}")
    print(f"[noise] healthy checks failing: {summary['false_alarms']} of "
          f"{summary['healthy_checks']}; loaded checks failing (detected): "
          f"{summary['detected']} of {summary['loaded_checks']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
