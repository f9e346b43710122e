"""``summary.csv`` and ``report.html`` made from the run directories under a results folder.

The report reads the run directories themselves (docs/run-directory.md), never MLflow: it works
offline, on a half-finished matrix, and after MLflow is gone. Every run directory is
``{results}/{family}/{experiment}/{variant}/`` with a ``spec.json`` and a record
(``record.json``, which stays when Snakemake deletes a failed job's ``metrics.json``). Archived
attempts (``attempts/{n}/``) and folders without a record are not runs.

``report.html`` is one self-contained file: inline CSS, charts as inline base64 PNG (matplotlib,
Agg), no scripts and no external URLs, so it can be mailed, archived or opened on an air-gapped
login node.
"""

from __future__ import annotations

import base64
import csv
import html
import io
import logging
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from hopperlab.core import rundir as rec
from hopperlab.node.naming import machine_name
from hopperlab.results.machines.references import judge_rows

log = logging.getLogger(__name__)

SUMMARY_FILE = "summary.csv"
REPORT_FILE = "report.html"

#: Columns of ``summary.csv`` before the metric columns.
SUMMARY_COLUMNS: tuple[str, ...] = (
    "family", "experiment", "variant", "attempt", "status", "reason", "scale",
    "hostname", "gpu_model", "cpu_arch", "host_link", "duration_s", "compared_to", "machine", "reference_check",
)
RATIO_SUFFIX = "_vs_baseline"

#: How many common metrics to chart for an experiment that declares no headline metrics.
FALLBACK_METRICS = 3
#: More runs than this get a progress bar while the charts are drawn.
PROGRESS_MIN_RUNS = 50

_STATUS_COLOURS = {
    "ok": "#2e7d32", "oom": "#e65100", "failed": "#c62828", "timeout": "#6a1b9a",
    "skipped": "#616161",
}
_HARDWARE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("hostname", "host"), ("cpu_model", "CPU model"), ("cpu_arch", "arch"),
    ("cpu_cores", "cores"), ("mem_total_gb", "memory"), ("gpu_model", "GPU model"),
    ("gpu_count", "GPUs"), ("gpu_memory_gb", "GPU memory"), ("driver", "driver"),
    ("host_link", "host link"),
)
_DASH = "\u2014"


@dataclass
class RunRow:
    """One run directory, as the report sees it."""

    family: str
    experiment: str
    variant: str
    status: str
    reason: str | None
    attempt: int | None
    scale: str | None
    hostname: str | None
    cpu_model: str | None
    cpu_arch: str | None
    gpu_model: str | None
    host_link: str | None
    duration_s: float | None
    metrics: dict[str, float]
    run_dir: Path
    #: the experiment's baseline variant (from spec.json), None when not declared
    baseline: str | None = None
    #: the variant this run's ratios are taken against (spec.json ``compare_to``); None: baseline
    compare_to: str | None = None
    headline_metrics: tuple[str, ...] = ()
    knobs: dict[str, Any] = field(default_factory=dict)
    #: the record's full hardware dict (hardware.json when the record has none)
    hardware: dict[str, Any] = field(default_factory=dict)
    #: the machine the run ran on (the record's, else named from its fingerprint)
    machine: str | None = None
    #: the run's tags (the record's), e.g. cost.currency
    tags: dict[str, str] = field(default_factory=dict)
    #: pass | regression | improvement | no-reference (configs/references/<machine>.yaml)
    reference_check: str | None = None

    @property
    def key(self) -> str:
        return f"{self.family}/{self.experiment}/{self.variant}"

    @property
    def is_baseline(self) -> bool:
        return self.baseline is not None and self.variant == self.baseline


# ------------------------------------------------------------------------------------------
# collecting
# ------------------------------------------------------------------------------------------
def _str_or_none(value: Any) -> str | None:
    if value is None or value == "":
        return None
    return str(value)


