"""value ± half-width on the pages (issue 29, part 1): summary.csv, report.html and
machines.html of runs measured with repeats; machines judges such runs by the noise test."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from hopperlab.cli.main import main
from hopperlab.results.report import build_report

from tests.helpers import copy_project, run_noisy


def _run(project: Path, results: str, seed: int, steps: int = 10) -> Path:
    run_noisy(project, results, seed=seed, steps=steps, repeats=9)
    return project / results


@pytest.mark.integration
def test_pages_show_value_plus_minus_half_width(tmp_path):
    project = copy_project(tmp_path / "proj")
    a = _run(project, "results-a", seed=1)
    csv_path, html_path = build_report(a, project / "configs/references")
    row = next(csv.DictReader(csv_path.open()))
    half = (float(row["value_ci_high"]) - float(row["value_ci_low"])) / 2
    assert float(row["value_pm"]) == half > 0
    assert f"± {half:.2g}" in html_path.read_text()

    b = _run(project, "results-b", seed=3, steps=9)       # 10 % lower, another machine
    for name in ("record.json", "metrics.json"):
        path = b / "selftest/noise/noisy" / name
        data = json.loads(path.read_text())
        data["machine"] = "other-machine"
        path.write_text(json.dumps(data))
    out = tmp_path / "machines"
    assert main(["--root", str(project), "machines", str(a), str(b), "--out", str(out)]) == 0
    page = (out / "machines.html").read_text()
    assert " ± " in page and "worse" in page and "x</span> [0.8" in page
    assert "<h2>Verdicts</h2>" in page
    assert "other-machine: faster in 0 of 1 runs, slower in 1" in page
    assert page.index("<h2>Verdicts</h2>") < page.index("<h2>selftest / noise</h2>")


@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
def test_report_leads_with_a_verdict_per_experiment(tmp_path):
    """The 2026-11-24 H100 runs: per experiment the best and worst variant against the
    baseline, said to rest on one sample each (no repeats then)."""
    import shutil

    from tests.helpers import REPO
    results = tmp_path / "results-h100"
    shutil.copytree(REPO / "tests/fixtures/machines/results-h100", results)
    _, html_path = build_report(results, REPO / "configs/references")
    page = html_path.read_text()
    assert page.index("<h2>Verdicts</h2>") < page.index("<h2>Hardware</h2>")
    assert ("lora-llama2-7b, on tokens_per_s: best bf16-compile 1.49x faster than baseline "
            "(1 sample each)") in page
