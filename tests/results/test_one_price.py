"""One price for one run (issue 49): ``hopperlab report`` reads the price each run recorded at
its own site's rate, so summary.csv, the run's metrics.json and machines.html give the same
dollar figure; another rate is a what-if in files of its own that say so."""

from __future__ import annotations

import csv
import json
import shutil
from html import escape
from pathlib import Path

import pytest

from hopperlab.cli.main import main
from hopperlab.core.stats import money

REPO = Path(__file__).resolve().parents[2]
FIX = REPO / "tests" / "fixtures" / "machines"
RUN = "finetune/lora-llama2-7b/offload-recompute"
UNIT = "cost_per_1m_train_tokens"


def _summary(path: Path) -> dict[str, dict[str, str]]:
    return {f"{r['family']}/{r['experiment']}/{r['variant']}": r
            for r in csv.DictReader(path.open())}


@pytest.mark.integration  # runs for seconds: builds the pages
def test_summary_metrics_and_machines_give_the_same_dollars(tmp_path, capsys):
    h200, h100 = tmp_path / "h200", tmp_path / "h100"
    shutil.copytree(FIX / "results-h200", h200)
    shutil.copytree(FIX / "results-h100", h100)
    recorded = json.loads((h200 / RUN / "metrics.json").read_text())["metrics"]
    # the CLI, as a user runs it on a site whose rate (the local example) is not the runs'
    assert main(["--root", str(REPO), "report", "--config", f"results_dir={h200}"]) == 0
    row = _summary(h200 / "summary.csv")[RUN]
    assert float(row[UNIT]) == recorded[UNIT]
    assert float(row["cost_run"]) == recorded["cost_run"]
    report = (h200 / "report.html").read_text()
    assert escape(money(recorded["cost_run"], "USD")) in report
    assert "WHAT-IF" not in report
    assert main(["--root", str(REPO), "machines", str(h200), str(h100),
                 "--out", str(tmp_path / "out")]) == 0
    page = (tmp_path / "out" / "machines.html").read_text()
    assert escape(money(recorded[UNIT], "USD")) + " per 1M training tokens" in page
    # both fixtures were priced at one rate: the page says the cost ratio is the speed ratio
    assert "One rate for every machine" in page


@pytest.mark.integration  # runs for seconds: builds the pages
def test_a_what_if_price_is_beside_the_real_one_and_says_so(tmp_path, capsys):
    h200 = tmp_path / "h200"
    shutil.copytree(FIX / "results-h200", h200)
    recorded = json.loads((h200 / RUN / "metrics.json").read_text())["metrics"]
    assert main(["--root", str(REPO), "report", "--what-if-price",
                 "--config", f"results_dir={h200}"]) == 0
    assert float(_summary(h200 / "summary.csv")[RUN][UNIT]) == recorded[UNIT]
    what_if = _summary(h200 / "summary-what-if.csv")[RUN]
    assert float(what_if[UNIT]) != recorded[UNIT]  # the local site's example rate
    assert "WHAT-IF" in (h200 / "report-what-if.html").read_text()
    assert "what-if" in capsys.readouterr().out