def _float_or_none(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _clean_metrics(metrics: Any) -> dict[str, float]:
    if not isinstance(metrics, Mapping):
        return {}
    out = {}
    for name, value in metrics.items():
        number = _float_or_none(value)
        if number is not None and math.isfinite(number):
            out[str(name)] = number
    return out


def _read_json_or_none(path: Path) -> Any:
    try:
        return rec.read_json(path)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("cannot read %s: %s", path, exc)
        return None


def _run_row(run_dir: Path, results_dir: Path) -> RunRow | None:
    try:
        record = rec.load_record(run_dir)
    except (OSError, ValueError) as exc:
        # A record that exists but cannot be read is a result too: show it, do not drop it.
        record = {"status": "failed", "reason": f"unreadable record: {exc}"}
    if record is None:
        return None
    spec = _read_json_or_none(run_dir / rec.SPEC_FILE)
    if not isinstance(spec, Mapping):
        spec = {}
    family, experiment, variant = run_dir.relative_to(results_dir).parts
    hardware = record.get("hardware")
    if not isinstance(hardware, Mapping) or not hardware:
        hardware = _read_json_or_none(run_dir / rec.HARDWARE_FILE)
    hardware = dict(hardware) if isinstance(hardware, Mapping) else {}
    headline = spec.get("headline_metrics") or ()
    knobs = spec.get("knobs")
    attempt = record.get("attempt")
    return RunRow(
        family=str(record.get("family") or spec.get("family") or family),
        experiment=str(record.get("experiment") or spec.get("experiment") or experiment),
        variant=str(record.get("variant") or spec.get("variant") or variant),
        status=str(record.get("status") or "failed"),
        reason=_str_or_none(record.get("reason")),
        attempt=attempt if isinstance(attempt, int) and not isinstance(attempt, bool) else None,
        scale=_str_or_none(spec.get("scale")),
        hostname=_str_or_none(hardware.get("hostname")),
        cpu_model=_str_or_none(hardware.get("cpu_model")),
        cpu_arch=_str_or_none(hardware.get("cpu_arch")),
        gpu_model=_str_or_none(hardware.get("gpu_model")),
        host_link=_str_or_none(hardware.get("host_link")),
        duration_s=_float_or_none(record.get("duration_s")),
        metrics=_clean_metrics(record.get("metrics")),
        run_dir=run_dir,
        baseline=_str_or_none(spec.get("baseline")),
        compare_to=_str_or_none(spec.get("compare_to")),
        headline_metrics=tuple(str(m) for m in headline) if isinstance(headline, (list, tuple)) else (),
        knobs=dict(knobs) if isinstance(knobs, Mapping) else {},
        hardware=hardware,
        machine=_str_or_none(record.get("machine"))
        or (machine_name(hardware) if hardware else None),
        tags={str(k): str(v) for k, v in (record.get("tags") or {}).items()}
        if isinstance(record.get("tags"), Mapping) else {},
    )


def _sort_key(run: RunRow) -> tuple[str, str, str]:
    return (run.family, run.experiment, run.variant)


def collect_runs(results_dir: Path) -> list[RunRow]:
    """Every run directory ``{family}/{experiment}/{variant}/`` under ``results_dir`` that holds
    a record, sorted by family, experiment, variant. ``attempts/`` folders are not runs."""
    results_dir = Path(results_dir)
    if not results_dir.is_dir():
        return []
    runs = []
    for run_dir in results_dir.glob("*/*/*"):
        parts = run_dir.relative_to(results_dir).parts
        if any(p.startswith(".") or p == "attempts" for p in parts) or not run_dir.is_dir():
            continue
        row = _run_row(run_dir, results_dir)
        if row is not None:
            runs.append(row)
    runs.sort(key=_sort_key)
    return runs


# ------------------------------------------------------------------------------------------
# grouping and ratios
# ------------------------------------------------------------------------------------------
def _group(runs: Iterable[RunRow]) -> dict[tuple[str, str], list[RunRow]]:
    groups: dict[tuple[str, str], list[RunRow]] = {}
    for run in sorted(runs, key=_sort_key):
        groups.setdefault((run.family, run.experiment), []).append(run)
    return groups


def _baseline_name(runs: Sequence[RunRow]) -> str | None:
    return next((r.baseline for r in runs if r.baseline), None)


def _baseline_run(runs: Sequence[RunRow]) -> RunRow | None:
    name = _baseline_name(runs)
    return next((r for r in runs if r.variant == name), None) if name else None


def _reference_name(run: RunRow, runs: Sequence[RunRow]) -> str | None:
    """The variant ``run`` is compared with: the one it names (``compare_to``), else the
    experiment's baseline (e.g. fp8 against bf16 compiled alike, not against eager bf16)."""
    return run.compare_to or _baseline_name(runs)


def _reference_run(run: RunRow, runs: Sequence[RunRow]) -> RunRow | None:
    """The run of ``run``'s reference variant; None when it has no run (then no ratio: never
    a silent fallback to another variant)."""
    name = _reference_name(run, runs)
    return next((r for r in runs if r.variant == name), None) if name else None


def _ratio(value: float | None, base: RunRow | None, metric: str) -> float | None:
    """``value`` over the baseline's value of ``metric``; None when either is missing, the
    baseline is not ok, or its value is 0."""
    if value is None or base is None or base.status != "ok":
        return None
    base_value = base.metrics.get(metric)
    if base_value is None or base_value == 0:
        return None
    return value / base_value


def _metric_names(runs: Iterable[RunRow]) -> list[str]:
    return sorted({m for r in runs for m in r.metrics})


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)
    return str(value)


