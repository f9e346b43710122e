"""The report's charts, as inline base64 PNG (matplotlib, Agg, no pyplot)."""

from __future__ import annotations

import base64
import io
import math
from typing import Any, Mapping, Sequence

from hopperlab.results import correctness
from hopperlab.results.rows import RunRow, baseline_name, baseline_run

#: a run's status as a colour, the same in the charts and the page's badges
STATUS_COLOURS = {
    "ok": "#2e7d32", "oom": "#e65100", "failed": "#c62828", "timeout": "#6a1b9a",
    "skipped": "#616161",
}

FALLBACK_METRICS = 3


DASH = "\u2014"


def fmt(value: Any) -> str:
    if value is None:
        return DASH
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        return f"{value:.4g}"
    return str(value)


def chart_metrics(runs: Sequence[RunRow]) -> tuple[list[str], bool]:
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
    base = baseline_run(runs)
    first = base if base in ok else ok[0]
    common = [m for m in first.metrics if all(m in r.metrics for r in ok)]
    return common[:FALLBACK_METRICS], False


def ordered(runs: Sequence[RunRow]) -> list[RunRow]:
    """Baseline first, then the other variants by name."""
    base = baseline_name(runs)
    return sorted(runs, key=lambda r: (r.variant != base, r.variant))


def _plain(text: str) -> str:
    """Text matplotlib draws as written: a ``$`` would start mathtext."""
    return text.replace("$", r"\$")


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


#: a DIFFERENT run's bar (``correctness.offered``): grey, cross-hatched, labelled as no finding
DIFFERENT_BAR = {"color": "#e0e0e0", "hatch": "xx", "edgecolor": "#c62828"}


def bar_style(run: RunRow, cut: bool = False) -> tuple[dict[str, Any], str]:
    """A bar's matplotlib style and the words after its value: the baseline hatched, a run that
    computed something else than its reference greyed, cross-hatched and marked ``DIFFERENT:
    not a finding`` (so that nobody reads its height as a result), the others plain."""
    if not correctness.offered(run):
        return dict(DIFFERENT_BAR), ((" \u2191 off scale" if cut else "") + "\n"
                                     + correctness.NOT_A_FINDING)
    style = {"color": "#90a4ae" if run.is_baseline else "#3f6fb5", "edgecolor": "#37474f",
             "hatch": "///" if run.is_baseline else ("..." if cut else None)}
    return style, " \u2191 off scale" if cut else ""


#: a bar this many times the next tallest is drawn cut (labelled "off scale") so that the
#: others stay readable: one variant slowed by a neighbour's job flattened the rest
OUTLIER_FACTOR = 4.0


def scale_top(values: Sequence[float | None]) -> float | None:
    """The top of the value axis when one value dwarfs the rest (None: no cut). Only for
    positive values: the axis starts at zero."""
    vals = sorted(v for v in values if v is not None and math.isfinite(v) and v > 0)
    if len(vals) < 3 or vals[-1] < OUTLIER_FACTOR * vals[-2]:
        return None
    return vals[-2] * 1.5


class Plotter:
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
        top = scale_top([r.metrics.get(metric) for r in runs if r.status == "ok"])
        for i, r in enumerate(runs):
            value = r.metrics.get(metric) if r.status == "ok" else None
            name = r.variant if len(r.variant) <= 28 else r.variant[:27] + "\u2026"
            labels.append(_plain(name))
            if value is not None:
                if r.is_baseline:
                    base_value = value
                cut = top is not None and value > top
                style, words = bar_style(r, cut)
                bars = ax.bar(i, top if cut else value, width=0.7, linewidth=0.6, **style)
                ax.bar_label(bars, labels=[fmt(value) + words], fontsize=7, padding=1,
                             fontweight="bold" if cut or words else None,
                             **({} if correctness.offered(r) else {"color": style["edgecolor"]}))
            else:
                # An empty slot says why there is no bar, rather than dropping the variant.
                text = r.status.upper() if r.status != "ok" else "n/a"
                ax.bar(i, 0, width=0.7)  # keeps the slot on the axis
                ax.text(i, 0.04, text, transform=ax.get_xaxis_transform(), rotation=90,
                        ha="center", va="bottom", fontsize=8, fontweight="bold",
                        color=STATUS_COLOURS.get(r.status, "#616161"))
        if base_value is not None:
            ax.axhline(base_value, color="#37474f", linestyle="--", linewidth=0.8, zorder=0.5)
        longest = max(len(v) for v in labels)
        rotate = longest * n > 60
        ax.set_xticks(range(n), labels, fontsize=8, rotation=30 if rotate else 0,
                      ha="right" if rotate else "center", rotation_mode="anchor")
        for tick, r in zip(ax.get_xticklabels(), runs):
            if r.is_baseline:
                tick.set_fontweight("bold")
            elif not correctness.offered(r):
                tick.set_color(DIFFERENT_BAR["edgecolor"])
        ax.set_xlim(-0.6, n - 0.4)
        ax.margins(y=0.18)
        if top is not None:
            ax.set_ylim(0, top * 1.18)
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
