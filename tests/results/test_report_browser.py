"""report.html and machines.html as a reader sees them, in headless Chromium (issue 28, item
14): a skipped run's reason does not make its row tall, and the machines page's prediction
table does not repeat its citations down the page. Screenshots in test-artifacts/."""

from __future__ import annotations

import pytest

from hopperlab.results.machines import compare, descriptions, runs
from hopperlab.results.report import build_report
from tests.results.test_mlflow_ui import REPO, browser  # noqa: F401 - the shared Chromium fixture
from tests.results.test_report_marks import CPU, _run

ARTIFACTS = REPO / "test-artifacts"


@pytest.mark.timeout(300)
@pytest.mark.browser
def test_skipped_rows_stay_one_line_high(browser, tmp_path):  # noqa: F811
    res = tmp_path / "results"
    _run(res, "pageable", {"gbps": 10.0, "cost_run": 1e-5}, tags=CPU)
    for v in ("device", "pinned", "managed"):
        _run(res, v, {}, status="skipped",
             reason=f"placement {v} needs a CUDA device: torch 2.13.0+cpu is a CPU-only build "
                    "(no CUDA); " * 3)
    _, html = build_report(res)
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(html.as_uri())
    # the experiments fold below the verdicts: open them, as a reader does
    page.evaluate("document.querySelectorAll('details.fold').forEach(d => d.open = true)")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "report.png"), full_page=True)
    heights = page.eval_on_selector_all(
        "table tbody tr", "rows => rows.map(r => r.getBoundingClientRect().height)")
    page.close()
    run_rows = heights[: 1 + 3 * 2]            # pageable, then each skipped run and its reason
    assert max(run_rows) < 80, heights          # the reason once sat in a narrow last column


@pytest.mark.timeout(300)
@pytest.mark.browser
def test_machines_page_is_not_a_wall_of_citations(browser, tmp_path):  # noqa: F811
    fixtures = REPO / "tests" / "fixtures" / "machines"
    groups = runs.load_folders([fixtures / "results-h200", fixtures / "results-h100"])
    _, html = compare.compare(groups, tmp_path / "out", targets=["gh200-96g-c2c-aarch64"],
                              descriptions=descriptions.load_descriptions(
                                  REPO / "configs" / "machines"))
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(html.as_uri())
    height = page.evaluate("document.body.scrollHeight")
    page.screenshot(path=str(ARTIFACTS / "machines.png"), full_page=True)
    page.close()
    assert height < 45_000, height              # 70,000 px when each row cited its sources