def summary_rows(runs: Sequence[RunRow]) -> tuple[list[str], list[list[str]]]:
    """The header and rows of ``summary.csv`` (cells as strings, empty for missing)."""
    metrics = _metric_names(runs)
    header = [*SUMMARY_COLUMNS, *metrics, *(m + RATIO_SUFFIX for m in metrics)]
    rows = []
    for group in _group(runs).values():
        for r in group:
            base = _reference_run(r, group)
            fixed = [r.family, r.experiment, r.variant, r.attempt, r.status, r.reason, r.scale,
                     r.hostname, r.gpu_model, r.cpu_arch, r.host_link, r.duration_s,
                     _reference_name(r, group), r.machine, r.reference_check]
            values = [r.metrics.get(m) for m in metrics]
            ratios = [_ratio(r.metrics.get(m), base, m) for m in metrics]
            rows.append([_cell(v) for v in (*fixed, *values, *ratios)])
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


# ------------------------------------------------------------------------------------------
# charts
# ------------------------------------------------------------------------------------------
def _fmt(value: Any) -> str:
    if value is None:
        return _DASH
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        return f"{value:.4g}"
    return str(value)


def _chart_metrics(runs: Sequence[RunRow]) -> tuple[list[str], bool]:
    """The metrics to chart and whether they were declared (headline) or picked."""
    declared: list[str] = []
    for r in runs:
        for m in r.headline_metrics:
            if m not in declared:
                declared.append(m)
    if declared:
        # a family may declare figures only some of its experiments record (membench: the
        # allocation time is an alloc figure); chart those this experiment has, if any
        present = [m for m in declared if any(m in r.metrics for r in runs)]
        return present or declared, True
    ok = [r for r in runs if r.status == "ok" and r.metrics]
    if not ok:
        return [], False
    base = _baseline_run(runs)
    first = base if base in ok else ok[0]
    common = [m for m in first.metrics if all(m in r.metrics for r in ok)]
    return common[:FALLBACK_METRICS], False


def _ordered(runs: Sequence[RunRow]) -> list[RunRow]:
    """Baseline first, then the other variants by name."""
    base = _baseline_name(runs)
    return sorted(runs, key=lambda r: (r.variant != base, r.variant))


def _plain(text: str) -> str:
    """Text matplotlib draws as written: a ``$`` would start mathtext."""
    return text.replace("$", r"\$")


