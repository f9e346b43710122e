"""summary.csv and report.html built from real run directories written by record.Recorder."""

from __future__ import annotations

import csv
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest

from hopperlab.core import rundir as record
from hopperlab.results.report import build_report
from hopperlab.results.rows import collect_runs

HOST_A = {
    "hostname": "gh-node01", "cpu_model": "NVIDIA Grace", "cpu_arch": "aarch64",
    "cpu_cores": 72, "mem_total_gb": 480.0, "gpu_model": "NVIDIA GH200 480GB",
    "gpu_count": 1, "gpu_memory_gb": 96.0, "driver": "560.35.03", "host_link": "NVLink-C2C",
}
# A second host that recorded only part of its fingerprint: the missing keys show as a dash.
HOST_B = {"hostname": "x86-node07", "cpu_arch": "x86_64", "gpu_model": "NVIDIA H100 80GB HBM3",
          "host_link": "PCIe Gen5 x16"}

HEADLINE = ["h2d_gbps_peak", "d2h_gbps_peak"]


def _spec(family: str, experiment: str, variant: str, *, baseline: str,
          headline: list[str], knobs: dict) -> dict:
    return {
        "family": family, "experiment": experiment, "variant": variant, "scale": "smoke",
        "baseline": baseline, "knobs": knobs, "params": {"sizes_mb": [64, 256]},
        "resources": {"gpus": 1, "time_min": 10}, "headline_metrics": headline,
    }


def _run(results: Path, family: str, experiment: str, variant: str, *, status: str,
         metrics: dict[str, float], reason: str | None = None, hardware: dict | None = None,
         baseline: str = "pageable", headline: list[str] | None = None, attempt: int = 1,
         steps: int = 3, run_dir: Path | None = None) -> Path:
    run_dir = run_dir or results / family / experiment / variant
    record.write_json_atomic(run_dir / record.SPEC_FILE, _spec(
        family, experiment, variant, baseline=baseline,
        headline=HEADLINE if headline is None else headline, knobs={"memory": variant}))
    identity = {"key": f"{family}/{experiment}/{variant}", "family": family,
                "experiment": experiment, "variant": variant}
    rec = record.Recorder(run_dir, identity=identity, attempt=attempt)
    rec.hardware = dict(hardware if hardware is not None else HOST_A)
    for step in range(steps):
        rec.log_step(step, gbps=10.0 + step)
    rec.log_metrics(metrics)
    rec.set_tag("membench.target", "cuda")
    rec.finish(status, reason)  # type: ignore[arg-type]
    return run_dir


@pytest.fixture()
def results(tmp_path: Path) -> Path:
    res = tmp_path / "results"
    _run(res, "membench", "copy", "pageable", status="ok",
         metrics={"h2d_gbps_peak": 12.5, "d2h_gbps_peak": 13.0, "h2d_gbps_64mb": 11.0})
    pinned = _run(res, "membench", "copy", "pinned", status="ok", attempt=2,
                  metrics={"h2d_gbps_peak": 25.0, "d2h_gbps_peak": 26.3, "h2d_gbps_64mb": 22.0})
    # An archived first attempt of "pinned": never a run of its own.
    _run(res, "membench", "copy", "pinned", status="failed", reason="archived attempt",
         metrics={"h2d_gbps_peak": 999.0}, run_dir=pinned / "attempts" / "1")
    _run(res, "membench", "copy", "pinned-huge", status="oom",
         reason="CUDA out of memory: tried to allocate 96.00 GiB", metrics={"h2d_gbps_64mb": 21.0})
    managed = _run(res, "membench", "copy", "managed", status="failed",
                   reason="RuntimeError: <boom> & \"quoted\"", metrics={}, hardware=HOST_B)
    assert not (managed / record.METRICS_FILE).exists()  # a failed run leaves no Snakemake output
    (managed / record.TRACEBACK_FILE).write_text("Traceback ...\n")
    # An experiment without headline metrics whose baseline did not succeed.
    _run(res, "membench", "alloc", "caching", status="skipped", reason="no CUDA device",
         metrics={}, baseline="caching", headline=[], hardware=HOST_B)
    _run(res, "membench", "alloc", "expandable", status="ok", baseline="caching", headline=[],
         metrics={"alloc_us_p50": 4.0, "alloc_us_p99": 9.5})
    # Not runs: a folder without a record, and a stray file.
    (res / "membench" / "copy" / "not-started").mkdir()
    (res / "membench" / "copy" / "not-started" / "spec.json").write_text("{}")
    (res / "membench" / "README").write_text("x")
    return res


