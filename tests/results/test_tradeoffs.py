"""What each technique buys and costs (results/machines/tradeoffs.py), read off the shipped GPU
fixtures (tests/fixtures/machines: real runs on a lent H200 and 2 x H200): one sentence per
technique, on the report and on machines.html, before anything folded."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest

from hopperlab.results.machines import tradeoffs as T
from hopperlab.results.rows import collect_runs

REPO = Path(__file__).resolve().parents[2]
FIX = REPO / "tests" / "fixtures" / "machines"
LORA = ("finetune", "lora-llama2-7b")
SHARDED = ("finetune", "full-llama2-13b-sharded")


def _metrics(folder: Path, key: str) -> dict[str, float]:
    return json.loads((folder / key / "record.json").read_text())["metrics"]


def _by_variant(folder: Path, experiment: tuple[str, str]) -> dict[str, T.Tradeoff]:
    return {t.variant: t for t in T.tradeoffs(collect_runs(folder))[experiment]}


def test_lora_7b_offload_says_what_it_buys_and_costs():
    folder = FIX / "results-h200"
    t = _by_variant(folder, LORA)["offload-recompute"]
    new = _metrics(folder, "finetune/lora-llama2-7b/offload-recompute")
    old = _metrics(folder, "finetune/lora-llama2-7b/baseline")
    speed = new["tokens_per_s"] / old["tokens_per_s"]
    memory = new["peak_gpu_allocated_gib"] / old["peak_gpu_allocated_gib"]
    cost = new["cost_per_1m_train_tokens"] / old["cost_per_1m_train_tokens"]
    s = t.sentence()
    assert s.startswith("offload-recompute against baseline: ")
    assert f"{speed:.2f}x tokens_per_s (1 sample each)" in s
    assert f"{(memory - 1) * 100:+.0f} % GPU memory" in s
    assert f"{(cost - 1) * 100:+.0f} % price per 1M training tokens" in s
    assert "pays where memory is the limit" in s
    assert f"a batch up to {1 / memory:.1f}x larger fits" in s
    # a speed technique that frees nothing is not sold as a memory one
    fp8 = _by_variant(folder, LORA)["fp8"]
    assert fp8.against == "bf16-compile" and fp8.advice.startswith("pays: faster")


def test_the_13b_rows_are_compared_with_their_own_gpus_baseline(tmp_path):
    folder = tmp_path / "r"
    shutil.copytree(FIX / "results-2xh200-fresh", folder)
    t = _by_variant(folder, SHARDED)["fsdp2-offload"]
    assert t.against == "fsdp2"  # not the 1-GPU baseline its spec names, which is not here
    assert "fsdp2-offload-1gpu has no run here" in t.against_note
    new = _metrics(folder, "finetune/full-llama2-13b-sharded/fsdp2-offload")
    old = _metrics(folder, "finetune/full-llama2-13b-sharded/fsdp2")
    joules = new["energy_per_1m_train_tokens_j"] / old["energy_per_1m_train_tokens_j"]
    s = t.sentence()
    assert f"{(joules - 1) * 100:+.1f} % joules per unit" in s
    assert "frees memory" in s and "GPU memory" in s
    # and summary.csv's ratio column is filled (it read "—" when the reference was missing)
    from hopperlab.results.report import build_report

    summary, _ = build_report(folder)
    rows = {r["variant"]: r for r in csv.DictReader(summary.open())}
    assert rows["fsdp2-offload"]["compared_to"] == "fsdp2"
    ratio = float(rows["fsdp2-offload"]["tokens_per_s_vs_baseline"])
    assert ratio == pytest.approx(new["tokens_per_s"] / old["tokens_per_s"])


def _add_samples(run_dir: Path, metric: str, factors: list[float]) -> None:
    record = json.loads((run_dir / "record.json").read_text())
    value = record["metrics"][metric]
    with open(run_dir / "samples.jsonl", "w") as fh:
        for i, f in enumerate(factors):
            fh.write(json.dumps({"repeat": i, "metrics": {metric: value * f}}) + "\n")


def test_repeats_give_the_speed_its_interval(tmp_path):
    folder = tmp_path / "r"
    shutil.copytree(FIX / "results-h200", folder)
    spread = [0.98, 1.0, 1.02, 0.99, 1.01]
    for v in ("baseline", "offload-recompute"):
        _add_samples(folder / "finetune" / "lora-llama2-7b" / v, "tokens_per_s", spread)
    t = _by_variant(folder, LORA)["offload-recompute"]
    assert t.speed is not None and t.speed.low is not None and t.speed.high is not None
    assert t.speed.low < t.speed_times < t.speed.high
    assert f"[{t.speed.low:.2f}, {t.speed.high:.2f}]" in t.sentence()
    assert "1 sample each" not in t.sentence().split("GPU memory")[0]
    # at one rate the price per token is the rate over tokens/s: its interval is the speed's
    assert t.cost is not None and t.cost.ci == pytest.approx((1 / t.speed.high, 1 / t.speed.low))
    low, high = ((x - 1) * 100 for x in t.cost.ci)
    assert f"price per 1M training tokens [{low:+.0f}, {high:+.0f} %]" in t.sentence()


@pytest.mark.parametrize("speed, memory, words", [
    ("worse", 0.3, "pays where memory is the limit"),
    ("worse", 1.0, "does not pay here"),
    ("better", 1.0, "pays: faster"),
    ("better", 1.5, "pays where memory is spare"),
    ("same", 0.5, "pays: frees memory at no speed cost beyond the noise"),
    ("close", 0.5, "untested: repeat to tell"),
    ("same", 1.0, "no difference worth having"),
])
def test_the_advice_follows_speed_and_memory(speed, memory, words):
    mem = T.Change("peak_gpu_allocated_gib", memory, 1.0)
    assert words in T.advice(speed, mem, None)


def _lead(page: str) -> str:
    """The page up to its first folded section."""
    return page.split('<details class="fold">', 1)[0]


@pytest.mark.integration  # runs for seconds: builds the pages
def test_report_and_machines_lead_with_the_sentences(tmp_path):
    from html import escape

    from hopperlab.results.machines import compare, runs
    from hopperlab.results.report import build_report

    h200, multi = tmp_path / "h200", tmp_path / "multi"
    shutil.copytree(FIX / "results-h200", h200)
    shutil.copytree(FIX / "results-2xh200-fresh", multi)
    lora = _by_variant(h200, LORA)["offload-recompute"].sentence()
    sharded = _by_variant(multi, SHARDED)["fsdp2-offload"].sentence()
    _, report = build_report(h200)
    assert escape(lora) in _lead(report.read_text())
    _, report = build_report(multi)
    assert escape(sharded) in _lead(report.read_text())
    groups = runs.load_folders([h200, multi])
    _, machines = compare.compare(groups, tmp_path / "out")
    lead = _lead(machines.read_text())
    assert escape(lora) in lead and escape(sharded) in lead


@pytest.mark.timeout(180)
@pytest.mark.browser
def test_the_sentences_are_what_chromium_shows_first(tmp_path):
    from tests.results.test_mlflow_ui import CHROMIUM_ARGS, _chromium, _no_browser

    executable = _chromium()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _no_browser("the playwright Python package is not installed")
    from hopperlab.results.machines import compare, runs

    h200, multi = tmp_path / "h200", tmp_path / "multi"
    shutil.copytree(FIX / "results-h200", h200)
    shutil.copytree(FIX / "results-2xh200-fresh", multi)
    from hopperlab.results.report import build_report

    _, machines = compare.compare(runs.load_folders([h200, multi]), tmp_path / "out")
    reports = {"offload-recompute against baseline": build_report(h200)[1],
               "fsdp2-offload against fsdp2": build_report(multi)[1]}

    def first_on(page, text: str) -> None:
        item = page.locator("li.tradeoff", has_text=text).first
        item.wait_for(timeout=20_000)
        fold = page.locator("details.fold").first.bounding_box()
        box = item.bounding_box()
        assert box is not None and fold is not None and box["y"] < fold["y"]

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1200})
            for text, report in reports.items():
                page.goto(report.as_uri())
                first_on(page, text)
            page.goto(machines.as_uri())
            for text in reports:
                first_on(page, text)
            # everything below the lead is folded, not lost: a table opens on a click, and the
            # page opened whole is at least three times the height a reader first scrolls
            folded = page.evaluate("document.documentElement.scrollHeight")
            page.locator("details.fold > summary", has_text="lora-llama2-7b").first.click()
            page.get_by_text("tokens_per_s").first.wait_for(timeout=20_000)
            page.evaluate("document.querySelectorAll('details.fold').forEach(d => d.open = true)")
            opened = page.evaluate("document.documentElement.scrollHeight")
            assert 3 * folded <= opened, (folded, opened)
        finally:
            browser.close()


def test_a_technique_that_fits_where_its_baseline_ran_out_of_memory_says_so(tmp_path):
    folder = tmp_path / "r"
    shutil.copytree(FIX / "results-h200", folder)
    record = folder / "finetune" / "lora-llama2-7b" / "baseline" / "record.json"
    data = json.loads(record.read_text())
    data.update(status="oom", reason="CUDA out of memory", metrics={})
    record.write_text(json.dumps(data))
    s = _by_variant(folder, LORA)["offload-recompute"].sentence()
    assert s == ("offload-recompute against baseline: pays where memory is the limit: baseline "
                 "ran out of memory here, this fits")


def test_the_pareto_front_is_what_no_variant_beats_on_speed_and_memory():
    runs = [r for r in collect_runs(FIX / "results-h200") if (r.family, r.experiment) == LORA]
    front = T.pareto_front(runs, "tokens_per_s")
    figures = {r.variant: (r.metrics["tokens_per_s"], T.memory_bytes(r)[1]) for r in runs}

    def beats(a: str, b: str) -> bool:
        (sa, ma), (sb, mb) = figures[a], figures[b]
        return sa >= sb and ma <= mb and (sa, ma) != (sb, mb)

    assert front and len(front) < len(figures)
    for v in figures:
        assert (v in front) == (not any(beats(o, v) for o in figures)), v
    assert front == sorted(front, key=lambda v: -figures[v][0])  # fastest first
