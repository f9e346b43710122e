"""Families draw their own charts into the report through FamilyInfo.charts."""

from __future__ import annotations

from pathlib import Path

from hopperlab.report import RunRow, render_html
from hopperlab.workloads.database.charts import charts as database_charts


def _row(variant: str, metrics: dict[str, float], family: str = "database") -> RunRow:
    return RunRow(family=family, experiment="tpch", variant=variant, status="ok", reason=None,
                  attempt=1, scale="full", hostname="n", cpu_model=None, cpu_arch=None,
                  gpu_model=None, host_link=None, duration_s=1.0, metrics=metrics,
                  run_dir=Path("/nonexistent"), baseline="device")


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
