"""Crossovers (results/report/crossovers.py): two techniques' lines against a sweep's axis, and
in words whether they cross beyond the noise or within it."""

from __future__ import annotations

import json
from pathlib import Path

from hopperlab.results.report import crossovers as C
from hopperlab.results.rows import collect_runs


def _line(name: str, values: list[tuple[float, float, float]]) -> C.Series:
    """(x, y, half-width of its 95 % interval) per point."""
    return C.Series(name, "tokens_per_s", "micro_batch", points=[
        C.Point(x, y, y - h, y + h) for x, y, h in values])


def test_lines_that_cross_beyond_the_noise_say_so_with_the_interval():
    # baseline is faster at micro_batch 1, slower at 4; the intervals are far apart at both
    a = _line("baseline", [(1, 100.0, 2.0), (4, 60.0, 2.0)])
    b = _line("offload", [(1, 70.0, 2.0), (4, 90.0, 2.0)])
    [c] = C.crossings(a, b)
    assert c.beyond is True and (c.x_before, c.x_after) == (1, 4)
    s = c.sentence()
    assert "baseline and offload cross on tokens_per_s between micro_batch 1 and 4" in s
    assert f"{100 / 70:.2f}x offload [98, 102] against [68, 72]" in s
    assert s.endswith("beyond the noise (the 95 % intervals are apart at both)")


def test_lines_that_cross_within_the_noise_say_that_instead():
    # they change order too, but at micro_batch 4 the intervals overlap
    a = _line("baseline", [(1, 100.0, 2.0), (4, 80.0, 5.0)])
    b = _line("offload", [(1, 70.0, 2.0), (4, 82.0, 5.0)])
    [c] = C.crossings(a, b)
    assert c.beyond is False
    assert "within the noise (the 95 % intervals overlap at one of them)" in c.sentence()


def test_lines_that_keep_their_order_do_not_cross_and_one_sample_cannot_tell():
    a = _line("baseline", [(1, 100.0, 2.0), (2, 90.0, 2.0), (4, 80.0, 2.0)])
    b = _line("offload", [(1, 70.0, 2.0), (2, 60.0, 2.0), (4, 50.0, 2.0)])
    assert C.crossings(a, b) == []
    once = [C.Series("baseline", "m", "x", points=[C.Point(1, 2.0), C.Point(2, 1.0)]),
            C.Series("offload", "m", "x", points=[C.Point(1, 1.0), C.Point(2, 2.0)])]
    [c] = C.crossings(*once)
    assert c.beyond is None and "1 sample each" in c.sentence()


def _run(root: Path, variant: str, batch: int, status: str, tps: float | None) -> None:
    folder = root / "finetune" / "lora-sweep" / variant
    folder.mkdir(parents=True)
    metrics = {} if tps is None else {"tokens_per_s": tps, "tokens_per_s_n": 5,
                                      "tokens_per_s_ci_low": tps * 0.98,
                                      "tokens_per_s_ci_high": tps * 1.02,
                                      "peak_gpu_allocated_gib": 10.0 * batch}
    (folder / "record.json").write_text(json.dumps({"status": status, "metrics": metrics}))
    (folder / "spec.json").write_text(json.dumps({
        "baseline": "baseline.micro_batch-1", "params": {"micro_batch": batch},
        "headline_metrics": ["tokens_per_s", "peak_gpu_allocated_gib"]}))


def test_the_report_section_reads_the_sweep_off_run_directories(tmp_path):
    for batch, base, off in ((1, 100.0, 70.0), (2, 95.0, 85.0), (4, 60.0, 90.0)):
        _run(tmp_path, f"baseline.micro_batch-{batch}", batch, "ok", base)
        _run(tmp_path, f"offload.micro_batch-{batch}", batch, "ok", off)
    _run(tmp_path, "baseline.micro_batch-8", 8, "oom", None)
    runs = collect_runs(tmp_path)
    series = C.series_of(runs, "tokens_per_s")["micro_batch"]
    baseline = next(s for s in series if s.technique == "baseline")
    assert [p.x for p in baseline.points] == [1, 2, 4, 8]
    assert baseline.points[-1].y is None and baseline.points[-1].status == "oom"
    [c] = [c for c in C.experiment_crossings(runs) if c.metric == "tokens_per_s"]
    assert (c.x_before, c.x_after, c.beyond) == (2, 4, True)
    html = C.crossover_section(runs, charts=False)
    assert "baseline and offload cross on tokens_per_s between micro_batch 2 and 4" in html


def test_the_report_draws_each_metric_against_the_axis(tmp_path):
    from hopperlab.results.report import build_report

    for batch, base, off in ((1, 100.0, 70.0), (4, 60.0, 90.0)):
        _run(tmp_path, f"baseline.micro_batch-{batch}", batch, "ok", base)
        _run(tmp_path, f"offload.micro_batch-{batch}", batch, "ok", off)
    _, report = build_report(tmp_path)
    page = report.read_text()
    assert 'alt="tokens_per_s against micro_batch"' in page
    assert 'alt="peak_gpu_allocated_gib against micro_batch"' in page
    assert "beyond the noise" in page
