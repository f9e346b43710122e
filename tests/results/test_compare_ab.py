"""``hopperlab compare A B`` (issue 29, part 3): two results folders, or two MLflow queries on a
real server, per run and metric a verdict by the noise test, a page that leads with what
changed, and an exit status for CI. ``compare family/experiment`` still prints the MLflow view."""

from __future__ import annotations

import csv
import subprocess
from pathlib import Path

import pytest

from hopperlab.cli.main import main

from tests.helpers import REPO, copy_project, edit_yaml, hopperlab

FIX = REPO / "tests/fixtures/machines"


def _configure(project: Path, seed: int, steps: int = 10, repeats: int = 9) -> None:
    def change(d):
        d["experiments"]["noise"]["scales"]["smoke"]["params"].update(seed=seed, steps=steps)
        d["experiments"]["noise"]["repeats"] = repeats
    edit_yaml(project / "experiments/selftest.yaml", change)


def _run(project: Path, results: str, seed: int | None = None, steps: int = 10) -> Path:
    if seed is not None:
        _configure(project, seed, steps)
    out = hopperlab(["run", "selftest/noise/noisy", "--no-upload", "--config",
                     "families=selftest", f"results_dir={results}"], project)
    assert out.returncode == 0, out.stderr
    return project / results


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    return copy_project(tmp_path_factory.mktemp("ab") / "proj")


@pytest.mark.integration
def test_same_within_noise_then_a_slower_b_fails(project, tmp_path, capsys):
    a = _run(project, "results-a", seed=1)
    b = _run(project, "results-b", seed=2)
    root = ["--root", str(project)]
    assert main([*root, "compare", str(a), str(b), "--out", str(tmp_path / "same")]) == 0
    out = capsys.readouterr().out
    assert "no change, 1 metric(s) the same within noise" in out
    assert "No change beyond the noise." in (tmp_path / "same/compare.html").read_text()

    c = _run(project, "results-c", seed=3, steps=9)            # value 10 % lower: worse
    assert main([*root, "compare", str(a), str(c), "--out", str(tmp_path / "worse")]) == 1
    out = capsys.readouterr().out
    assert "WORSE          selftest/noise/noisy value 9" in out
    page = (tmp_path / "worse/compare.html").read_text()
    first = page.index("class='verdict bad'")
    assert "B is worse than A in 1 metric(s) (largest: selftest/noise/noisy value, 1" in page
    assert first < page.index("What changed") < page.index("Same within noise (0)")
    rows = list(csv.DictReader((tmp_path / "worse/compare.csv").open()))
    assert rows[0]["verdict"] == "worse" and float(rows[0]["ratio_high"]) < 0.95


def test_recorded_folders_measured_once_are_inconclusive_not_failures(tmp_path, capsys):
    """The 2026-11-24 H200 and H100 folders (one run each): ratios shown, no noise known;
    the runs the H100 folder lacks fail the comparison (issue 37: a CI gate lets no missing
    run through), the inconclusive ones do not."""
    code = main(["--root", str(REPO), "compare", str(FIX / "results-h200"),
                 str(FIX / "results-h100"), "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 1
    assert "INCONCLUSIVE" in out and "no spread known" in out
    assert "ONLY IN A      finetune/full-1b" in out  # runs the H100 folder lacks
    assert "B is worse" not in out and "run(s) or metric(s) of A missing from B" in out
    assert main(["--root", str(REPO), "compare", str(FIX / "results-h100"),
                 str(FIX / "results-h200"), "--out", str(tmp_path)]) == 0  # B has more: ok
    assert main(["--root", str(REPO), "compare", str(FIX / "results-h200"),
                 str(FIX / "results-h100"), "--out", str(tmp_path), "--strict"]) == 1


@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
def test_one_target_is_still_the_mlflow_compare_view(project):
    out = hopperlab(["prepare-tracking", "--config", "only=membench/copy"], project)
    assert out.returncode == 0, out.stderr[-2000:]
    out = hopperlab(["compare", "membench/copy"], project)   # the MLflow view's own answer
    assert out.returncode == 2 and "no runs of membench/copy from this results folder" in \
        out.stderr, out.stderr[-2000:]


def test_one_target_is_still_an_experiment_of_the_matrix(capsys):
    assert main(["--root", str(REPO), "compare", "nope/none"]) == 2
    assert "nope/none: no such experiment in the matrix" in capsys.readouterr().err
    assert main(["--root", str(REPO), "compare", "a", "b", "c"]) == 2


@pytest.mark.integration
@pytest.mark.mlflow_server
@pytest.mark.timeout(600)
def test_two_commits_from_a_real_mlflow_server(project, mlflow_uri, tmp_path, capsys):
    from hopperlab.results import tracking

    git = ["git", "-C", str(project), "-c", "user.name=t", "-c", "user.email=t@localhost"]
    commits = []
    for results, seed, steps in (("results-m1", 5, 10), ("results-m2", 6, 9)):
        _configure(project, seed, steps)  # then committed: the runs record a clean commit
        subprocess.run(git + ["commit", "-qam", results, "--allow-empty"], check=True)
        commits.append(subprocess.run(git + ["rev-parse", "HEAD"], check=True, text=True,
                                      capture_output=True).stdout.strip())
        folder = _run(project, results)
        report = tracking.sync(folder, mlflow_uri, progress=False)
        assert not report.failed, report
    from mlflow import MlflowClient

    client = MlflowClient(mlflow_uri)
    exp = client.get_experiment_by_name("selftest")
    child = [r for r in client.search_runs([exp.experiment_id])
             if r.data.tags.get("hopperlab.variant") == "noisy"][0]
    assert " ± " in child.data.tags["pm.value"]            # value ± half-width in MLflow
    assert child.data.metrics["value_n"] == 9
    a, b = (f"tags.git_commit = '{c}'" for c in commits)
    code = main(["--root", str(project), "compare", "--mlflow", mlflow_uri, a, b,
                 "--out", str(tmp_path)])
    captured = capsys.readouterr()
    out = captured.out
    assert code == 1, captured.err
    assert "WORSE          selftest/noise/noisy value 8.9" in out, out
    assert main(["--root", str(project), "compare", "--mlflow", mlflow_uri, a, a,
                 "--out", str(tmp_path)]) == 0
    assert main(["--root", str(project), "compare", "--mlflow", mlflow_uri,
                 "tags.git_commit = 'none'", a, "--out", str(tmp_path)]) == 2
