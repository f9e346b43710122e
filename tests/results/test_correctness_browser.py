"""The report's correctness column as a reader sees it, in headless Chromium (issue 47): the
column stands beside the ratios, a DIFFERENT run's verdict is red and its figures are struck
through with no ratio, a run that reads the same keeps its ratio."""

from __future__ import annotations

import pytest

from hopperlab.results.report import build_report
from tests.results.test_correctness import _three
from tests.results.test_mlflow_ui import REPO, browser  # noqa: F401 - the shared Chromium fixture

ARTIFACTS = REPO / "test-artifacts"


@pytest.mark.timeout(300)
@pytest.mark.browser
def test_the_correctness_column_marks_a_different_run(browser, tmp_path):  # noqa: F811
    _, html = build_report(_three(tmp_path / "results"))
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(html.as_uri())
    # the tables sit folded below the verdicts (issue 49): a reader opens them
    page.evaluate("document.querySelectorAll('details.fold').forEach(d => d.open = true)")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "report-correctness.png"), full_page=True)
    table = page.locator("table", has=page.locator("th", has_text="correctness")).first
    heads = table.locator("thead th").all_inner_texts()
    col = heads.index("correctness")
    assert heads[col + 1] == "tokens_per_s" and heads[col + 2].endswith("baseline"), heads
    rows = {}
    for row in table.locator("tbody tr:not(.why)").all():
        cells = row.locator("td")
        rows[cells.nth(0).inner_text().split()[0]] = cells
    bad = rows["skipped"].nth(col)
    assert bad.inner_text() == "DIFFERENT"
    assert "gradient norm" in bad.get_attribute("title")
    assert bad.evaluate("e => getComputedStyle(e).color") == "rgb(183, 28, 28)"
    struck = rows["skipped"].nth(col + 1).locator("s")
    assert struck.inner_text() == "200"
    assert "line-through" in struck.evaluate("e => getComputedStyle(e).textDecorationLine")
    assert rows["skipped"].nth(col + 2).inner_text().strip() in ("", "\u2014")
    assert rows["offload"].nth(col).inner_text() == "same"
    assert rows["offload"].nth(col + 2).inner_text().startswith("0.9")  # ¹: one sample
    assert rows["baseline"].nth(col).inner_text() == "baseline"
    page.close()
