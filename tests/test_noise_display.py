"""value ± half-width on the pages (issue 29, part 1): summary.csv, report.html and
machines.html of runs measured with repeats; machines judges such runs by the noise test."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from hopperlab.cli.main import main
from hopperlab.results.report import build_report

from .helpers import copy_project, edit_yaml, hopperlab


def _run(project: Path, results: str, seed: int, steps: int = 10) -> Path:
    def change(d):
        d["experiments"]["noise"]["scales"]["smoke"]["params"].update(seed=seed, steps=steps)
        d["experiments"]["noise"]["repeats"] = 9
    edit_yaml(project / "experiments/selftest.yaml", change)
    out = hopperlab(["run", "selftest/noise/noisy", "--no-upload", "--config",
                     "families=selftest", f"results_dir={results}"], project)
    assert out.returncode == 0, out.stderr
    return project / results


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
