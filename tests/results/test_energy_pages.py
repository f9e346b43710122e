"""Energy where a user looks (issue 30): summary.csv, report.html (table, work per joule, the
power chart), machines.html/csv ("x less energy per unit") and the GH200 prediction's energy
line; and in headless Chromium, the report and machines pages show work per joule.

The runs are the machines fixtures (real H200 and H100 runs) copied to a temporary folder, with
energy added to some of them: power figures made up for the test (labelled so here), recorded
through the same arithmetic a run uses (``config.energy``).
"""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest

from hopperlab.config.energy import energy_figures
from hopperlab.workloads import family_info

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "machines"
LORA = "finetune/lora-llama2-7b"
GH200 = "gh200-96g-c2c-aarch64"


def _add_energy(run_dir: Path, gpu_w: float, host_w: float | None, seconds: float = 4.0) -> None:
    """Energy of a ``gpu_w`` GPU (and ``host_w`` host) over a ``seconds`` window, and a trace
    (test values, not measurements)."""
    for name in ("metrics.json", "record.json"):
        path = run_dir / name
        rec = json.loads(path.read_text())
        m = rec["metrics"]
        m.update(energy_gpu_j=gpu_w * seconds, energy_window_s=seconds, power_gpu_mean_w=gpu_w,
                 power_gpu_peak_w=gpu_w * 1.05, energy_windows=1.0)
        if host_w is not None:
            m["energy_host_j"] = host_w * seconds
        m.update(energy_figures(m, family_info(rec["family"]).work_units))
        rec["tags"].update({"energy.window": f"measured: 1 window(s), {seconds:.3f} s",
                            "energy.gpu": "counter",
                            "energy.host": "dram, package" if host_w is not None
                            else "not measured: no RAPL zones in /sys/class/powercap"})
        path.write_text(json.dumps(rec))
    trace = run_dir / "artifacts" / "energy" / "power_trace.csv"
    trace.parent.mkdir(parents=True, exist_ok=True)
    rows = ["t_s,window,gpu0_w" + (",host_package_w" if host_w is not None else "")]
    for i in range(int(seconds * 10) + 1):
        rows.append(f"{1 + i / 10:.4f},measured,{gpu_w + (i % 3):.2f}"
                    + (f",{host_w:.2f}" if host_w is not None else ""))
    trace.write_text("\n".join(rows) + "\n")


def _not_measured(run_dir: Path) -> None:
    for name in ("metrics.json", "record.json"):
        path = run_dir / name
        rec = json.loads(path.read_text())
        rec["metrics"]["energy_window_s"] = 4.0
        rec["tags"].update({"energy.window": "measured: 1 window(s), 4.000 s",
                            "energy.gpu": "not measured: NVML unavailable: NVMLError_NoPermission",
                            "energy.host": "not measured: no RAPL zones"})
        path.write_text(json.dumps(rec))


@pytest.fixture()
def folders(tmp_path: Path) -> tuple[Path, Path]:
    h200, h100 = tmp_path / "results-h200", tmp_path / "results-h100"
    shutil.copytree(FIXTURES / "results-h200", h200)
    shutil.copytree(FIXTURES / "results-h100", h100)
    _add_energy(h200 / LORA / "baseline", 600.0, 150.0)
    _add_energy(h200 / LORA / "fp8", 550.0, 150.0)
    _not_measured(h200 / LORA / "bf16-compile")
    _add_energy(h100 / LORA / "baseline", 650.0, None)
    return h200, h100


@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
def test_summary_says_not_measured_never_zero(folders):
    from hopperlab.results.report import build_report

    summary, _ = build_report(folders[0])
    rows = {r["variant"]: r for r in csv.DictReader(summary.open())
            if r["experiment"] == "lora-llama2-7b"}
    assert rows["baseline"]["energy_gpu"] == "counter"
    assert float(rows["baseline"]["train_tokens_per_j"]) > 0
    assert rows["bf16-compile"]["energy_gpu"].startswith("not measured: NVML unavailable")
    assert rows["bf16-compile"]["energy_gpu_j"] == "" and rows["bf16-compile"][
        "train_tokens_per_j"] == ""
    assert rows["offload-recompute"]["energy_gpu"] == "not measured"  # recorded before energy


