"""Issue 36: the resampling study on the real H200 samples of the check subset (seeded, about
two seconds), and diagnostics that are never judged."""

from __future__ import annotations

import fnmatch
import json
from pathlib import Path

import pytest

from hopperlab.results.machines import references as R
from hopperlab.results.machines.resampling import study

FIXTURES = Path(__file__).parents[1] / "fixtures" / "noise-h200"


def _samples(folder: Path = FIXTURES) -> dict[str, list[dict[str, float]]]:
    return {"/".join(f.relative_to(folder).parts[:3]):
            [json.loads(line)["metrics"] for line in f.open()]
            for f in sorted(folder.glob("*/*/*/samples.jsonl"))}


@pytest.fixture(scope="module")
def result():
    return study(_samples(), draws=1000, n_ref=15, shift=0.10, seed=36)


def test_false_alarms_at_most_5_percent_per_run_and_subset(result):
    assert len(result.runs) == 6
    for key, r in result.runs.items():
        assert result.rate(r.false_alarms) <= 0.05, key
    assert result.rate(result.false_alarms) <= 0.05


def test_a_10_percent_shift_detected_in_95_percent_per_sensitive_run_and_subset(result):
    sensitive = {k for k, r in result.runs.items() if r.sensitive(result.draws)}
    # the GPU-bound figures (step time, throughput, link GB/s) must be sensitive
    assert {k for k in result.runs if not k.startswith("recommender/")} <= sensitive
    for key in sensitive:
        assert result.rate(result.runs[key].detections) >= 0.95, key
    assert result.rate(result.detections) >= 0.95


def test_the_host_cpu_latencies_are_reported_insensitive(result):
    # their noise (regimes of +-40 % within one run) sets a minimum effect above 10 %: the
    # study names them instead of counting a detection no check could make
    for key in ("recommender/latency/cpu-only", "recommender/latency/gpu"):
        assert not result.runs[key].sensitive(result.draws)
    assert any("insensitive" in line for line in result.lines())


def test_a_shift_below_the_minimum_effect_is_not_detected():
    small = study(_samples(), draws=200, n_ref=15, shift=0.02, seed=1)
    assert small.rate(small.detections) < 0.05


def test_diagnostics_are_never_judged(tmp_path):
    ref = {"value": 1.0, "spread": 0.01, "n": 10, "min_effect": 0.05}
    refs = tmp_path / "m.yaml"
    refs.write_text(json.dumps({"machine": "m", "references": {"finetune/lora/x": {
        "tokens_per_s": ref, "data_wait_fraction": ref, "loss_drop": ref}}}))
    loaded = R.load_references(refs)
    # the diagnostics are twice as bad as their reference; the throughput is as before
    j = R.judge_run("finetune", "finetune/lora/x", "ok",
                    {"tokens_per_s": 1.0, "data_wait_fraction": 2.0, "loss_drop": 0.5}, loaded)
    assert [f.metric for f in j.findings] == ["tokens_per_s"] and j.verdict == R.PASS
    assert not R.judged("finetune", "data_wait_fraction") and R.judged("finetune",
                                                                       "tokens_per_s")


def test_every_judged_metric_has_a_direction():
    from hopperlab.workloads import family_info

    for name in ("selftest", "database", "membench", "finetune", "inference", "recommender"):
        info = family_info(name)
        assert info.judged, name
        for pattern in info.judged:
            named = [m for m in info.directions if fnmatch.fnmatchcase(m, pattern)]
            assert named, f"{name}: {pattern} matches no metric with a direction"


def test_check_judges_the_shipped_2xh200_references(tmp_path):
    """``hopperlab check`` on the 2 x H200 runs: every run judged (none no-reference), all pass;
    the same runs 10 % slower on their judged metrics regress where the noise allows."""
    import shutil

    from hopperlab.results.rows import collect_runs

    refs = Path(__file__).parents[2] / "configs" / "references"
    rows = collect_runs(FIXTURES)
    judged = R.judge_rows(rows, refs)
    assert {r.machine for r in rows} == {"2xh200-141g-pcie5-x86_64"}
    assert sorted(r.reference_check for r in rows) == [R.PASS] * 6

    slow = tmp_path / "slow"
    shutil.copytree(FIXTURES, slow)
    for f in slow.glob("*/*/*/samples.jsonl"):
        key = "/".join(f.relative_to(slow).parts[:3])
        family = key.split("/")[0]
        lines = []
        for line in f.read_text().splitlines():
            row = json.loads(line)
            row["metrics"] = {m: (v * 1.1 if R.direction(family, m) == "lower" else v / 1.1)
                              for m, v in row["metrics"].items()}
            lines.append(json.dumps(row))
        f.write_text("\n".join(lines) + "\n")
    rows = collect_runs(slow)
    judged = R.judge_rows(rows, refs)
    verdicts = {r.key: r.reference_check for r in rows}
    assert all(v == R.REGRESSION for k, v in verdicts.items()
               if not k.startswith("recommender/")), verdicts
    # the recommender's latencies: below their minimum effect, never a regression
    assert all(verdicts[k] == R.PASS for k in verdicts if k.startswith("recommender/"))
    assert len(R.regressions(judged)) == 6  # 2 fine-tunes x 2 metrics, 2 copies


def test_an_inconclusive_finding_fails_only_a_strict_check(tmp_path, capsys):
    """A change past the minimum effect whose interval still holds no change: ``inconclusive``,
    printed, exit 0; ``--strict`` exits 1."""
    import shutil

    from hopperlab.cli.main import main

    run = tmp_path / "results" / "membench" / "copy" / "h2d-pinned"
    shutil.copytree(FIXTURES / "membench" / "copy" / "h2d-pinned", run)
    (run / "samples.jsonl").write_text(json.dumps({"repeat": 0, "metrics": {
        "gbps_at_largest": 50.0}}) + "\n")
    refs = tmp_path / "refs"
    refs.mkdir()
    # a noisy reference of 3 samples: 50 against 55.3 is 10 % (past 5 %) but not significant
    (refs / "2xh200-141g-pcie5-x86_64.yaml").write_text(
        "machine: 2xh200-141g-pcie5-x86_64\nreferences:\n  membench/copy/h2d-pinned:\n"
        "    gbps_at_largest: {value: 55.3, spread: 0.08, n: 3, min_effect: 0.05}\n")
    args = ["check", str(tmp_path / "results"), "--references", str(refs)]
    assert main(args) == 0
    assert "INCONCLUSIVE" in capsys.readouterr().out
    assert main([*args, "--strict"]) == 1
