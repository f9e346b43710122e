"""References that know their noise (issue 29, part 2): the stated test's false-alarm and
detection rates on synthetic samples with known distributions (seeded: rates, not timings),
bad references and samples refused with a clear message, host-CPU keyed figures, and
``hopperlab references update`` + ``check`` (JUnit XML too) end to end on selftest runs."""

from __future__ import annotations

import json
import random
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from hopperlab.cli.main import main
from hopperlab.core import effects
from hopperlab.core.errors import SpecError
from hopperlab.core.stats import percentile, robust_spread
from hopperlab.results.machines import references as R

from tests.helpers import copy_project, edit_yaml, run_noisy

TRIALS = 1000


def _reference(rng: random.Random, spread: float, n: int = 20) -> R.Reference:
    xs = [100 * (1 + rng.gauss(0, spread)) for _ in range(n)]
    return R.Reference(percentile(xs, 50), source="synthetic", spread=robust_spread(xs), n=n)


def _check(rng: random.Random, refs: list[R.Reference], spread: float, slowdown: float,
           m: int) -> str:
    """One synthetic check: every metric a time (lower is better), ``m`` samples each, all
    slower by ``slowdown``; its verdict is its worst finding's."""
    verdicts = []
    for ref in refs:
        xs = [100 * (1 + slowdown) * (1 + rng.gauss(0, spread)) for _ in range(m)]
        e = effects.change(xs, ref.value, direction="lower", min_effect=ref.effect_floor,
                           old_spread=ref.spread, old_n=ref.n)
        verdicts.append(R._FROM_EFFECT[e.verdict])
    return R.overall(verdicts)


@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
@pytest.mark.parametrize("spread, m, metrics", [(0.02, 1, 5), (0.03, 3, 5), (0.005, 1, 20)])
def test_false_alarms_and_detection_of_a_10_percent_slowdown(spread, m, metrics):
    """A healthy node fails at most 1 check in 20; a 10 % slower one is caught in 19 of 20 or
    more; with the references themselves measured (20 samples) and so uncertain too."""
    rng = random.Random(2029 + m)
    healthy = slow = 0
    for _ in range(TRIALS):
        refs = [_reference(rng, spread) for _ in range(metrics)]
        healthy += _check(rng, refs, spread, 0.0, m) == R.REGRESSION
        slow += _check(rng, refs, spread, 0.10, m) == R.REGRESSION
    assert healthy / TRIALS <= 0.05, healthy
    assert slow / TRIALS >= 0.95, slow


def test_noise_wider_than_the_effect_is_inconclusive_not_a_regression():
    """10 % noise, one sample: a 10 % slower run is mostly 'inconclusive' (repeat to tell),
    and a healthy one almost never a regression."""
    rng = random.Random(7)
    outcomes = [_check(rng, [_reference(rng, 0.10)], 0.10, 0.10, 1) for _ in range(TRIALS)]
    healthy = [_check(rng, [_reference(rng, 0.10)], 0.10, 0.0, 1) for _ in range(TRIALS)]
    assert outcomes.count(R.INCONCLUSIVE) > outcomes.count(R.REGRESSION)
    assert healthy.count(R.REGRESSION) / TRIALS <= 0.03


def test_the_2026_11_26_false_alarm_is_gone_with_a_measured_reference():
    """recommender gpu read 1.051 ms against 0.808 (+-10 % band): a regression. Against a
    reference of that host's CPU it is judged on its own noise."""
    band = R.Reference(0.8081, -0.1, 0.1, "band")
    assert R.judge_value(1.051, band, "lower") == R.REGRESSION
    other_cpu = R.Reference(0.8081, source="x", spread=0.02, n=20, host_cpu="cpu A")
    same_cpu = R.Reference(1.04, source="x", spread=0.02, n=20, host_cpu="cpu B")
    refs = R.References("m", {"recommender/latency/gpu": {"lat_e2e_p50_ms": [other_cpu,
                                                                             same_cpu]}}, "f")
    j = R.judge_run("recommender", "recommender/latency/gpu", "ok", {"lat_e2e_p50_ms": 1.051},
                    refs, cpu="cpu B")
    assert j.verdict == R.PASS and j.findings[0].reference is same_cpu
    j = R.judge_run("recommender", "recommender/latency/gpu", "ok", {"lat_e2e_p50_ms": 1.051},
                    refs, cpu="cpu C")
    assert j.verdict == R.NO_REFERENCE and "follows the host CPU" in j.findings[0].detail
    # a figure the CPU does not drive is judged on any host
    link = R.References("m", {"membench/copy/h2d-pinned": {"gbps_at_largest": [R.Reference(
        55.0, source="x", spread=0.005, n=10, host_cpu="cpu A")]}}, "f")
    j = R.judge_run("membench", "membench/copy/h2d-pinned", "ok", {"gbps_at_largest": 13.6},
                    link, cpu="cpu C")
    assert j.verdict == R.REGRESSION and "x0.247" in j.findings[0].detail