#: The profile breakdown chart: (label, colour, metric of the share of GPU operation time);
#: "other kernels" is the kernel share less the top kernel's, idle is 1 - prof_gpu_busy_frac.
PROFILE_PARTS: tuple[tuple[str, str, str | None], ...] = (
    ("top kernel", "#1b5e20", "prof_top_kernel_gpu_share"),
    ("other kernels", "#66bb6a", None),
    ("memcpy H2D", "#1565c0", "prof_memcpy_h2d_share"),
    ("memcpy D2H", "#64b5f6", "prof_memcpy_d2h_share"),
    ("memcpy other", "#90caf9", None),
    ("unified memory", "#ef6c00", "prof_um_share"),
    ("memset", "#8d6e63", "prof_memset_share"),
    ("GPU idle", "#e0e0e0", None),
)


def profile_breakdown(metrics: Mapping[str, float]) -> dict[str, float] | None:
    """A profiled run's capture as fractions that sum to 1: each kind of GPU operation's share
    of the GPU's busy time, and idle time. None for a run without nsys/torch GPU figures."""
    busy = metrics.get("prof_gpu_busy_frac")
    if busy is None or not math.isfinite(busy):
        return None
    busy = min(max(busy, 0.0), 1.0)
    share = {label: metrics.get(key, 0.0) for label, _, key in PROFILE_PARTS if key}
    share["other kernels"] = max(0.0, metrics.get("prof_kernel_share", 0.0)
                                 - share["top kernel"])
    copies = sum(v for k, v in metrics.items()
                 if k.startswith("prof_memcpy_") and k.endswith("_share"))
    share["memcpy other"] = max(0.0, copies - share["memcpy H2D"] - share["memcpy D2H"])
    total = sum(share.values())
    out = {label: (share.get(label, 0.0) / total * busy if total else 0.0)
           for label, _, _ in PROFILE_PARTS if label != "GPU idle"}
    out["GPU idle"] = 1.0 - sum(out.values())
    return out


