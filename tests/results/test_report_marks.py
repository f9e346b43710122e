"""Pages that say what was measured and how sure it is (issue 28, items 13 and 14): CPU
stand-ins, example prices and one-sample ratios marked where they are shown, and the charts a
reader tripped on (equal bars, an outlier flattening the rest, dots instead of log-axis bars,
captions about things not drawn, ratio bars from zero, red for 0.999x, "0.87x cheaper", a floor
that does not bind, citations repeated in every prediction row, very tall skipped rows)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from hopperlab.core import rundir as record
from hopperlab.results.machines import compare
from hopperlab.results import marks
from hopperlab.results.report import build_report
from hopperlab.results.report.charts import scale_top

STAND_IN = "host memcpy in place of h2d copies: torch 2.13.0+cpu is a CPU-only build"


def _run(res: Path, variant: str, metrics: dict, *, status: str = "ok", tags: dict | None = None,
         reason: str | None = None, family: str = "membench", experiment: str = "copy",
         baseline: str = "pageable", headline: tuple = ("gbps",),
         compare_to: str | None = None) -> Path:
    run_dir = res / family / experiment / variant
    spec = {"family": family, "experiment": experiment, "variant": variant, "scale": "smoke",
            "baseline": baseline, "knobs": {}, "params": {}, "resources": {"gpus": 0},
            "headline_metrics": list(headline)}
    if compare_to:
        spec["compare_to"] = compare_to
    record.write_json_atomic(run_dir / record.SPEC_FILE, spec)
    rec = record.Recorder(run_dir, identity={"key": f"{family}/{experiment}/{variant}",
                                             "family": family, "experiment": experiment,
                                             "variant": variant})
    rec.hardware = {"hostname": "vm", "cpu_arch": "x86_64"}
    rec.log_step(0, gbps=1.0)
    rec.log_metrics(metrics)
    for k, v in (tags or {}).items():
        rec.set_tag(k, v)
    rec.finish(status, reason)  # type: ignore[arg-type]
    return run_dir


CPU = {"membench.target": "host", "membench.stand_in": STAND_IN, "cost.currency": "USD",
       "cost.example": "true"}


@pytest.fixture()
def report(tmp_path) -> str:
    res = tmp_path / "results"
    _run(res, "pageable", {"gbps": 10.0, "cost_run": 1e-5}, tags=CPU)
    _run(res, "pinned", {"gbps": 10.1, "cost_run": 1e-5}, tags=CPU)
    _run(res, "device", {}, status="skipped", reason="needs a CUDA device " * 8)
    _, html = build_report(res)
    return html.read_text()


def test_stand_ins_example_prices_and_one_sample_ratios_are_marked(report):
    assert report.count(f">{marks.STAND_IN}</span>") == 2          # both ok rows
    assert "cost of the run, its set-up included (example price)" in report
    assert "\u00b9</span>" in report and f"{marks.ONE_SAMPLE}: a ratio of two single runs" \
        in report
    assert f"{marks.STAND_IN}: 2 of the ok variants ran without a GPU" in report


def test_a_skipped_runs_reason_spans_its_row(report):
    assert '<tr class="why"><td></td><td colspan=' in report
    assert 'class="reason">needs a CUDA device' in report


def test_the_marks_come_from_the_record_not_the_name():
    gpu = SimpleNamespace(status="ok", tags={"finetune.gpu_measured": "true"}, metrics={})
    cpu = SimpleNamespace(status="ok", tags={"recommender.gpu_measured": "false"}, metrics={})
    db = SimpleNamespace(status="ok", tags={"database.target": "cpu",
                                            "database.no_gpu_reason": "no CUDA"}, metrics={})
    assert marks.stand_in(gpu) is None and marks.stand_in(cpu) == "no GPU was measured"
    assert marks.stand_in(db) == "no GPU was measured: no CUDA"
    repeated = SimpleNamespace(metrics={"x": 1.0, "x_n": 5.0})
    assert not marks.one_sample(repeated, repeated, "x") and marks.one_sample(gpu, repeated, "x")


def test_an_example_price_is_tagged_by_the_site():
    from hopperlab.config.cost import CostSpec
    from hopperlab.run import annotate
    spec = SimpleNamespace(family="selftest", params={}, site=SimpleNamespace(
        machine=None, cost=CostSpec(per_node_hour=0.1, example=True)),
        resources=SimpleNamespace(gpus=0, nodes=1))
    rec = annotate.annotate_record({"metrics": {}, "duration_s": 10.0, "hardware": {}}, spec)
    assert rec["tags"]["cost.example"] == "true"
    local = (Path(__file__).parents[2] / "configs/sites/local.yaml").read_text()
    assert "example: true" in local


def test_equal_values_are_a_sentence_not_a_chart(tmp_path):
    res = tmp_path / "results"
    for v in ("device", "pinned"):
        _run(res, v, {"all_correct": 1.0, "q1_time_ms": 2.0 if v == "device" else 3.0},
             family="database", experiment="tpch", baseline="device",
             headline=("q1_time_ms", "all_correct"))
    _, html = build_report(res)
    text = html.read_text()
    assert "all_correct: 1 for every ok variant (not charted)" in text
    assert 'alt="all_correct per variant"' not in text


def test_an_outlier_is_cut_and_labelled_not_flattening_the_rest():
    assert scale_top([0.05, 0.06, 0.04, 12.28]) == pytest.approx(0.09)
    assert scale_top([1.0, 1.5, 2.0]) is None
    from hopperlab.results.report.charts import Plotter
    runs = [SimpleNamespace(variant=v, status="ok", is_baseline=v == "baseline",
                            metrics={"step_time_p50_s": t})
            for v, t in (("baseline", 0.11), ("bf16-compile", 0.07), ("fp8", 12.28))]
    assert Plotter().bar_chart(runs, "step_time_p50_s")      # drawn, the fp8 bar cut


def test_the_caption_names_the_baseline_and_the_other_comparison(tmp_path):
    res = tmp_path / "results"
    for v, speed in (("baseline", 800.0), ("bf16-compile", 1360.0), ("fp8", 1768.0)):
        _run(res, v, {"tokens_per_s": speed}, family="finetune", experiment="lora",
             baseline="baseline", headline=("tokens_per_s",),
             compare_to="bf16-compile" if v == "fp8" else None)
    text = build_report(res)[1].read_text()
    assert "baseline baseline" not in text
    assert "the baseline variant, baseline; the table compares fp8 with bf16-compile" in text


def test_tpch_chart_draws_dots_and_captions_only_what_is_drawn():
    from hopperlab.workloads.database.charts import query_chart
    runs = [SimpleNamespace(variant=v, metrics={"q1_time_ms": t, "q1_correct": 1.0,
                                                "q1_duckdb_ms": 5.0})
            for v, t in (("device", 3.0), ("pageable", 12.0))]
    chart = query_chart(runs, "q1")
    ax = chart.figure.axes[0]
    assert not ax.patches and ax.get_ylabel() == ""           # no bars on the log axis
    assert "ms per query" in ax.get_title()
    assert "black ticks" not in chart.caption and "dashed: DuckDB" in chart.caption
    runs[1].metrics["q1_floor_ms"] = 11.0
    assert "black ticks" in query_chart(runs, "q1").caption


def test_energy_not_measured_anywhere_is_one_line(tmp_path):
    from hopperlab.results.report.energy import energy_section
    from hopperlab.results.rows import collect_runs
    res = tmp_path / "results"
    _run(res, "pageable", {"gbps": 1.0, "energy_window_s": 0.1},
         tags={"energy.gpu": "no GPU: not measured"})
    out = energy_section(collect_runs(res))
    assert out in ("", '<p class="note">Energy: not measured for any run (no GPU: not '
                       'measured).</p>')


def test_machines_page_words_and_marks(tmp_path):
    assert compare._better(0.999, 1.0, "higher") == "same"
    assert compare._better(0.95, 1.0, "higher") == "worse"
    assert compare._cheaper_text(0.87) == "costs 1.15x more per unit"
    assert compare._cheaper_text(1.25) == "1.25x cheaper per unit"
    cell = compare.Cell("b", "ok", 3.4, ratio=1.03, better="worse", floor=50.99,
                        over_floor=0.07, stand_in="no GPU", example_price=True, one_sample=True,
                        cost_run=0.1, currency="USD")
    html = compare._cell_html(cell, "a")
    assert "0.07x" not in html and "not a bound" in html
    assert marks.STAND_IN in html and marks.EXAMPLE_PRICE in html and marks.ONE_SAMPLE in html


def test_prediction_citations_are_listed_once():
    src = "NVIDIA H200 Tensor Core GPU product page (nvidia.com/en-us/data-center/h200/)"
    sources = compare._Sources()
    rows = [sources.inputs({"hbm_tbps S": f"4.8 ({src})", "t": "3.39"}) for _ in range(30)]
    assert all("[1]" in r and src not in r for r in rows)
    assert sources.listing().count(src) == 1


def test_machines_chart_starts_at_one(tmp_path):
    import base64
    import io

    from matplotlib.image import imread
    lines = [compare.Line("f", "e", "v", "t_ms", "lower",
                          [compare.Cell("a", "ok", 1.0, ratio=1.0),
                           compare.Cell("b", "ok", 1.05, ratio=1.05)])]
    png = compare._chart(lines, ["a", "b"], "a")
    assert imread(io.BytesIO(base64.b64decode(png))).shape[0] > 100


# -- issue 37, item 7: pages that say what they are --------------------------------------------
def _scope(page: str) -> str:
    start = page.index('<p class="scope">')
    return page[start:page.index("</p>", start)]


def test_report_says_at_its_top_what_it_holds_and_ranks_no_stand_in(tmp_path):
    res = tmp_path / "results"
    _run(res, "pageable", {"gbps": 10.0, "cost_run": 7.7e-05}, tags=CPU)
    _run(res, "pinned", {"gbps": 2650.0, "cost_run": 7.7e-05}, tags=CPU)  # 265x: a stand-in's
    _, html = build_report(res)
    page = html.read_text()
    top = _scope(page)
    assert page.index('<p class="scope">') < page.index("<h2>")        # before any section
    for said in ("scale smoke", f"2 of 2 ok run(s) are {marks.STAND_IN}s",
                 f"{marks.EXAMPLE_PRICE}s", "samples per run: 1"):
        assert said in top, (said, top)
    verdicts = page[page.index("<h2>Verdicts</h2>"):page.index('<ul class="toc">')]
    assert "265" not in verdicts and "faster" not in verdicts and "best" not in verdicts
    assert "not ranked" in verdicts
    assert "$0.000077" in page and "7.7e-05" not in page


def test_a_gpu_report_says_it_measured_gpus(tmp_path):
    res = tmp_path / "results"
    gpu = {"cost.currency": "USD"}
    _run(res, "pageable", {"gbps": 10.0}, tags=gpu)
    _run(res, "pinned", {"gbps": 25.0}, tags=gpu)
    page = build_report(res)[1].read_text()
    assert "every ok run measured a GPU" in _scope(page)
    assert marks.STAND_IN not in _scope(page)


def test_dearer_is_costs_more_and_dollars_are_plain():
    from hopperlab.core.stats import money
    from hopperlab.results.machines.cost import cheaper_words

    assert cheaper_words(1 / 1.06) == "costs 1.06x more"
    assert cheaper_words(1.25) == "1.25x cheaper"
    assert money(7.7e-05, "USD") == "$0.000077" and money(2.49, "USD") == "$2.49"
    assert money(0.0123, "CHF") == "0.012 CHF"


def test_machine_verdicts_never_rank_stand_ins_nor_say_cheaper_for_dearer():
    from hopperlab.results.machines.verdicts import machine_verdicts

    def line(stand_in: str | None) -> SimpleNamespace:
        ref = SimpleNamespace(machine="a", ratio=None, better="", cheaper=None, stand_in=None)
        other = SimpleNamespace(machine="b", ratio=0.8, better="worse", cheaper=1 / 1.06,
                                stand_in=stand_in)
        return SimpleNamespace(family="f", experiment="e", variant="v", direction="higher",
                               cells=[ref, other])

    real = machine_verdicts([line(None)], "a")["f"][0]
    assert "costs 1.06x more" in real and "cheaper" not in real
    stand = machine_verdicts([line("no GPU was measured")], "a")["f"]
    assert stand == [f"b: 1 run(s) with a {marks.STAND_IN} on either side (no GPU measured): "
                     "not ranked"]


def test_ratio_axes_start_at_zero():
    assert compare.ratio_axis([0.94, 1.04])[0] == 0.0
    assert compare.ratio_axis([0.94, 1.04])[1] > 1.04


def test_every_shipped_site_with_a_price_says_it_is_an_example():
    import yaml

    sites = Path(__file__).resolve().parents[2] / "configs/sites"
    priced = {p.name: yaml.safe_load(p.read_text()).get("cost") for p in sites.glob("*.yaml")}
    priced = {name: cost for name, cost in priced.items() if cost}
    assert {"gpu-node.yaml", "local.yaml"} <= set(priced)
    assert all(cost.get("example") is True for cost in priced.values()), priced


def test_compare_page_fills_b_over_a_on_inconclusive_rows_and_says_what_it_holds(tmp_path):
    from hopperlab.results.machines import ab, ab_page

    rows = [ab.Change("f/e/v", "gbps", ab.INCONCLUSIVE, 10.0, 10.49, 1, 1,
                      detail="x1.049; one sample")]
    _, page = ab_page.write(rows, tmp_path, "A", "B", 0.05, ["A (a): 1 run(s), 1 ok"])
    text = page.read_text()
    assert "x1.049 (no interval)" in text
    assert '<p class="scope"><b>What this page holds:</b> A (a): 1 run(s), 1 ok.</p>' in text


def test_history_headline_agrees_with_the_series_it_shows(tmp_path):
    from hopperlab.results.machines import history

    short = history.Series("m", "f/e/v", "value", "higher",
                           [history.Point(1.0, 10.0, "c1", "r1"),
                            history.Point(2.0, 14.9, "c2", "r2", stand_in=True)])
    assert history.headline([short]) == (
        "0 of 0 series with 6 or more runs changed beyond run-to-run noise; 1 series with "
        "fewer runs not tested (their moves are shown, not judged)")
    assert "(first to last +49 %)" in history.text_lines([short])[0]
    assert "not tested" in history.text_lines([short])[0]
    _, page = history.write([short], tmp_path)
    text = page.read_text()
    assert "0 of 1 series changed" not in text and "1 series with fewer runs not tested" in text
    assert f"1 of 2 runs are {marks.STAND_IN}s" in _scope(text)
