"""The finetune family's report charts: what each memory technique buys and what it costs.

* **Speed against memory**: one point per variant, tokens/s over peak GPU memory (allocated),
  the baseline green and labelled (no legend: its marker would read as one more point). Which
  techniques pay off is where the points sit: up and to the left is better; a technique that
  saves memory moves left, and what it costs shows as the drop.
* **Step time and the host link**: the median step of each variant whose techniques move
  counted bytes over the host link, with what the link allows (``link_floor_s``, the larger
  direction at its measured rate; ``link_two_phase_s``, out in forward then back in backward)
  and the baseline's step. A bar on its two-phase tick is the link's, not the technique's.
* **Saved-tensor census**: for the variants that measured it (``census: true``), the GB one
  forward keeps for backward, stacked by the source's five size classes: where the bytes sit
  (many small tensors, or a few of gigabytes) and what a size threshold would offload.

matplotlib only (the report runs on the login node, without torch).
"""

from __future__ import annotations

from typing import Any, Sequence

from hopperlab.memory.saved_tensor_census import SIZE_CLASSES
from hopperlab.workloads.base import FamilyChart, frame_variants

BASELINE_COLOUR = "#2e7d32"
VARIANT_COLOUR = "#3f6fb5"
#: the census's size classes, small to large
CLASS_COLOURS = ("#cfd8dc", "#90caf9", "#42a5f5", "#1565c0", "#0d2c6b")


def _ok(runs: Sequence[Any], *metrics: str) -> list[Any]:
    return [r for r in runs if r.status == "ok" and all(r.metrics.get(m) for m in metrics)]


def _point_label(run: Any) -> str:
    """The variant's name, ``(baseline)`` added to the baseline's: the chart has no legend, whose
    frameless marker, among the points, read as one more run."""
    if run.is_baseline and run.variant != "baseline":
        return f"{run.variant} (baseline)"
    return run.variant


def speed_against_memory(runs: Sequence[Any]) -> FamilyChart | None:
    from matplotlib.figure import Figure

    rows = _ok(runs, "tokens_per_s", "peak_gpu_allocated_gib")
    if len(rows) < 2:
        return None
    fig = Figure(figsize=(6.5, 4.0), dpi=80)
    ax = fig.add_subplot()
    for r in rows:
        x, y = r.metrics["peak_gpu_allocated_gib"], r.metrics["tokens_per_s"]
        colour = BASELINE_COLOUR if r.is_baseline else VARIANT_COLOUR
        ax.scatter(x, y, s=28, color=colour, zorder=3)
        ax.annotate(_point_label(r), (x, y), xytext=(4, 3), textcoords="offset points",
                    fontsize=7)
    ax.set_xlabel("peak GPU memory allocated (GiB)", fontsize=8)
    ax.set_ylabel("tokens/s (median step)", fontsize=8)
    # room on the right and on top for the labels of the outermost points
    ax.set_xlim(0, 1.25 * max(r.metrics["peak_gpu_allocated_gib"] for r in rows))
    ax.set_ylim(0, 1.1 * max(r.metrics["tokens_per_s"] for r in rows))
    ax.grid(True, linewidth=0.3)
    ax.spines[["top", "right"]].set_visible(False)
    fig.subplots_adjust(left=0.12, right=0.97, bottom=0.13, top=0.95)
    return FamilyChart(
        title="speed against memory",
        caption="tokens/s over peak GPU memory, one point per variant (green: the baseline): "
                "up and to the left is better",
        figure=fig)


def step_and_link(runs: Sequence[Any]) -> FamilyChart | None:
    from matplotlib.figure import Figure

    rows = _ok(runs, "step_time_p50_s", "link_floor_s")
    if not rows:
        return None
    fig = Figure(figsize=(max(5.0, 0.8 * len(rows) + 2.0), 3.2), dpi=80)
    ax = fig.add_subplot()
    floor_label, two_phase_label = "link floor (larger direction)", "link, out then back"
    for i, r in enumerate(rows):
        step = r.metrics["step_time_p50_s"]
        bar = ax.bar(i, step, width=0.7, color=VARIANT_COLOUR)
        ax.bar_label(bar, labels=[f"{step:.3g} s"], fontsize=7)
        ax.hlines(r.metrics["link_floor_s"], i - 0.4, i + 0.4, colors="black", linewidth=1.6,
                  label=floor_label)
        floor_label = None
        two_phase = r.metrics.get("link_two_phase_s")
        if two_phase:
            ax.hlines(two_phase, i - 0.4, i + 0.4, colors="#ef6c00", linewidth=1.6,
                      label=two_phase_label)
            two_phase_label = None
    base = [r for r in _ok(runs, "step_time_p50_s") if r.is_baseline]
    if base:
        ax.axhline(base[0].metrics["step_time_p50_s"], color=BASELINE_COLOUR, linestyle="--",
                   linewidth=1, label=f"baseline step ({base[0].variant})")
    ax.set_ylabel("s a step (median)", fontsize=8)
    ax.legend(fontsize=7, frameon=False)
    frame_variants(fig, ax, [r.variant for r in rows])
    return FamilyChart(
        title="step time and the host link",
        caption="median step of each variant that moves counted bytes over the host link; "
                "black: its bytes' larger direction at the measured pinned rate, orange: out "
                "then back (activation offload), dashed: the baseline's step",
        figure=fig)


def census_by_class(runs: Sequence[Any]) -> FamilyChart | None:
    from matplotlib.figure import Figure

    rows = _ok(runs, "census_gb_total")
    if not rows:
        return None
    fig = Figure(figsize=(max(5.0, 0.8 * len(rows) + 2.5), 3.2), dpi=80)
    ax = fig.add_subplot()
    bottoms = [0.0] * len(rows)
    for cls, colour in zip(SIZE_CLASSES, CLASS_COLOURS):
        heights = [r.metrics.get(f"census_gb_{cls.key}", 0.0) for r in rows]
        ax.bar(range(len(rows)), heights, bottom=bottoms, width=0.7, color=colour,
               label=cls.label)
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    for i, r in enumerate(rows):
        ax.annotate(f"{int(r.metrics['census_tensors_total'])} tensors", (i, bottoms[i]),
                    xytext=(0, 2), textcoords="offset points", ha="center", fontsize=7)
    ax.set_ylabel("GB saved for backward (one forward)", fontsize=8)
    ax.set_ylim(0, 1.15 * max(bottoms))
    ax.legend(fontsize=7, frameon=False, title="size class", title_fontsize=7,
              loc="center left", bbox_to_anchor=(1.0, 0.5))
    frame_variants(fig, ax, [r.variant for r in rows], right=0.75)
    return FamilyChart(
        title="saved-tensor census",
        caption="GB one forward keeps for backward, stacked by the size class of each saved "
                "tensor (decimal MB; shared memory once, parameters apart), for the variants "
                "that measured it",
        figure=fig)


def charts(runs: Sequence[Any]) -> list[FamilyChart]:
    drawn = (speed_against_memory(runs), step_and_link(runs), census_by_class(runs))
    return [c for c in drawn if c is not None]