class _Plotter:
    """Bar charts as base64 PNG; matplotlib is imported on first use, without pyplot."""

    def profile_chart(self, runs: Sequence[RunRow]) -> str:
        """One horizontal stacked bar per profiled variant: where the capture's time went."""
        rows = [(r, profile_breakdown(r.metrics)) for r in runs if r.status == "ok"]
        rows = [(r, b) for r, b in rows if b is not None]
        fig = self._figure(figsize=(8.0, 0.9 + 0.38 * len(rows)), dpi=80)
        self._canvas(fig)
        ax = fig.add_subplot()
        for i, (r, parts) in enumerate(rows):
            left = 0.0
            for label, colour, _ in PROFILE_PARTS:
                width = parts[label]
                ax.barh(i, width, left=left, color=colour, edgecolor="white", linewidth=0.4,
                        label=label if i == 0 else None)
                if width >= 0.08:
                    ax.text(left + width / 2, i, f"{width:.0%}", ha="center", va="center",
                            fontsize=7, color="black" if label == "GPU idle" else "white")
                left += width
        ax.set_yticks(range(len(rows)), [_plain(r.variant[:28]) for r, _ in rows], fontsize=8)
        ax.invert_yaxis()
        ax.set_xlim(0, 1)
        ax.xaxis.set_major_formatter(lambda x, _pos: f"{x:.0%}")
        ax.tick_params(axis="x", labelsize=8)
        ax.legend(ncol=4, fontsize=7, loc="lower center", bbox_to_anchor=(0.5, 1.0),
                  frameon=False)
        ax.spines[["top", "right"]].set_visible(False)
        fig.subplots_adjust(left=0.25, right=0.97, top=1 - 0.75 / fig.get_size_inches()[1],
                            bottom=0.35 / fig.get_size_inches()[1])
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        return base64.b64encode(buf.getvalue()).decode("ascii")

    def __init__(self) -> None:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        self._figure, self._canvas = Figure, FigureCanvasAgg

    def bar_chart(self, runs: Sequence[RunRow], metric: str) -> str:
        n = len(runs)
        fig = self._figure(figsize=(min(max(6.0, 0.55 * n + 1.5), 16.0), 3.0), dpi=80)
        self._canvas(fig)
        ax = fig.add_subplot()
        base_value = None
        labels = []
        for i, r in enumerate(runs):
            value = r.metrics.get(metric) if r.status == "ok" else None
            name = r.variant if len(r.variant) <= 28 else r.variant[:27] + "\u2026"
            labels.append(_plain(name))
            if value is not None:
                if r.is_baseline:
                    base_value = value
                bars = ax.bar(i, value, width=0.7,
                              color="#90a4ae" if r.is_baseline else "#3f6fb5",
                              edgecolor="#37474f", linewidth=0.6,
                              hatch="///" if r.is_baseline else None)
                ax.bar_label(bars, labels=[_fmt(value)], fontsize=7, padding=1)
            else:
                # An empty slot says why there is no bar, rather than dropping the variant.
                text = r.status.upper() if r.status != "ok" else "n/a"
                ax.bar(i, 0, width=0.7)  # keeps the slot on the axis
                ax.text(i, 0.04, text, transform=ax.get_xaxis_transform(), rotation=90,
                        ha="center", va="bottom", fontsize=8, fontweight="bold",
                        color=_STATUS_COLOURS.get(r.status, "#616161"))
        if base_value is not None:
            ax.axhline(base_value, color="#37474f", linestyle="--", linewidth=0.8, zorder=0.5)
        longest = max(len(v) for v in labels)
        rotate = longest * n > 60
        ax.set_xticks(range(n), labels, fontsize=8, rotation=30 if rotate else 0,
                      ha="right" if rotate else "center", rotation_mode="anchor")
        for tick, r in zip(ax.get_xticklabels(), runs):
            if r.is_baseline:
                tick.set_fontweight("bold")
        ax.set_xlim(-0.6, n - 0.4)
        ax.margins(y=0.18)
        ax.tick_params(axis="y", labelsize=8)
        ax.set_title(_plain(metric), fontsize=9, y=1.0, pad=4)  # a fixed y skips a costly re-layout
        ax.spines[["top", "right"]].set_visible(False)
        # Fixed margins sized from the labels: tight_layout would cost a third of the time.
        # (the text is measured from font metrics alone, which costs no drawing).
        width, height = fig.get_size_inches()
        renderer = fig.canvas.get_renderer()
        text_w, text_h = 0.0, 0.0
        for tick in ax.get_xticklabels():
            w, h, _ = renderer.get_text_width_height_descent(
                tick.get_text(), tick.get_fontproperties(), ismath=False)
            text_w, text_h = max(text_w, w), max(text_h, h)
        extent = (text_w * 0.5 + text_h * 0.87) if rotate else text_h  # 30 degrees
        bottom = 0.12 + extent / fig.dpi
        left = 0.62
        if rotate:  # the first label reaches left of its slot, past the y labels maybe
            first_w, _, _ = renderer.get_text_width_height_descent(
                labels[0], ax.get_xticklabels()[0].get_fontproperties(), ismath=False)
            slot = 0.6 * (width - 0.8) / (n + 0.2)
            left = max(left, first_w * 0.87 / fig.dpi - slot + 0.2)
        fig.subplots_adjust(left=left / width, right=1 - 0.15 / width,
                            top=1 - 0.3 / height, bottom=min(bottom, 1.6) / height)
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        return base64.b64encode(buf.getvalue()).decode("ascii")


# ------------------------------------------------------------------------------------------
# HTML
# ------------------------------------------------------------------------------------------
_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;
 margin:1.5em 2em;color:#212121;line-height:1.35;font-size:14px}