@pytest.mark.parametrize("ref, words", [
    ({"value": 1.0, "source": "x"}, ["without spread", "references update"]),
    ({"value": 1.0, "n": 5, "source": "x"}, ["n: 5 without spread"]),
    ({"value": 1.0, "spread": 0.02, "n": 1, "source": "x"}, ["one sample has no spread"]),
    ({"value": float("nan"), "spread": 0.02, "n": 5}, ["not a finite number"]),
    ({"value": 1.0, "spread": -0.1, "n": 5}, ["spread is -0.1"]),
])
def test_bad_references_are_refused_with_a_clear_message(tmp_path, ref, words):
    path = tmp_path / "m1.yaml"
    path.write_text(yaml.safe_dump({"machine": "m1", "references": {
        "selftest/noise/noisy": {"value": ref}}}))
    with pytest.raises(SpecError) as info:
        R.load_references(path)
    msg = str(info.value)
    assert "m1.yaml: references.selftest/noise/noisy.value" in msg
    assert all(w in msg for w in words), msg


def test_bad_samples_say_what_is_wrong():
    ref = R.Reference(10.0, source="x", spread=0.02, n=10)
    f = R.judge_metric("selftest", "k", "value", [10.0, float("nan")], ref, "f")
    assert f.verdict == R.INCONCLUSIVE and "not finite" in f.detail
    with pytest.raises(ValueError, match="no spread known"):
        effects.change([1.0], [1.1], direction="lower")   # one sample each, nothing known


def _run(project: Path, results: str, seed: int, steps: int = 10) -> Path:
    run_noisy(project, results, seed=seed, steps=steps)
    return project / results


@pytest.mark.integration
def test_update_then_check_pass_and_a_slower_node_fails_with_junit(tmp_path, capsys):
    project = copy_project(tmp_path / "proj")
    refs = tmp_path / "refs"
    edit_yaml(project / "experiments/selftest.yaml",
              lambda d: d["experiments"]["noise"].update(repeats=9))
    ref_results = _run(project, "results-ref", seed=1)
    root = ["--root", str(project)]
    assert main([*root, "references", "update", str(ref_results), "--references",
                 str(refs)]) == 0
    written = yaml.safe_load((refs / "cpu-x86_64.yaml").read_text())
    entry = written["references"]["selftest/noise/noisy"]["value"]
    assert entry["n"] == 9 and 0.005 < entry["spread"] < 0.05
    # the minimum effect: at least NOISE_K x the noise, never below the 5 % worth reporting
    assert entry["min_effect"] >= max(0.05, effects.NOISE_K * entry["spread"]) - 1e-6
    assert "median of 9 repeats (reruns)" in entry["source"]
    assert "is one process per run, and a fresh process can differ" in capsys.readouterr().out

    healthy = _run(project, "results-ok", seed=2)
    capsys.readouterr()
    assert main([*root, "check", str(healthy), "--references", str(refs)]) == 0
    slow = _run(project, "results-slow", seed=3, steps=9)      # value 10 % lower (higher: better)
    junit = tmp_path / "check.xml"
    assert main([*root, "check", str(slow), "--references", str(refs), "--junit",
                 str(junit)]) == 1
    out = capsys.readouterr().out
    assert "REGRESSION cpu-x86_64 selftest/noise/noisy value: value 9" in out
    suite = ET.parse(junit).getroot()
    assert suite.get("failures") == "1"
    assert suite.find("testcase/failure").get("type") == "regression"


@pytest.mark.integration
def test_update_refuses_runs_measured_once(tmp_path, capsys):
    project = copy_project(tmp_path / "proj")
    edit_yaml(project / "experiments/selftest.yaml",
              lambda d: d["experiments"]["noise"].update(repeats=1))
    results = _run(project, "results-once", seed=1)
    code = main(["--root", str(project), "references", "update", str(results),
                 "--references", str(tmp_path / "refs")])
    captured = capsys.readouterr()
    assert code == 2
    assert "1 sample(s); a reference needs 3 or more" in captured.out
    assert "no reference written" in captured.err
    assert json.loads((results / "selftest/noise/noisy/metrics.json").read_text())["status"] == "ok"