@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
def test_report_has_the_energy_table_and_the_power_chart(folders):
    from hopperlab.results.report import build_report

    _, report = build_report(folders[0])
    page = report.read_text()
    section = page[page.index('id="x-finetune--lora-llama2-7b"'):]
    section = section[: section.index("<h3", 10)] if "<h3" in section[10:] else section
    assert '<table class="energy">' in section
    assert "training tokens per joule" in section and "J per 1M training tokens" in section
    assert 'title="NVML unavailable: NVMLError_NoPermission">not measured<' in section
    assert 'alt="power over the measured window per run"' in section
    tokens = json.loads((folders[0] / LORA / "baseline/metrics.json").read_text())["metrics"]
    assert f"{tokens['train_tokens_per_j']:.4g}" in section


@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
def test_machines_put_energy_side_by_side(folders, tmp_path):
    from hopperlab.results.machines import compare, descriptions, runs

    groups = runs.load_folders(list(folders))
    descs = descriptions.load_descriptions(REPO / "configs" / "machines")
    csv_path, html_path = compare.compare(groups, tmp_path / "out", descriptions=descs,
                                          targets=[GH200])
    rows = [r for r in csv.DictReader(csv_path.open())
            if r["experiment"] == "lora-llama2-7b" and r["variant"] == "baseline"]
    h100 = next(r for r in rows if r["machine"].startswith("h100"))
    m200 = json.loads((folders[0] / LORA / "baseline/metrics.json").read_text())["metrics"]
    m100 = json.loads((folders[1] / LORA / "baseline/metrics.json").read_text())["metrics"]
    expected = m200["energy_per_1m_train_tokens_j"] / m100["energy_per_1m_train_tokens_j"]
    assert float(h100["less_energy_per_unit_x"]) == pytest.approx(expected)
    assert h100["energy_unit"] == "per 1M training tokens"
    page = html_path.read_text()
    assert f"{expected:.2f}x less energy per unit" in page
    assert "training tokens per joule" in page
    no_energy = [r for r in csv.DictReader(csv_path.open()) if r["variant"] == "bf16-compile"
                 and r["experiment"] == "lora-llama2-7b"]
    assert {r["energy_per_unit_j"] for r in no_energy} == {"not measured"}


def test_the_gh200_prediction_has_an_energy_line(folders):
    from hopperlab.results.machines import descriptions, predict, runs

    h200 = runs.load_folder(folders[0])[0]
    descs = descriptions.load_descriptions(REPO / "configs" / "machines")
    src, tgt = descs["h200-141g-pcie5-x86_64"], descs[GH200]
    preds = [p for p in predict.predict(h200, src, tgt)
             if p.key == f"{LORA}/baseline" and p.metric == "tokens_per_s"]
    (p,) = preds
    assert p.predicted and p.energy.joules == pytest.approx(1000.0 / p.predicted * 1e6)
    assert "PREDICTION" in p.energy.label and "per 1M training tokens" in p.energy.label
    assert "450 W to 1000 W" in p.energy.inputs["P_module"]
    # where the GH200 was measured too: predicted against measured
    gh = runs.MachineRuns(GH200, "test", {k: v for k, v in h200.runs.items()})
    measured = predict.predict(h200, src, tgt, gh)
    (q,) = [x for x in measured if x.key == f"{LORA}/baseline" and x.metric == "tokens_per_s"]
    assert q.energy.measured == h200.runs[f"{LORA}/baseline"].metrics[
        "energy_node_per_1m_train_tokens_j"]
    assert q.energy.error is not None
    # a target without a cited module power predicts no energy and says why
    (r,) = [x for x in predict.predict(h200, tgt, src) if x.key == f"{LORA}/baseline"
            and x.metric == "tokens_per_s"]
    assert r.energy.joules is None and "module_power_w" in r.energy.unpredictable