h1{font-size:1.5em;margin:0 0 .2em}h2{font-size:1.25em;margin-top:1.6em;
 border-bottom:2px solid #cfd8dc;padding-bottom:.15em}h3{font-size:1.05em;margin:1.2em 0 .4em}
.meta{color:#546e7a;margin:.2em 0 .8em}
table{border-collapse:collapse;margin:.3em 0 .8em;font-size:13px}
th,td{border:1px solid #cfd8dc;padding:3px 8px;text-align:left;vertical-align:top;
 white-space:nowrap}td.wrap{white-space:normal}
th{background:#eceff1}td.num{text-align:right;font-variant-numeric:tabular-nums}
.st{display:inline-block;padding:0 .5em;border-radius:3px;color:#fff;font-weight:600;
 font-size:12px}
td.reason{color:#5d4037;min-width:10em;max-width:40em;white-space:pre-wrap;
 word-break:break-word}
.charts{display:flex;flex-wrap:wrap;gap:8px}.charts figure{margin:0;max-width:100%}
.charts img{max-width:100%;height:auto}
.charts figcaption{font-size:11px;color:#607d8b}
.note{color:#78909c;font-style:italic}.base{font-weight:600}
code{font-size:12px}ul.toc{columns:2;padding-left:1.2em}.scroll{overflow-x:auto}
"""


def _e(value: Any) -> str:
    return html.escape(_fmt(value) if not isinstance(value, str) else value, quote=True)


def _anchor(*parts: str) -> str:
    return "x-" + re.sub(r"[^A-Za-z0-9_-]+", "-", "--".join(parts))


def _badge(status: str) -> str:
    colour = _STATUS_COLOURS.get(status, "#424242")
    return f'<span class="st" style="background:{colour}">{_e(status)}</span>'


def _counts(runs: Sequence[RunRow]) -> str:
    counts = Counter(r.status for r in runs)
    order = [s for s in rec.STATUSES if s in counts] + sorted(set(counts) - set(rec.STATUSES))
    return " ".join(f"{_badge(s)}&nbsp;{counts[s]}" for s in order)


def _hardware_value(key: str, value: Any) -> str:
    if value is None or value == "":
        return _DASH
    if key in ("mem_total_gb", "gpu_memory_gb") and isinstance(value, (int, float)):
        return f"{_fmt(float(value))} GB"
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value)
    return _fmt(value)


def _hardware_table(runs: Sequence[RunRow]) -> str:
    hosts: dict[tuple[str, ...], int] = {}
    for r in runs:
        if not r.hardware:
            continue
        row = (_hardware_value("machine", r.machine),
               *(_hardware_value(k, r.hardware.get(k)) for k, _ in _HARDWARE_COLUMNS))
        hosts[row] = hosts.get(row, 0) + 1
    if not hosts:
        return '<p class="note">No run recorded its hardware.</p>'
    head = "<th>machine</th>" + "".join(f"<th>{_e(label)}</th>" for _, label in _HARDWARE_COLUMNS)
    head += "<th>runs</th>"
    body = "".join(
        "<tr>" + "".join(f"<td>{_e(v)}</td>" for v in row) + f'<td class="num">{n}</td></tr>'
        for row, n in sorted(hosts.items())
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _knobs(knobs: Mapping[str, Any]) -> str:
    """The knobs a variant turns away from their defaults (the rest would only be noise)."""
    from hopperlab.workloads.base import KNOB_DEFAULTS

    changed = [f"{k}={v}" for k, v in knobs.items() if KNOB_DEFAULTS.get(k) != v]
    return ", ".join(changed) or "defaults"


def _compared_note(run: RunRow, runs: Sequence[RunRow]) -> str:
    """``(baseline)``, or ``(vs X)`` for a variant compared with another variant than it."""
    if run.is_baseline:
        return ' <span class="note">(baseline)</span>'
    if run.compare_to and run.compare_to != _baseline_name(runs):
        return f' <span class="note">(vs {_e(run.compare_to)})</span>'
    return ""


def _status_table(runs: Sequence[RunRow], metrics: Sequence[str]) -> str:
    show_knobs = any(r.knobs for r in runs)
    head = ["variant", "status", "attempt", "scale", "host", "duration s"]
    head += ["knobs"] if show_knobs else []
    others = any(r.compare_to and r.compare_to != _baseline_name(runs) for r in runs)
    show_check = any(r.reference_check not in (None, "no-reference") for r in runs)
    show_cost = any("cost_run" in r.metrics for r in runs)
    head += ["reference check"] if show_check else []
    head += ["cost of the run"] if show_cost else []
    for m in metrics:
        head += [m, "\u00d7 reference" if others else "\u00d7 baseline"]
    head.append("reason")
    out = ['<div class="scroll"><table><thead><tr>', *(f"<th>{_e(h)}</th>" for h in head),
           "</tr></thead><tbody>"]
    for r in runs:
        variant = _e(r.variant) + _compared_note(r, runs)
        base = _reference_run(r, runs)
        cells = [
            f'<td class="{"base" if r.is_baseline else ""}">{variant}</td>',
            f"<td>{_badge(r.status)}</td>",
            f'<td class="num">{_e(r.attempt)}</td>',
            f"<td>{_e(r.scale)}</td>",
            f"<td>{_e(r.hostname)}</td>",
            f'<td class="num">{_e(r.duration_s)}</td>',
        ]
        if show_knobs:
            cells.append(f'<td class="wrap"><code>{_e(_knobs(r.knobs))}</code></td>')
        if show_check:
            cells.append(f"<td>{_e(r.reference_check or _DASH)}</td>")
        if show_cost:
            cost = r.metrics.get("cost_run")
            cells.append(f'<td class="num">{_e(cost)} {_e(r.tags.get("cost.currency", ""))}'
                         "</td>" if cost is not None else f"<td>{_DASH}</td>")
        for m in metrics:
            value = r.metrics.get(m)
            ratio = _ratio(value, base, m)
            cells.append(f'<td class="num">{_e(value)}</td>')
            cells.append(f'<td class="num">{_e(None if ratio is None else round(ratio, 3))}</td>')
        cells.append(f'<td class="reason">{_e(r.reason or "")}</td>')
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</tbody></table></div>")
    return "".join(out)


def _experiment_section(runs: Sequence[RunRow], plotter: _Plotter | None) -> str:
    family, experiment = runs[0].family, runs[0].experiment
    runs = _ordered(runs)
    metrics, declared = _chart_metrics(runs)
    base = _baseline_name(runs)
    out = [f'<h3 id="{_anchor(family, experiment)}">{_e(experiment)} '
           f'<span class="meta">{_counts(runs)}</span></h3>']
    out.append(f'<p class="meta">baseline: <b>{_e(base) if base else _DASH}</b>'
               + ("" if not base or any(r.variant == base for r in runs)
                  else " <span class=\"note\">(no run)</span>") + "</p>")
    out.append(_status_table(runs, metrics))
    charts = []
    for m in metrics:
        if plotter is None or not any(r.status == "ok" and m in r.metrics for r in runs):
            charts.append(f'<p class="note">No ok variant has a value for {_e(m)}.</p>')
            continue
        png = plotter.bar_chart(runs, m)
        charts.append(f'<figure><img alt="{_e(m)} per variant" src="data:image/png;base64,'
                      f'{png}"><figcaption>{_e(m)}'
                      + (f" \u2014 hatched bar, bold label and dashed line: baseline {_e(base)}"
                         if base else "")
                      + "</figcaption></figure>")
    if plotter is not None and any(r.status == "ok" and profile_breakdown(r.metrics)
                                   for r in runs):
        out.append('<figure class="profile"><img alt="profile breakdown per variant" '
                   f'src="data:image/png;base64,{plotter.profile_chart(runs)}"><figcaption>'
                   "profile (prof_ metrics): the capture of each profiled variant, split into "
                   "GPU idle time and busy time, the busy part in proportion to each kind of "
                   "GPU operation's share of GPU operation time</figcaption></figure>")
    charts.extend(_family_charts(family, runs) if plotter is not None else [])
    if not metrics:
        out.append('<p class="note">No metrics to chart (no headline metrics declared and '
                   "no metric common to the ok variants).</p>")
    else:
        if not declared:
            out.append('<p class="note">No headline metrics declared; charting the first '
                       "metrics common to the ok variants.</p>")
        out.append('<div class="charts">' + "".join(charts) + "</div>")
    return "\n".join(out)


def _family_charts(family: str, runs: Sequence[RunRow]) -> list[str]:
    """The family's own charts (FamilyInfo.charts), as figures; a chart that fails to draw is
    named in a note instead of breaking the report."""
    try:
        from hopperlab.workloads import family_info

        draw = family_info(family).load_charts()
    except (KeyError, ImportError, AttributeError):
        return []
    if draw is None:
        return []
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        out = []
        for chart in draw([r for r in runs if r.status == "ok"]):
            FigureCanvasAgg(chart.figure)
            buf = io.BytesIO()
            chart.figure.savefig(buf, format="png")
            png = base64.b64encode(buf.getvalue()).decode("ascii")
            out.append(f'<figure><img alt="{_e(chart.title)}" src="data:image/png;base64,{png}">'
                       f"<figcaption>{_e(chart.caption)}</figcaption></figure>")
        return out
    except Exception as exc:  # noqa: BLE001 - a chart never takes the report down
        return [f'<p class="note">{_e(family)} charts failed: {_e(type(exc).__name__)}: '
                f"{_e(str(exc)[:200])}</p>"]


def _plural(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else (many or one + 's')}"


def _progress(items: list, total_runs: int, description: str) -> Iterable:
    if total_runs <= PROGRESS_MIN_RUNS:
        return items
    from rich.progress import track

    return track(items, description=description, transient=True)


def render_html(runs: Sequence[RunRow], title: str = "hopperlab report",
                source: str | None = None) -> str:
    """The report as one self-contained HTML string."""
    runs = sorted(runs, key=_sort_key)
    made = rec.utc_now()
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{_e(title)}</h1>",
        f'<p class="meta">made {_e(made)}'
        + (f" from <code>{_e(source)}</code>" if source else "") + "</p>",
    ]
    if not runs:
        out.append('<p class="note">There are no runs: no run directory with a record was '
                   "found.</p></body></html>")
        return "\n".join(out)
    groups = _group(runs)
    families: dict[str, list[tuple[str, str]]] = {}
    for fam, exp in groups:
        families.setdefault(fam, []).append((fam, exp))
    out.append(f"<p>{_plural(len(runs), 'run')} in {_plural(len(groups), 'experiment')} of "
               f"{_plural(len(families), 'family', 'families')}: {_counts(runs)}</p>")
    toc = "".join(
        f'<li><a href="#{_anchor(*key)}">{_e(key[0])} / {_e(key[1])}</a> {_counts(groups[key])}</li>'
        for key in groups
    )
    out.append(f'<ul class="toc">{toc}</ul>')
    out.append("<h2>Hardware</h2>")
    out.append(_hardware_table(runs))
    needs_plots = any(r.status == "ok" and r.metrics for r in runs)
    plotter = _Plotter() if needs_plots else None
    sections: dict[tuple[str, str], str] = {}
    for key in _progress(list(groups), len(runs), "report charts"):
        sections[key] = _experiment_section(groups[key], plotter)
    for fam, keys in families.items():
        out.append(f'<h2 id="{_anchor(fam)}">{_e(fam)}</h2>')
        out.extend(sections[key] for key in keys)
    out.append("</body></html>")
    return "\n".join(out)


def write_html(runs: Sequence[RunRow], path: Path, source: str | None = None) -> Path:
    """Write ``report.html`` (atomically)."""
    rec.write_text_atomic(Path(path), render_html(runs, source=source))
    return Path(path)


def _references_dir(results_dir: Path) -> Path | None:
    """configs/references of the project the results folder is in (None: none found)."""
    for folder in (results_dir.resolve(), *results_dir.resolve().parents):
        if (folder / "configs" / "references").is_dir():
            return folder / "configs" / "references"
    return None


def build_report(results_dir: Path, references_dir: Path | None = None) -> tuple[Path, Path]:
    """Write ``summary.csv`` and ``report.html`` into ``results_dir``; return their paths.
    Each run is judged against its machine's references (``references_dir``, default the
    project's configs/references/)."""
    results_dir = Path(results_dir)
    runs = collect_runs(results_dir)
    refs = references_dir or _references_dir(results_dir)
    if refs is not None:
        judge_rows(runs, refs)
    summary = write_summary(runs, results_dir / SUMMARY_FILE)
    report = write_html(runs, results_dir / REPORT_FILE, source=str(results_dir))
    return summary, report