class _StrictParser(HTMLParser):
    """Fails on unbalanced tags (void elements aside)."""

    VOID = {"meta", "img", "br", "hr", "link", "input", "col", "source", "wbr"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.text: list[str] = []
        self.imgs: list[str] = []
        self.errors: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag == "img":
            self.imgs.append(dict(attrs).get("src", ""))
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if tag in self.VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
            return
        self.stack.pop()

    def handle_data(self, data):
        self.text.append(data)


def _parse(text: str) -> _StrictParser:
    parser = _StrictParser()
    parser.feed(text)
    parser.close()
    assert not parser.errors, parser.errors[:5]
    assert parser.stack == [], parser.stack
    return parser


def test_collect_runs_ignores_attempts_and_recordless_dirs(results: Path) -> None:
    runs = collect_runs(results)
    assert [r.key for r in runs] == [
        "membench/alloc/caching", "membench/alloc/expandable",
        "membench/copy/managed", "membench/copy/pageable",
        "membench/copy/pinned", "membench/copy/pinned-huge",
    ]
    by = {r.variant: r for r in runs}
    assert by["pinned"].attempt == 2 and by["pinned"].metrics["h2d_gbps_peak"] == 25.0
    assert by["managed"].status == "failed"  # from record.json alone
    assert by["managed"].reason == 'RuntimeError: <boom> & "quoted"'
    assert by["managed"].hostname == "x86-node07" and by["managed"].cpu_model is None
    assert by["pageable"].is_baseline and by["pageable"].scale == "smoke"
    assert by["pageable"].headline_metrics == tuple(HEADLINE)
    assert by["pageable"].gpu_model == "NVIDIA GH200 480GB"
    assert by["pageable"].host_link == "NVLink-C2C" and by["pageable"].cpu_arch == "aarch64"
    assert by["pageable"].run_dir == results / "membench" / "copy" / "pageable"
    assert isinstance(by["pageable"].duration_s, float)


def test_summary_csv(results: Path) -> None:
    summary, report = build_report(results)
    assert summary == results / "summary.csv" and report == results / "report.html"
    with open(summary, newline="") as fh:
        reader = csv.DictReader(fh)
        header = reader.fieldnames
        rows = list(reader)
    metrics = ["alloc_us_p50", "alloc_us_p99", "d2h_gbps_peak", "h2d_gbps_64mb", "h2d_gbps_peak"]
    assert header == [
        "family", "experiment", "variant", "attempt", "status", "reason", "scale", "hostname",
        "gpu_model", "cpu_arch", "host_link", "duration_s", "setup_s", "compared_to", "machine",
        "reference_check", "correctness", "correctness_deviation", "correctness_detail",
        *metrics, *(m + "_vs_baseline" for m in metrics),
    ]  # setup_s (every record with a step has it) is a column, never a compared metric
    assert [(r["experiment"], r["variant"], r["status"]) for r in rows] == [
        ("alloc", "caching", "skipped"), ("alloc", "expandable", "ok"),
        ("copy", "managed", "failed"), ("copy", "pageable", "ok"),
        ("copy", "pinned", "ok"), ("copy", "pinned-huge", "oom"),
    ]
    by = {r["variant"]: r for r in rows}
    pinned, base, huge, managed = by["pinned"], by["pageable"], by["pinned-huge"], by["managed"]

    assert pinned["attempt"] == "2" and pinned["scale"] == "smoke"
    assert pinned["hostname"] == "gh-node01" and pinned["host_link"] == "NVLink-C2C"
    assert float(pinned["h2d_gbps_peak"]) == 25.0
    assert float(pinned["h2d_gbps_peak_vs_baseline"]) == 25.0 / 12.5 == 2.0
    assert float(pinned["d2h_gbps_peak_vs_baseline"]) == 26.3 / 13.0
    assert float(pinned["h2d_gbps_64mb_vs_baseline"]) == 22.0 / 11.0
    assert pinned["alloc_us_p50"] == "" and pinned["alloc_us_p50_vs_baseline"] == ""

    assert float(base["h2d_gbps_peak_vs_baseline"]) == 1.0
    assert float(base["duration_s"]) >= 0.0
    assert 0.0 <= float(base["setup_s"]) <= float(base["duration_s"]) + 1.0
    # An oom run keeps what it measured before running out; its ratio is against the baseline.
    assert huge["h2d_gbps_peak"] == "" and huge["h2d_gbps_peak_vs_baseline"] == ""
    assert float(huge["h2d_gbps_64mb_vs_baseline"]) == 21.0 / 11.0
    assert huge["reason"] == "CUDA out of memory: tried to allocate 96.00 GiB"

    assert managed["reason"] == 'RuntimeError: <boom> & "quoted"'
    assert managed["gpu_model"] == "NVIDIA H100 80GB HBM3" and managed["cpu_arch"] == "x86_64"
    assert all(managed[m] == "" and managed[m + "_vs_baseline"] == "" for m in metrics)

    # The alloc baseline was skipped: no ratios for that experiment, values still there.
    assert float(by["expandable"]["alloc_us_p99"]) == 9.5
    assert by["expandable"]["alloc_us_p99_vs_baseline"] == ""


def test_zero_baseline_gives_empty_ratio(tmp_path: Path) -> None:
    res = tmp_path / "results"
    _run(res, "f", "e", "pageable", status="ok", metrics={"x": 0.0, "y": 2.0})
    _run(res, "f", "e", "b", status="ok", metrics={"x": 3.0, "y": 3.0})
    summary, _ = build_report(res)
    with open(summary, newline="") as fh:
        rows = {r["variant"]: r for r in csv.DictReader(fh)}
    assert rows["b"]["x_vs_baseline"] == "" and float(rows["b"]["y_vs_baseline"]) == 1.5


@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
def test_report_html(results: Path) -> None:
    _, report = build_report(results)
    text = report.read_text()
    parser = _parse(text)
    visible = " ".join(parser.text)

    assert text.startswith("<!DOCTYPE html>")
    assert "http://" not in text and "https://" not in text
    assert "<script" not in text and "<link" not in text
    assert "6 runs" in visible
    assert "set-up s" in visible
    for variant in ("pageable", "pinned", "pinned-huge", "managed", "caching", "expandable"):
        assert variant in visible
    for status in ("ok", "oom", "failed", "skipped"):
        assert f">{status}</span>" in text
    assert "archived attempt" not in visible and "999" not in visible
    # Text from records is escaped, and shows as written.
    assert "<boom>" not in text and "&lt;boom&gt;" in text
    assert 'RuntimeError: <boom> & "quoted"' in visible
    assert "CUDA out of memory: tried to allocate 96.00 GiB" in visible

    # Charts: copy has two headline metrics, alloc falls back to its common metrics (two).
    pngs = [src for src in parser.imgs if src.startswith("data:image/png;base64,")]
    assert len(pngs) == len(parser.imgs) == 4
    import base64
    for src in pngs:
        assert base64.b64decode(src.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"
    assert "h2d_gbps_peak" in visible and "d2h_gbps_peak" in visible
    assert "alloc_us_p50" in visible and "No headline metrics declared" in visible

    # Hardware: one row per distinct host, missing keys as a dash.
    for value in ("gh-node01", "NVIDIA Grace", "aarch64", "72", "480 GB", "96 GB",
                  "560.35.03", "NVLink-C2C", "x86-node07", "NVIDIA H100 80GB HBM3",
                  "PCIe Gen5 x16"):
        assert value in visible
    hw = text.split("<h2>Hardware</h2>", 1)[1].split("</table>", 1)[0]
    assert hw.count("<tr>") == 3  # header + two hosts
    assert "\u2014" in hw


def test_report_is_rebuilt_atomically(results: Path) -> None:
    build_report(results)
    shutil.rmtree(results / "membench" / "alloc")
    summary, report = build_report(results)
    assert ",alloc," not in summary.read_text() and "alloc_us_p50" not in summary.read_text()
    assert "expandable" not in report.read_text()
    assert not [p for p in results.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("exists", [True, False])
def test_empty_results(tmp_path: Path, exists: bool) -> None:
    res = tmp_path / "results"
    if exists:
        res.mkdir()
    summary, report = build_report(res)
    lines = summary.read_text().splitlines()
    assert len(lines) == 1 and lines[0].startswith("family,experiment,variant,attempt,status")
    text = report.read_text()
    _parse(text)
    assert "There are no runs" in text
    assert "data:image/png" not in text


def _compare_to(run_dir: Path, variant: str) -> None:
    """What a variant with ``compare_to: VARIANT`` leaves in its spec.json."""
    import json

    spec = json.loads((run_dir / record.SPEC_FILE).read_text())
    record.write_json_atomic(run_dir / record.SPEC_FILE, {**spec, "compare_to": variant})


def test_a_variant_is_compared_with_the_variant_it_names(tmp_path: Path) -> None:
    """LoRA-7B: fp8 (compiled) against bf16-compile (1.30x), not the eager baseline (1.77x)."""
    res = tmp_path / "results"
    for variant, speed in (("baseline", 800.0), ("bf16-compile", 1360.0), ("fp8", 1768.0)):
        run_dir = _run(res, "finetune", "lora", variant, status="ok", baseline="baseline",
                       headline=["tokens_per_s"], metrics={"tokens_per_s": speed})
    _compare_to(run_dir, "bf16-compile")
    summary, report = build_report(res)
    with open(summary, newline="") as fh:
        rows = {r["variant"]: r for r in csv.DictReader(fh)}
    assert float(rows["fp8"]["tokens_per_s_vs_baseline"]) == pytest.approx(1.3)
    assert rows["fp8"]["compared_to"] == "bf16-compile"
    assert float(rows["bf16-compile"]["tokens_per_s_vs_baseline"]) == pytest.approx(1.7)
    assert rows["bf16-compile"]["compared_to"] == "baseline"
    visible = " ".join(_parse(report.read_text()).text)
    assert "(vs bf16-compile)" in visible and "\u00d7 reference" in visible
    assert "1.3" in visible and "2.21" not in visible  # 1768 / 1360, not 1768 / 800


def test_a_reference_without_a_run_gives_no_ratio(tmp_path: Path) -> None:
    res = tmp_path / "results"
    _run(res, "finetune", "lora", "baseline", status="ok", baseline="baseline",
         metrics={"tokens_per_s": 1000.0})
    _compare_to(_run(res, "finetune", "lora", "fp8", status="ok", baseline="baseline",
                     metrics={"tokens_per_s": 1770.0}), "bf16-compile")
    summary, _ = build_report(res)
    with open(summary, newline="") as fh:
        rows = {r["variant"]: r for r in csv.DictReader(fh)}
    assert rows["fp8"]["tokens_per_s_vs_baseline"] == "" and rows["fp8"]["compared_to"] == "bf16-compile"


@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
def test_a_new_site_price_is_a_what_if_beside_the_recorded_one(tmp_path):
    """Issue 28 item 5: the price is no part of a run's fingerprint (a new price reruns
    nothing); issue 49: one run has one price, the one it recorded, so the report reads it and
    the site's price of now is a what-if in files of its own."""
    import csv as _csv
    import json as _json

    from tests.helpers import copy_project, edit_yaml, hopperlab

    project = copy_project(tmp_path / "project")
    run_dir = project / "results/selftest/faults/ok"
    run_dir.mkdir(parents=True)
    spec = {"family": "selftest", "experiment": "faults", "variant": "ok", "attempt": 1,
            "resources": {"gpus": 0, "nodes": 1}, "params": {}}
    (run_dir / "spec.json").write_text(_json.dumps(spec))
    rec = {**spec, "status": "ok", "reason": None, "duration_s": 3600.0,
           "metrics": {"value": 3.0, "cost_run": 0.1, "cost_rate_per_hour": 0.1},
           "tags": {"cost.currency": "USD"}}
    (run_dir / "record.json").write_text(_json.dumps(rec))
    edit_yaml(project / "configs/sites/local.yaml",
              lambda d: d.update(cost={"per_node_hour": 2.5, "currency": "EUR"}))
    out = hopperlab(["report", "--what-if-price", "--config", "families=selftest"], project)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = list(_csv.DictReader((project / "results/summary.csv").open()))
    assert float(rows[0]["cost_run"]) == pytest.approx(0.1), rows[0]
    rows = list(_csv.DictReader((project / "results/summary-what-if.csv").open()))
    assert float(rows[0]["cost_run"]) == pytest.approx(2.5), rows[0]
    assert "WHAT-IF" in (project / "results/report-what-if.html").read_text()