def test_update_keeps_other_host_cpus_and_replaces_its_own(tmp_path):
    """A CPU-driven figure gets one reference per host CPU; a rerun on a CPU replaces that
    CPU's, an older band without a CPU is dropped for it, other CPUs' stay; the file loads."""
    from hopperlab.results.machines.reference_update import _dump, _merge

    band = {"value": 0.81, "lower": -0.1, "upper": 0.1, "source": "band"}
    a = {"value": 1.0, "spread": 0.02, "n": 10, "source": "a", "host_cpu": "cpu A"}
    b = {"value": 1.3, "spread": 0.03, "n": 10, "source": "b", "host_cpu": "cpu B"}
    merged = _merge(_merge(band, a), b)
    assert [m["source"] for m in merged] == ["a", "b"]
    a2 = dict(a, value=1.1, source="a2")
    merged = _merge(merged, a2)
    assert [m["source"] for m in merged] == ["b", "a2"]
    path = tmp_path / "m1.yaml"
    path.write_text(_dump("m1", {"recommender/latency/gpu": {"lat_e2e_p50_ms": merged}}))
    refs = R.load_references(path).candidates("recommender/latency/gpu")["lat_e2e_p50_ms"]
    assert [r.host_cpu for r in refs] == ["cpu B", "cpu A"] and refs[1].value == 1.1


@pytest.mark.integration
def test_update_from_several_folders_takes_one_sample_per_process(tmp_path, capsys):
    """`references update A B C`: each folder's run is one process, reduced to its median; the
    reference's spread and minimum effect are those between the processes (windows inside one
    process did not sample it: 2026-11-28, TPC-H host-pinned q6)."""
    project = copy_project(tmp_path / "proj")
    refs, root = tmp_path / "refs", ["--root", str(project)]
    folders = []
    for seed, steps in ((1, 10), (2, 10), (3, 11)):   # the third process reads about 10 % more
        run_noisy(project, f"results-{seed}", seed=seed, steps=steps, repeats=3)
        folders.append(project / f"results-{seed}")
    medians = []
    for f in folders:
        lines = (f / "selftest/noise/noisy/samples.jsonl").read_text().splitlines()
        samples = [json.loads(line)["metrics"]["value"] for line in lines]
        assert len(samples) == 3
        medians.append(percentile(samples, 50))
    assert main([*root, "references", "update", *map(str, folders[:2]), "--references",
                 str(refs)]) == 2
    assert "2 sample(s); a reference needs 3 or more: it ran in 2 of the 2 folders" in \
        capsys.readouterr().out
    assert main([*root, "references", "update", *map(str, folders), "--references",
                 str(refs)]) == 0
    assert "note:" not in capsys.readouterr().out      # independent processes: nothing to add
    entry = yaml.safe_load((refs / "cpu-x86_64.yaml").read_text())[
        "references"]["selftest/noise/noisy"]["value"]
    assert entry["n"] == 3
    assert entry["value"] == pytest.approx(percentile(medians, 50), rel=1e-5)
    assert entry["spread"] == pytest.approx(robust_spread(medians), rel=1e-3)
    assert entry["min_effect"] == pytest.approx(effects.min_effect_for(medians), rel=1e-3)
    assert entry["min_effect"] >= max(medians) / percentile(medians, 50) - 1 - 1e-6
    assert "median of 3 independent runs (one process each" in entry["source"]
    assert all(f"{f.name}/selftest/noise/noisy" in entry["source"] for f in folders)
    assert main([*root, "references", "update", str(folders[0]), str(folders[0]),
                 "--references", str(refs)]) == 2
    assert "given twice" in capsys.readouterr().err


def test_a_run_its_submitter_stopped_is_inconclusive_a_failed_or_hung_one_a_regression():
    """2026-12-02: a fresh run stopped by the call's deadline (the submitter got SIGTERM) read
    REGRESSION with no figure; it measured nothing of the node. A job that failed or ran past
    its time limit on the node still fails the check."""
    refs = R.References("m", {"inference/kv-cache/resident": {"ttft_ms_p50": [R.Reference(
        39.3, source="x", spread=0.08, n=3)]}}, "f")

    def verdict(status: str, reason: str | None) -> R.Judgement:
        return R.judge_run("inference", "inference/kv-cache/resident", status, {}, refs,
                           reason=reason)

    stopped = verdict("failed", "the submitting process got SIGTERM; job 4711 stopped")
    assert stopped.verdict == R.INCONCLUSIVE
    assert "not measured, run it again" in stopped.findings[0].detail
    assert verdict("failed", "RuntimeError: CUDA error").verdict == R.REGRESSION
    assert verdict("timeout", "time limit reached (scheduler state TIMEOUT)").verdict \
        == R.REGRESSION
    assert verdict("failed", None).verdict == R.REGRESSION
