"""The report's per-variant profile breakdown, from prof_ metrics of real profiles."""

from __future__ import annotations

from pathlib import Path

import pytest

from hopperlab.core.rundir import write_json_atomic, write_record
from hopperlab.profiling import nsys_sqlite
from hopperlab.profiling.timeline import derive_metrics
from hopperlab.results.report.charts import profile_breakdown
from hopperlab.results.rows import collect_runs
from hopperlab.results.report.html import render_html

FIX = Path(__file__).parents[1] / "fixtures" / "profiling"


def prof_metrics(name: str) -> dict[str, float]:
    return derive_metrics(nsys_sqlite.read_timeline(FIX / f"{name}.sqlite"))[0]


def make_run(results: Path, experiment: str, variant: str, metrics: dict[str, float]) -> None:
    run_dir = results / "trainloop" / experiment / variant
    write_json_atomic(run_dir / "spec.json", {"family": "trainloop", "experiment": experiment,
                                              "variant": variant, "baseline": "w0",
                                              "scale": "full", "knobs": {"profiler": "nsys"}})
    write_record(run_dir, {"family": "trainloop", "experiment": experiment, "variant": variant,
                           "attempt": 1, "status": "ok", "reason": None, "metrics": metrics,
                           "tags": {}, "hardware": {}})


@pytest.mark.parametrize("name", ["trainloop__loop__w0-managed-nsys",
                                  "membench__copy-profiled__bidir-pinned", "matmul-h200"])
def test_breakdown_sums_to_the_capture(name):
    m = prof_metrics(name)
    parts = profile_breakdown(m)
    assert sum(parts.values()) == pytest.approx(1.0)
    assert all(v >= -1e-12 for v in parts.values())
    assert parts["GPU idle"] == pytest.approx(1 - m["prof_gpu_busy_frac"])


def test_breakdown_parts_follow_the_profile():
    managed = profile_breakdown(prof_metrics("trainloop__loop__w0-managed-nsys"))
    bidir = profile_breakdown(prof_metrics("membench__copy-profiled__bidir-pinned"))
    assert managed["unified memory"] > 0 and bidir["unified memory"] == 0
    assert bidir["memcpy H2D"] == pytest.approx(bidir["memcpy D2H"], rel=0.2)
    assert profile_breakdown({"gbps_peak": 3.0}) is None


def test_report_shows_the_chart_only_for_profiled_experiments(tmp_path):
    make_run(tmp_path, "loop", "w0", prof_metrics("trainloop__loop__w0-device-nsys"))
    make_run(tmp_path, "loop", "w4", prof_metrics("trainloop__loop__w4-device-nsys"))
    make_run(tmp_path, "plain", "w0", {"step_s": 0.1})
    html = render_html(collect_runs(tmp_path))
    assert html.count('alt="profile breakdown per variant"') == 1
    loop, plain = html.split('id="x-trainloop--plain"')
    assert "profile breakdown" in loop and "profile breakdown" not in plain