@pytest.mark.timeout(180)
@pytest.mark.browser
def test_pages_show_work_per_joule_in_chromium(folders, tmp_path):
    from tests.results.test_mlflow_ui import CHROMIUM_ARGS, _chromium, _no_browser

    executable = _chromium()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _no_browser("the playwright Python package is not installed")
    from hopperlab.results.machines import compare, descriptions, runs
    from hopperlab.results.report import build_report

    _, report = build_report(folders[0])
    groups = runs.load_folders(list(folders))
    descs = descriptions.load_descriptions(REPO / "configs" / "machines")
    _, machines = compare.compare(groups, tmp_path / "out", descriptions=descs, targets=[GH200])
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1200})
            page.goto(report.as_uri())
            page.locator("details.fold > summary").first.wait_for(timeout=20_000)
            page.evaluate("document.querySelectorAll('details.fold').forEach(d => d.open = true)")
            page.locator("table.energy th", has_text="training tokens per joule").first.wait_for(
                timeout=20_000)
            assert page.locator('img[alt="power over the measured window per run"]').count() >= 1
            page.goto(machines.as_uri())
            # the tables fold below the page's verdict: a reader opens them
            page.locator("details.fold > summary").first.wait_for(timeout=20_000)
            page.evaluate("document.querySelectorAll('details.fold').forEach(d => d.open = true)")
            page.get_by_text("x less energy per unit").first.wait_for(timeout=20_000)
            page.get_by_text("training tokens per joule").first.wait_for(timeout=20_000)
            page.get_by_text("(PREDICTION, upper bound)").first.wait_for(timeout=20_000)
        finally:
            browser.close()


def test_hopperlab_predict_prints_the_energy_line(folders, capsys):
    from hopperlab.cli.main import main

    rc = main(["--root", str(REPO), "predict", str(folders[0]), "--machine", "gh200-96gb"])
    out = capsys.readouterr().out
    assert rc == 0
    line = next(ln for ln in out.splitlines() if "energy:" in ln and "training tokens" in ln)
    assert "(PREDICTION, upper bound)" in line and "P_module = 1000 W" in line


@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
def test_mlflow_gets_the_energy_metrics_and_the_power_trace(tmp_path):
    """A run measured through the meter (replayed GPUs) uploaded to a SQLite MLflow store: the
    energy figures are metrics, the trace and windows are artifacts."""
    import mlflow

    from hopperlab.core.rundir import Recorder, write_json_atomic
    from hopperlab.results import tracking
    from hopperlab.run.runner import ENERGY_WINDOWS, POWER_TRACE, attach_energy
    from tests.node.test_energy import Clock, ReplayGpus, _measure
    from tests.results.test_tracking import all_artifacts

    from hopperlab.node.energy.meter import EnergyMeter

    run_dir = tmp_path / "results" / "finetune" / "lora-llama2-7b" / "baseline"
    write_json_atomic(run_dir / "spec.json", {
        "family": "finetune", "experiment": "lora-llama2-7b", "variant": "baseline",
        "scale": "full", "knobs": {}, "params": {}, "resources": {"gpus": 1}})
    rec = Recorder(run_dir, identity={"key": "finetune/lora-llama2-7b/baseline",
                                      "family": "finetune", "experiment": "lora-llama2-7b",
                                      "variant": "baseline"})
    rec.log_step(0, loss=1.0)
    clock = Clock()
    attach_energy(rec, _measure(EnergyMeter(ReplayGpus(clock, [600.0]), None, clock=clock),
                                clock, 2.5))
    rec.finish("ok")
    uri = f"sqlite:///{tmp_path / 'ml' / 'mlflow.db'}"
    run_id = tracking.upload_run(run_dir, uri)
    client = mlflow.MlflowClient(uri)
    run = client.get_run(run_id)
    assert run.data.metrics["energy_gpu_j"] == pytest.approx(1500.0)
    assert run.data.metrics["energy_window_s"] == pytest.approx(2.5)
    assert run.data.tags["energy.gpu"] == "counter"
    arts = all_artifacts(client, run_id)
    assert {f"artifacts/{POWER_TRACE}", f"artifacts/{ENERGY_WINDOWS}"} <= arts
