"""``hopperlab references update RESULTS_DIR``: references written from repeated runs, not by
hand. Each run's samples (``samples.jsonl``) give a metric's median, its relative spread (robust:
1.4826 MAD over the median), the count and the minimum effect worth reporting; a figure the
host's CPU drives is written for this host's CPU beside the other CPUs' (``host_cpu``).

Which metrics: those the machine's file already references for the run (its selection is kept),
else the run's headline metrics that have a direction. Runs of the file that the results folder
does not hold are kept as they were.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any, Mapping

from hopperlab.core.effects import DEFAULT_MIN_EFFECT
from hopperlab.core.errors import SpecError
from hopperlab.core.rundir import read_samples, write_text_atomic
from hopperlab.core.schema import load_yaml
from hopperlab.core.stats import percentile, robust_spread
from hopperlab.node.hardware import host_cpu
from hopperlab.results.machines import references as refs_mod
from hopperlab.results.rows import RunRow, collect_runs

#: samples a reference needs: fewer give a spread that is mostly luck
MIN_SAMPLES = 3


@dataclass
class UpdateReport:
    written: dict[str, Path]          # machine -> file
    updated: list[str]                # "machine run metric"
    skipped: list[str]                # why a run gave no reference


def _metrics_for(row: RunRow, existing: Mapping[str, Any]) -> list[str]:
    named = existing.get(row.key)
    if isinstance(named, Mapping) and named:
        return [str(m) for m in named]
    return [m for m in row.headline_metrics
            if refs_mod.direction(row.family, m) is not None and not m.endswith("_n")]


def _entry(row: RunRow, metric: str, values: list[float], min_effect: float, results: Path,
           today: str) -> dict[str, Any]:
    cpu = host_cpu(row.hardware) if refs_mod.cpu_driven(row.family, metric) else None
    spread = robust_spread(values, f"{row.key} {metric}")
    where = f"{results.name}/{row.key}"
    entry: dict[str, Any] = {
        "value": percentile(values, 50), "spread": spread, "n": len(values),
        "min_effect": min_effect,
        "source": f"median of {len(values)} repeats ({row.tags.get('repeat_unit', 'reruns')}),"
                  f" measured {today} on {row.hardware.get('gpu_model') or 'no GPU'}, host "
                  f"{host_cpu(row.hardware)} ({where}); written by `hopperlab references "
                  f"update`"}
    if cpu:
        entry["host_cpu"] = cpu
    return entry


def _merge(old: Any, new: dict[str, Any]) -> list[dict[str, Any]]:
    """The metric's references with ``new`` in place of the one of its host CPU."""
    items = old if isinstance(old, list) else [old] if isinstance(old, Mapping) else []
    kept = [dict(i) for i in items if isinstance(i, Mapping)
            and i.get("host_cpu") != new.get("host_cpu")
            and not (new.get("host_cpu") and i.get("host_cpu") is None and "spread" not in i)]
    return kept + [new]


def update(results: Path, refs_dir: Path, machine: str | None = None,
           min_effect: float | None = None, today: str | None = None) -> UpdateReport:
    """Write (or update) ``refs_dir/<machine>.yaml`` from the ok runs under ``results``."""
    today = today or date.today().isoformat()
    rows = [r for r in collect_runs(results) if r.status == "ok"]
    if not rows:
        raise SpecError(f"{results}: no run ended ok: nothing to take references from")
    report = UpdateReport({}, [], [])
    by_machine: dict[str, list[RunRow]] = {}
    for r in rows:
        by_machine.setdefault(machine or r.machine or "unknown", []).append(r)
    for name, group in by_machine.items():
        path = refs_dir / f"{name}.yaml"
        data = load_yaml(path, "references") if path.is_file() else {}
        header = _header(path)
        body = dict(data.get("references") or {})
        changed = False
        for row in group:
            samples = read_samples(row.run_dir)
            for metric in _metrics_for(row, body):
                values = [float(s[metric]) for s in samples
                          if metric in s and math.isfinite(float(s[metric]))] or (
                    [row.metrics[metric]] if metric in row.metrics and not samples else [])
                if len(values) < MIN_SAMPLES:
                    report.skipped.append(
                        f"{row.key} {metric}: {len(values)} sample(s); a reference needs "
                        f"{MIN_SAMPLES} or more: run it with repeats (--config repeats=N)")
                    continue
                old_runs = body.setdefault(row.key, {})
                old = old_runs.get(metric)
                effect = min_effect if min_effect is not None else _old_effect(old)
                new = _entry(row, metric, values, effect, results, today)
                merged = _merge(old, new)
                old_runs[metric] = merged[0] if len(merged) == 1 else merged
                report.updated.append(f"{name} {row.key} {metric}")
                changed = True
        if not changed:
            continue
        refs_dir.mkdir(parents=True, exist_ok=True)
        text = header + f"# Updated {today} by `hopperlab references update {results}`.\n"
        text += _dump(name, body)
        write_text_atomic(path, text)
        refs_mod.load_references(path)  # what it wrote must load (strict)
        report.written[name] = path
    return report


def _old_effect(old: Any) -> float:
    items = old if isinstance(old, list) else [old] if isinstance(old, Mapping) else []
    for i in items:
        if isinstance(i, Mapping) and i.get("min_effect") is not None:
            return float(i["min_effect"])
    return DEFAULT_MIN_EFFECT


def _header(path: Path) -> str:
    """The file's leading comment lines (kept: they say where the figures come from)."""
    if not path.is_file():
        return ("# References written from repeated runs by `hopperlab references update` "
                "(docs/benchmarks/noise.md):\n# value (median), spread (relative, of one sample),"
                " n (samples), min_effect (the smallest change\n# worth reporting), host_cpu "
                "(figures the host's CPU drives).\n")
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        if not line.startswith("# Updated "):
            lines.append(line)
    return "\n".join(lines) + "\n" if lines else ""


def _flow(entry: Mapping[str, Any]) -> str:
    parts = []
    for k, v in entry.items():
        if isinstance(v, str):
            parts.append(f"{k}: {json.dumps(v)}")
        elif isinstance(v, float):
            parts.append(f"{k}: {v:.6g}")
        else:
            parts.append(f"{k}: {v}")
    return "{" + ", ".join(parts) + "}"


def _dump(machine: str, body: Mapping[str, Any]) -> str:
    out = [f"machine: {machine}", "references:"]
    for run in sorted(body):
        out.append(f"  {run}:")
        for metric, ref in body[run].items():
            if isinstance(ref, list):
                out.append(f"    {metric}:")
                out.extend(f"      - {_flow(r)}" for r in ref)
            else:
                out.append(f"    {metric}: {_flow(ref)}")
    return "\n".join(out) + "\n"
