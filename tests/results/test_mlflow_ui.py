"""The MLflow UI shows what hopperlab uploaded: the compare view of one experiment's variants,
rendered by headless Chromium (Debian's /usr/bin/chromium driven by Playwright).

Leaves a screenshot in test-artifacts/mlflow-compare.png. Without a browser the test is skipped,
unless HOPPERLAB_REQUIRE_BROWSER=1, then it fails.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from pathlib import Path

import mlflow
import pytest

from hopperlab.results import tracking
from tests.results.test_tracking import make_run

REPO = Path(__file__).resolve().parents[2]
SCREENSHOT = REPO / "test-artifacts" / "mlflow-compare.png"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]

VARIANTS = {"h2d-pinned": 50.5, "h2d-pageable": 21.25, "d2h-pinned": 52.75}
METRIC = "bw_gbps_peak"


def _no_browser(reason: str):
    if os.environ.get("HOPPERLAB_REQUIRE_BROWSER") == "1":
        pytest.fail(f"HOPPERLAB_REQUIRE_BROWSER=1 but {reason}")
    pytest.skip(reason)


def _chromium() -> str:
    for candidate in (os.environ.get("HOPPERLAB_CHROMIUM"), "/usr/bin/chromium",
                      shutil.which("chromium"), shutil.which("chromium-browser")):
        if candidate and Path(candidate).exists():
            return candidate
    _no_browser("no chromium found (apt-get install -y chromium)")


@pytest.fixture(scope="module")
def browser():
    executable = _chromium()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _no_browser("the playwright Python package is not installed")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.mark.timeout(300)
@pytest.mark.browser
@pytest.mark.mlflow_server
def test_compare_view_shows_variants(browser, mlflow_uri, tmp_path):
    family = f"membench-ui-{uuid.uuid4().hex[:6]}"
    run_ids = []
    for variant, peak in VARIANTS.items():
        run_dir = make_run(tmp_path, family, "copy", variant, final={METRIC: peak})
        run_ids.append(tracking.upload_run(run_dir, mlflow_uri))
    experiment_id = mlflow.MlflowClient(mlflow_uri).get_experiment_by_name(family).experiment_id

    url = tracking.compare_url(mlflow_uri, run_ids, [experiment_id])
    assert url.startswith(f"{mlflow_uri}/#/compare-runs?runs=")
    print(f"\ncompare view: {url}")

    page = browser.new_page(viewport={"width": 1600, "height": 2400})
    try:
        t0 = time.perf_counter()
        page.goto(url)
        # The UI keeps polling, so "network idle" never comes: wait for the content instead.
        page.get_by_text("Comparing 3 Runs").first.wait_for(timeout=90_000)
        page.get_by_text(METRIC, exact=True).first.wait_for(timeout=60_000)
        print(f"compare view rendered in {time.perf_counter() - t0:.1f}s")
        # The assistant side panel hides part of the table in the screenshot: close it if shown.
        _close_side_panel(page)

        text = page.inner_text("body")
        for variant, peak in VARIANTS.items():
            assert page.get_by_text(variant, exact=True).count() >= 1, variant
            assert f"{peak:g}" in text, (variant, peak)
        assert METRIC in text

        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOT), full_page=True)
    except Exception:
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOT.with_name("mlflow-compare-failed.png")),
                        full_page=True)
        raise
    finally:
        page.close()
    assert SCREENSHOT.stat().st_size > 10_000


def _close_side_panel(page) -> None:
    try:
        if "MLflow Assistant" not in page.inner_text("body"):
            return
        close = page.locator("button[aria-label='Close']")
        if close.count() == 1:
            close.first.click(timeout=3_000)
            page.wait_for_timeout(500)
    except Exception:  # cosmetic only
        pass


@pytest.mark.timeout(120)
@pytest.mark.browser
def test_machines_page_shows_each_machine_and_a_ratio(browser, tmp_path):
    """machines.html (hopperlab machines on the two fixture folders) in Chromium: each machine's
    name and the H100's ratio to the H200 on pinned copies are on the page."""
    from hopperlab.results.machines import compare, descriptions, runs

    fixtures = REPO / "tests" / "fixtures" / "machines"
    groups = runs.load_folders([fixtures / "results-h200", fixtures / "results-h100"])
    descs = descriptions.load_descriptions(REPO / "configs" / "machines")
    _, html_path = compare.compare(groups, tmp_path, descriptions=descs)
    page = browser.new_page(viewport={"width": 1600, "height": 1200})
    try:
        page.goto(html_path.as_uri())
        for machine in ("h200-141g-pcie5-x86_64", "h100-80g-pcie5-x86_64"):
            page.get_by_text(machine, exact=True).first.wait_for(timeout=20_000)
        # membench copy/h2d-pinned gbps_at_largest, H100 over H200, from the recorded runs
        pinned = [json.loads((fixtures / f / "membench/copy/h2d-pinned/metrics.json")
                             .read_text())["metrics"]["gbps_at_largest"]
                  for f in ("results-h100", "results-h200")]
        ratio = f"{pinned[0] / pinned[1]:.3f}x"
        # the tables fold below the page's lead: a reader opens membench / copy
        page.locator("details.fold > summary", has_text="membench / copy").first.click()
        page.get_by_text(ratio).first.wait_for(timeout=20_000)
        assert page.locator("img").count() >= 1  # the grouped bar charts
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOT.with_name("machines.png")), full_page=False)
    finally:
        page.close()
