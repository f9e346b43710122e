"""Repeats (issue 29, part 1): the statistics of repeated samples, and ``repeats: N`` honoured by
the runner and resolved from config, site, experiment and variant."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from hopperlab.config.matrix import load_matrix
from hopperlab.core.errors import SpecError
from hopperlab.core.rundir import read_samples
from hopperlab.core.stats import (
    aggregate_samples,
    median_ci_ranks,
    robust_spread,
    summarize,
)

from tests.helpers import copy_project, edit_yaml, hopperlab, snakemake


def test_median_interval_ranks_are_the_exact_binomial_ones():
    # n=9: [x2, x8] covers 1 - 2 * P(B(9, .5) <= 1) = 1 - 2 * 10/512
    assert median_ci_ranks(9) == (2, 8, pytest.approx(1 - 20 / 512))
    # n=20: [x6, x15], coverage 95.86 % (the textbook table)
    lo, hi, cov = median_ci_ranks(20)
    assert (lo, hi) == (6, 15) and cov == pytest.approx(0.9586, abs=1e-4)
    # below 6 no interval reaches 95 %: the range, with the coverage it really has
    assert median_ci_ranks(5) == (1, 5, 0.9375)


def test_median_interval_covers_the_true_median_as_often_as_it_says():
    """Deterministic check of coverage on synthetic samples with a known median (0)."""
    rng = random.Random(29)
    for n in (6, 10, 20):
        trials = 2000
        hits = 0
        for _ in range(trials):
            s = summarize([rng.lognormvariate(0, 0.5) for _ in range(n)])  # skewed, median 1
            hits += s.ci_low <= 1.0 <= s.ci_high
        assert hits / trials >= median_ci_ranks(n)[2] - 0.02


def test_summary_of_one_sample_and_bad_input():
    one = summarize([3.0])
    assert (one.median, one.ci_low, one.ci_high, one.n) == (3.0, 3.0, 3.0, 1)
    assert math.isnan(one.cv) and one.coverage == 0
    with pytest.raises(ValueError, match="not finite"):
        summarize([1.0, float("nan"), 2.0], "lat_ms")
    with pytest.raises(ValueError, match="no samples"):
        summarize([])
    assert math.isnan(robust_spread([1.0]))


def test_cv_and_robust_spread_on_known_noise():
    rng = random.Random(1)
    xs = [100 * (1 + rng.gauss(0, 0.03)) for _ in range(400)]
    assert summarize(xs).cv == pytest.approx(0.03, rel=0.15)
    assert robust_spread(xs) == pytest.approx(0.03, rel=0.15)
    assert robust_spread(xs[:20] + [1e6]) < 0.06  # one outlier does not move it


def test_aggregate_writes_the_stats_of_the_headline_metrics_only():
    samples = [{"a": 1.0, "b": 10.0}, {"a": 3.0, "b": 10.0}, {"a": 2.0, "b": float("nan")}]
    out = aggregate_samples(samples, ["a"])
    assert out["a"] == 2.0 and out["b"] == 10.0
    assert (out["a_ci_low"], out["a_ci_high"], out["a_n"]) == (1.0, 3.0, 3.0)
    assert out["a_cv"] == pytest.approx(0.5)
    assert "b_n" not in out and "b_ci_low" not in out


def _project(tmp_path: Path) -> Path:
    return copy_project(tmp_path / "proj")


def test_repeats_resolve_config_over_variant_over_experiment_over_site(tmp_path):
    project = _project(tmp_path)
    overrides = {"families": "selftest"}
    m = load_matrix(project, overrides)
    assert m.get("selftest/noise/noisy").repeats == 5       # the experiment's
    assert m.get("selftest/trivial/ok").repeats == 1        # nobody says: 1
    assert "repeats" not in m.get("selftest/trivial/ok").to_dict()  # fingerprint unchanged
    assert load_matrix(project, {**overrides, "repeats": "3"}).get(
        "selftest/trivial/ok").repeats == 3
    edit_yaml(project / "configs/sites/local.yaml", lambda d: d.update(repeats={"smoke": 2,
                                                                               "full": 7}))
    edit_yaml(project / "experiments/selftest.yaml", lambda d: d["experiments"]["noise"][
        "variants"]["noisy"].update(repeats=4))
    m = load_matrix(project, overrides)
    assert m.get("selftest/trivial/ok").repeats == 2        # the site's at smoke
    assert m.get("selftest/noise/noisy").repeats == 4       # the variant's
    with pytest.raises(SpecError, match="repeats: '0' is not an integer >= 1"):
        load_matrix(project, {**overrides, "repeats": "0"})


@pytest.mark.integration
def test_selftest_honours_repeats_end_to_end(tmp_path):
    project = _project(tmp_path)
    out = hopperlab(["run", "selftest/noise/noisy", "--no-upload", "--config",
                     "families=selftest"], project)
    assert out.returncode == 0, out.stderr
    run_dir = project / "results/selftest/noise/noisy"
    record = json.loads((run_dir / "metrics.json").read_text())
    samples = read_samples(run_dir)
    assert len(samples) == 5 and record["tags"]["repeats"] == "5"
    values = [s["value"] for s in samples]
    m = record["metrics"]
    assert m["value"] == pytest.approx(sorted(values)[2])
    assert (m["value_ci_low"], m["value_ci_high"], m["value_n"]) == (min(values), max(values), 5)
    assert m["value_cv"] > 0
    steps = [json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines()]
    assert {s["repeat"] for s in steps} == set(range(5))


@pytest.mark.integration
def test_snakemake_config_repeats_reaches_the_job(tmp_path):
    """``snakemake --config repeats=3`` plans 3 and the job measures 3 (issue 38: the hand-kept
    list of forwarded keys left ``repeats`` out, and the job measured the experiment's 5)."""
    project = _project(tmp_path)
    out = snakemake(["--cores", "1", "--config", "families=selftest", "only=selftest/noise",
                     "repeats=3"], project)
    assert out.returncode == 0, out.stderr[-3000:]
    run_dir = project / "results/selftest/noise/noisy"
    record = json.loads((run_dir / "metrics.json").read_text())
    assert len(read_samples(run_dir)) == 3 and record["metrics"]["value_n"] == 3
    assert json.loads((run_dir / "spec.json").read_text())["repeats"] == 3


# --------------------------------------------------------------------------- energy's work done
def _measured(tmp_path: Path, family: str, workload, repeats: int = 3):
    """``repeats.measure`` over a stand-in entry: the run's recorder (its final metrics)."""
    from types import SimpleNamespace

    from hopperlab.core.rundir import Recorder
    from hopperlab.run.repeats import measure
    from hopperlab.workloads import family_info

    rec = Recorder(tmp_path / "run", identity={"family": family})
    measure(workload, SimpleNamespace(repeats=repeats, headline_metrics=()), rec,
            family_info(family))
    return rec


def test_reruns_sum_the_bytes_each_window_copied_not_their_median(tmp_path):
    """membench reruns: each rerun's window copied its own bytes; the meter adds the windows'
    joules, so the run's work done is the sum, and J per TB = every joule / every byte."""
    from hopperlab.config.energy import energy_figures
    from hopperlab.core import energy_names as N
    from hopperlab.workloads import family_info

    copied = iter([1.5, 2.0, 4.5])

    def rerun(spec, rec):
        rec.log_metrics({"measured_gb_copied": next(copied), "gbps_at_largest": 10.0})

    metrics = _measured(tmp_path, "membench", rerun).metrics
    assert metrics["measured_gb_copied"] == 8.0
    figures = energy_figures({**metrics, N.ENERGY_GPU_J: 80.0, N.ENERGY_WINDOW_S: 3.0},
                             family_info("membench").work_units)
    assert figures["energy_per_tb_copied_j"] == pytest.approx(80.0 / 8.0 * 1000)


def test_a_count_some_samples_lack_is_dropped_and_the_energy_goes_by_the_rate(tmp_path):
    """One rerun without its count (or with a NaN): the windows' total is unknown, and the
    median of the others would divide every window's joules by part of their work."""
    from hopperlab.config.energy import energy_basis
    from hopperlab.core import energy_names as N
    from hopperlab.workloads import family_info

    for missing in ({}, {"measured_gb_copied": math.nan}):
        copied = iter([{"measured_gb_copied": 2.0}, missing, {"measured_gb_copied": 2.0}])

        def rerun(spec, rec):
            rec.log_metrics({**next(copied), "gbps_at_largest": 10.0})

        rec = _measured(tmp_path / str(len(missing)), "membench", rerun)
        assert "measured_gb_copied" not in rec.metrics
        why = rec.tags[N.TAG_WORK_NOT_COUNTED]
        assert why.startswith("measured_gb_copied not counted in every one of the 3 samples")
        basis = energy_basis({**rec.metrics, N.ENERGY_GPU_J: 80.0, N.ENERGY_WINDOW_S: 3.0},
                             family_info("membench").work_units, None, why)
        assert basis.startswith("rate: ") and basis.endswith(why)


def test_windows_that_log_the_total_outside_their_samples_keep_it(tmp_path):
    """The database and recommender log every window's work once, after the windows, not in
    the samples: that total is the run's work done, left as it is."""
    from hopperlab.core import energy_names as N

    def windows(spec, rec):
        for w in range(spec.repeats):
            rec.add_sample({"q1_time_ms": 10.0 + w})
        rec.log_metrics({"measured_queries": 3 * 4.0, "measured_bytes_scanned": 3 * 4e9})

    rec = _measured(tmp_path, "database", windows)
    assert N.TAG_WORK_NOT_COUNTED not in rec.tags
    metrics = rec.metrics
    assert metrics["measured_queries"] == 12.0
    assert metrics["measured_bytes_scanned"] == 12e9
