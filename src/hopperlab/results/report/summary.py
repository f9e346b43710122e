"""``summary.csv``: one row per run, its identity, status, hardware, metrics and ratios."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any, Sequence

from hopperlab.core import energy_names as N
from hopperlab.core import rundir as rec
from hopperlab.core.stats import half_width
from hopperlab.results import correctness
from hopperlab.results.rows import (
    RunRow,
    group_by_experiment,
    metric_names,
    ratio_to,
    reference_name,
    reference_run,
)

SUMMARY_FILE = "summary.csv"


SUMMARY_COLUMNS: tuple[str, ...] = (
    "family", "experiment", "variant", "attempt", "status", "reason", "scale",
    "hostname", "gpu_model", "cpu_arch", "host_link", "duration_s", "setup_s", "compared_to", "machine", "reference_check",
    # issue 47: same | within bound | DIFFERENT | not compared, against compared_to; a
    # DIFFERENT run's ratios are left empty (its figures are not the same computation's)
    "correctness", "correctness_deviation", "correctness_detail",
)


RATIO_SUFFIX = "_vs_baseline"
#: a repeated run's 95 % interval of the median, as ``value ± half-width`` (``repeats``)
HALF_WIDTH_SUFFIX = "_pm"
#: how each run's energy was measured, or why not ("not measured: ..."): columns present when
#: any run carries energy (``energy.*`` tags of the record)
ENERGY_COLUMNS: tuple[tuple[str, str], ...] = (("energy_gpu", N.TAG_GPU),
                                               ("energy_host", N.TAG_HOST),
                                               ("energy_window", N.TAG_WINDOW))


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _correctness(run: RunRow) -> tuple[Any, Any, Any]:
    v = run.correctness
    return (None, None, None) if v is None else (v.state, v.deviation, v.detail)


def summary_rows(runs: Sequence[RunRow]) -> tuple[list[str], list[list[str]]]:
    """The header and rows of ``summary.csv`` (cells as strings, empty for missing)."""
    metrics = metric_names(runs)
    energy = [c for c in ENERGY_COLUMNS] if any(N.TAG_WINDOW in r.tags for r in runs) else []
    pm = [m for m in metrics if any(half_width(r.metrics, m) is not None for r in runs)]
    header = [*SUMMARY_COLUMNS, *(c for c, _ in energy), *metrics,
              *(m + RATIO_SUFFIX for m in metrics), *(m + HALF_WIDTH_SUFFIX for m in pm)]
    rows = []
    for group in group_by_experiment(runs).values():
        for r in group:
            base = reference_run(r, group)
            fixed = [r.family, r.experiment, r.variant, r.attempt, r.status, r.reason, r.scale,
                     r.hostname, r.gpu_model, r.cpu_arch, r.host_link, r.duration_s, r.setup_s,
                     reference_name(r, group), r.machine, r.reference_check,
                     *_correctness(r),
                     *(r.tags.get(tag, "not measured") for _, tag in energy)]
            values = [r.metrics.get(m) for m in metrics]
            ratios = [ratio_to(r.metrics.get(m), base, m) if correctness.offered(r) else None
                      for m in metrics]
            halves = [half_width(r.metrics, m) for m in pm]
            rows.append([_cell(v) for v in (*fixed, *values, *ratios, *halves)])
    return header, rows


def write_summary(runs: Sequence[RunRow], path: Path) -> Path:
    """Write ``summary.csv`` (atomically): one row per run, metrics and ``<metric>_vs_baseline``
    (against the variant in ``compared_to``: the baseline unless the variant names another)."""
    header, rows = summary_rows(runs)
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    rec.write_text_atomic(Path(path), buf.getvalue())
    return Path(path)
