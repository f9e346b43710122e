"""Families draw their own charts into the report through FamilyInfo.charts."""

from __future__ import annotations

from pathlib import Path

import pytest

from hopperlab.results.rows import RunRow
from hopperlab.results.report.html import render_html
from hopperlab.workloads.database.charts import charts as database_charts
from hopperlab.workloads.finetune.charts import charts as finetune_charts


def _row(variant: str, metrics: dict[str, float], family: str = "database",
         baseline: str = "device", status: str = "ok") -> RunRow:
    return RunRow(family=family, experiment="tpch", variant=variant, status=status, reason=None,
                  attempt=1, scale="full", hostname="n", cpu_model=None, cpu_arch=None,
                  gpu_model=None, host_link=None, duration_s=1.0, metrics=metrics,
                  run_dir=Path("/nonexistent"), baseline=baseline)


def test_database_chart_per_measured_query_with_floor_and_duckdb():
    runs = [_row("device", {"q6_time_ms": 1.0, "q6_duckdb_ms": 30.0, "q6_correct": 1.0}),
            _row("host-pinned", {"q6_time_ms": 31.0, "q6_floor_ms": 30.5, "q6_duckdb_ms": 31.0,
                                 "q6_correct": 1.0})]
    drawn = database_charts(runs)
    assert [c.title for c in drawn] == ["q6 time per placement"]
    ax = drawn[0].figure.axes[0]
    assert ax.get_yscale() == "log"
    labels = {t.get_text() for t in ax.get_legend().get_texts()}
    assert labels == {"link floor", "DuckDB (all cores)"}


def test_report_embeds_family_charts_and_survives_a_broken_one(monkeypatch):
    runs = [_row("device", {"q1_time_ms": 2.0, "q1_correct": 1.0})]
    html = render_html(runs)
    assert 'alt="q1 time per placement"' in html

    import hopperlab.workloads.database.charts as mod

    monkeypatch.setattr(mod, "charts", lambda rows: 1 / 0)
    html = render_html(runs)
    assert "database charts failed: ZeroDivisionError" in html


def _finetune_runs() -> list[RunRow]:
    def row(variant, status="ok", **metrics):
        return _row(variant, metrics, family="finetune", baseline="baseline", status=status)
    return [row("baseline", tokens_per_s=12466.0, peak_gpu_allocated_gib=47.8,
                step_time_p50_s=0.657),
            row("offload-recompute", tokens_per_s=6575.0, peak_gpu_allocated_gib=17.3,
                step_time_p50_s=1.246, link_floor_s=0.616, link_two_phase_s=1.232),
            row("save-on-cpu-recompute", tokens_per_s=3187.0, peak_gpu_allocated_gib=15.9,
                step_time_p50_s=2.571),
            row("offload-both", tokens_per_s=842.0, peak_gpu_allocated_gib=6.2,
                step_time_p50_s=2.433, link_floor_s=2.348),
            row("managed", status="failed")]


def test_finetune_charts_show_speed_against_memory_and_the_link():
    drawn = {c.title: c for c in finetune_charts(_finetune_runs())}
    assert set(drawn) == {"speed against memory", "step time and the host link"}
    scatter = drawn["speed against memory"].figure.axes[0]
    points = [tuple(p) for coll in scatter.collections for p in coll.get_offsets()]
    assert (17.3, 6575.0) in points and len(points) == 4          # the failed run is left out
    assert {t.get_text() for t in scatter.texts} >= {"baseline", "offload-recompute"}
    bars = drawn["step time and the host link"].figure.axes[0]
    assert [t.get_text() for t in bars.get_xticklabels()] == ["offload-recompute",
                                                              "offload-both"]
    labels = {t.get_text() for t in bars.get_legend().get_texts()}
    assert labels == {"link floor (larger direction)", "link, out then back",
                      "baseline step (baseline)"}


@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
def test_finetune_charts_need_something_to_show():
    one = _finetune_runs()[:1]
    assert finetune_charts(one) == []            # one point is no trade-off, no link run
    html = render_html(_finetune_runs())
    assert 'alt="speed against memory"' in html and 'alt="step time and the host link"' in html


def _legend_markers_in_the_plot(fig) -> list[tuple[float, float]]:
    """Display positions of every marker a legend of ``fig`` draws inside the plot area."""
    ax = fig.axes[0]
    area = ax.get_window_extent()
    inside = []
    for legend in (ax.get_legend(), *fig.legends):
        for handle in (legend.legend_handles if legend is not None else ()):
            if hasattr(handle, "get_offsets"):
                xy = handle.get_offset_transform().transform(handle.get_offsets())
                inside += [(x, y) for x, y in xy if area.contains(x, y)]
    return inside


def test_speed_against_memory_draws_no_point_that_is_no_run():
    """The legend's marker once sat in the plot, a green 'baseline' dot at ~63 GiB, 1,000/s."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    runs = _finetune_runs()
    chart = {c.title: c for c in finetune_charts(runs)}["speed against memory"]
    FigureCanvasAgg(chart.figure).draw()
    ax = chart.figure.axes[0]
    points = sorted(tuple(p) for coll in ax.collections for p in coll.get_offsets())
    assert points == sorted((r.metrics["peak_gpu_allocated_gib"], r.metrics["tokens_per_s"])
                            for r in runs if r.status == "ok")
    assert _legend_markers_in_the_plot(chart.figure) == []
    # the baseline is still told apart: its colour (the caption says which) and its label
    assert any("baseline" in t.get_text() for t in ax.texts)
