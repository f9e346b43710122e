"""The default matrix end to end on this machine: snakemake -> submitit (local) -> run dirs ->
MLflow (SQLite) -> summary.csv and report.html, then a rerun of one target, then faults.

The workflow runs a representative part of the matrix (``WORKFLOW_PART``: every membench run,
FP8 + compile, and every run of several tasks); every other run of the default matrix is run once
in one process (``hopperlab run``, no submitit, torch imported once) and must end ok or skipped
too. Together every run of the matrix is asserted, in about a third of the time the whole
matrix through Snakemake took (17 min on a loaded 2-core machine; issue 28, item 12).
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from hopperlab.config.matrix import load_matrix
from hopperlab.results import correctness
from tests.helpers import copy_project, hopperlab, snakemake
from tests.results.smoke_verdicts import check_smoke_verdicts

if TYPE_CHECKING:
    from mlflow import MlflowClient

pytestmark = pytest.mark.timeout(1800)


def _client(project: Path) -> MlflowClient:
    from mlflow import MlflowClient
    return MlflowClient(f"sqlite:///{project / 'results' / 'mlflow.db'}")


def _children(client: MlflowClient, family: str, experiment: str) -> list:
    exp = client.get_experiment_by_name(family)
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    return [r for r in runs if r.data.tags.get("hopperlab.experiment") == experiment
            and r.data.tags.get("hopperlab.role") != "parent"]


#: what the workflow runs here: the pipeline's parts (every membench run: local jobs side by
#: side, skipped stand-ins, the rerun below), FP8 + compile, and every run of several tasks
WORKFLOW_PART = ("membench/copy", "membench/alloc", "membench/collective", "finetune/full-1b",
                 "finetune/full-llama2-13b-sharded", "inference/tp-long-context")
ONLY = "only=" + ",".join(WORKFLOW_PART)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    project = copy_project(tmp_path_factory.mktemp("smoke") / "project")
    t0 = time.monotonic()
    out = snakemake(["--cores", "2", "--config", ONLY], project)
    elapsed = time.monotonic() - t0
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    print(f"smoke matrix, the workflow's part: {elapsed:.1f} s")
    return project, elapsed


def _workflow_runs(project: Path) -> dict:
    return load_matrix(project, {"only": ",".join(WORKFLOW_PART)}).runs


def test_the_workflow_part_covers_every_kind_of_run():
    """Every run of several tasks goes through the workflow (the one-process check below
    cannot start tasks), and so do FP8 and a CPU stand-in that skips."""
    from tests.helpers import REPO
    whole = load_matrix(REPO).runs
    part = _workflow_runs(REPO)
    assert {k for k, s in whole.items() if s.resources.distributed} <= set(part)
    assert any(s.knobs.precision == "fp8" for s in part.values())
    assert len(part) < len(whole) / 2


@pytest.mark.integration
def test_every_other_run_of_the_matrix_ends_ok_or_skipped(tmp_path):
    """The rest of the default matrix, each run once, in one process: its status and reason."""
    project = copy_project(tmp_path / "rest")
    out = hopperlab(["fetch", "--matrix"], project)
    assert out.returncode == 0, out.stderr[-3000:]
    code = ("import json, sys; from hopperlab.cli.main import main; "
            "from hopperlab.config.matrix import load_matrix; "
            "keys = json.loads(sys.argv[1]); "
            "[main(['run', k, '--no-upload']) for k in keys]")
    part = _workflow_runs(project)
    rest = [k for k in load_matrix(project).runs if k not in part]
    assert rest
    run = subprocess.run([sys.executable, "-c", code, json.dumps(rest)], cwd=project,
                         capture_output=True, text=True, timeout=1500)
    assert run.returncode == 0, run.stderr[-3000:]
    matrix = load_matrix(project)
    statuses = {}
    for key in rest:
        rec = json.loads((project / matrix.runs[key].run_dir / "metrics.json").read_text())
        statuses[key] = rec["status"]
        assert rec["status"] in ("ok", "skipped"), (key, rec["reason"])
        assert rec["metrics"] if rec["status"] == "ok" else rec["reason"], key
    assert "ok" in statuses.values()
    # issue 47: every comparable variant has its verdict, exact ones same, bounded within
    found = check_smoke_verdicts(project / "results", rest)
    assert {correctness.SAME, correctness.WITHIN} <= set(found.values()), found


@pytest.mark.integration
def test_every_run_of_the_workflow_part_has_a_record(smoke):
    project, _ = smoke
    runs = _workflow_runs(project)
    assert len(runs) >= 10
    for key, spec in runs.items():
        run_dir = project / spec.run_dir
        rec = json.loads((run_dir / "metrics.json").read_text())
        assert rec["key"] == key and rec["attempt"] == 1
        assert rec["status"] in ("ok", "skipped"), (key, rec["reason"])
        assert rec["hardware"]["cpu_arch"] and rec["hardware"]["hostname"]
        assert (run_dir / "spec.json").exists() and (run_dir / "logs" / "job.out").exists()
        if rec["status"] == "ok":
            assert rec["metrics"], key
            assert (run_dir / "steps.jsonl").read_text().strip(), key
        else:
            assert rec["reason"], key
    # the CPU stand-ins measure something real on a machine without a GPU
    host = json.loads((project / "results/membench/alloc/host/metrics.json").read_text())
    assert host["status"] == "ok" and any(v > 0 for v in host["metrics"].values())


@pytest.mark.integration
def test_summary_and_report_cover_every_run(smoke):
    project, _ = smoke
    rows = list(csv.DictReader(open(project / "results" / "summary.csv")))
    keys = {f"{r['family']}/{r['experiment']}/{r['variant']}" for r in rows}
    assert keys == set(_workflow_runs(project))
    html = (project / "results" / "report.html").read_text()
    assert "h2d-pinned" in html and "data:image/png;base64," in html
    assert "<th>correctness</th>" in html and {r["correctness"] for r in rows} > {""}
    found = check_smoke_verdicts(project / "results", keys)
    assert correctness.WITHIN in found.values(), found  # fp8, the sharded runs


@pytest.mark.integration
def test_mlflow_has_one_experiment_per_family_parents_and_children(smoke):
    project, _ = smoke
    client = _client(project)
    exp = client.get_experiment_by_name("membench")
    assert exp is not None
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    parents = {r.info.run_name: r for r in runs if r.data.tags.get("hopperlab.role") == "parent"}
    assert set(parents) == {k.split("/")[1] for k in _workflow_runs(project)
                            if k.startswith("membench/")}
    children = _children(client, "membench", "copy")
    assert {r.data.tags["hopperlab.variant"] for r in children} == {
        "h2d-pageable", "h2d-pinned", "d2h-pageable", "d2h-pinned", "bidir-pageable",
        "bidir-pinned"}
    child = next(r for r in children if r.data.tags["hopperlab.variant"] == "h2d-pinned")
    assert child.data.tags["mlflow.parentRunId"] == parents["copy"].info.run_id
    for tag in ("hopperlab.family", "hopperlab.status", "hostname", "cpu_arch", "git_commit"):
        assert tag in child.data.tags, tag
    assert child.data.params["knobs.memory"] == "device"
    assert child.data.params["params.direction"] == "h2d"
    artifacts = {a.path for a in client.list_artifacts(child.info.run_id)}
    assert "logs" in artifacts and "spec.json" in artifacts
    out = hopperlab(["compare", "membench/copy"], project)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("http://127.0.0.1:5000/#/compare-runs?runs=")
    assert all(r.info.run_id in out.stdout for r in children)


@pytest.mark.integration
def test_rerun_of_one_target_reruns_exactly_that_run(smoke):
    project, _ = smoke
    target = project / "results/membench/copy/h2d-pageable/metrics.json"
    others = {p: p.stat().st_mtime_ns for p in (project / "results").glob("*/*/*/metrics.json")
              if p != target}
    summary_before = (project / "results/summary.csv").stat().st_mtime_ns
    out = snakemake(["--cores", "2", "--config", ONLY, "--forcerun",
                     str(target.relative_to(project))], project)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(target.read_text())["attempt"] == 2
    first = json.loads((target.parent / "attempts" / "1" / "record.json").read_text())
    assert first["attempt"] == 1 and first["metrics"]  # the first attempt's figures are kept
    assert all(p.stat().st_mtime_ns == m for p, m in others.items())
    client = _client(project)
    runs = [r for r in _children(client, "membench", "copy")
            if r.data.tags["hopperlab.variant"] == "h2d-pageable"]
    assert sorted(r.data.tags["hopperlab.attempt"] for r in runs) == ["1", "2"]
    assert (project / "results/summary.csv").stat().st_mtime_ns > summary_before
    rows = [r for r in csv.DictReader(open(project / "results/summary.csv"))
            if r["variant"] == "h2d-pageable"]
    assert rows[0]["attempt"] == "2"


@pytest.mark.integration
def test_dry_run_and_list_show_the_matrix(smoke, tmp_path):
    project = copy_project(tmp_path / "fresh")
    out = snakemake(["-n", "--cores", "2"], project)
    assert out.returncode == 0, out.stderr[-2000:]
    text = out.stdout + out.stderr
    assert "run" in text and "report" in text
    listing = hopperlab(["list", "--json"], project)
    assert listing.returncode == 0, listing.stderr
    rows = json.loads(listing.stdout)
    assert {(r["family"], r["experiment"], r["variant"]) for r in rows} >= {
        ("membench", "copy", "h2d-pinned"), ("membench", "alloc", "managed")}
    assert all("gpus" in r["resources"] for r in rows)
    assert not (project / "results").exists()


@pytest.mark.integration
def test_faults_keep_the_workflow_going_and_leave_records(tmp_path):
    project = copy_project(tmp_path / "faults")
    only = ",".join(f"selftest/faults/{v}" for v in ("ok", "raises", "oom", "skipped"))
    out = snakemake(["--cores", "2", "--keep-going", "--config", "families=selftest",
                     f"only={only}"], project)
    assert out.returncode != 0  # one rule failed
    base = project / "results/selftest/faults"
    status = {v: json.loads((base / v / "record.json").read_text())["status"]
              for v in ("ok", "raises", "oom", "skipped")}
    assert status == {"ok": "ok", "raises": "failed", "oom": "oom", "skipped": "skipped"}
    assert not (base / "raises" / "metrics.json").exists()  # Snakemake removed the failed output
    assert "deliberate failure" in (base / "raises" / "traceback.txt").read_text()
    client = _client(project)
    runs = {r.data.tags["hopperlab.variant"]: r for r in _children(client, "selftest", "faults")}
    assert runs["raises"].info.status == "FAILED"
    assert runs["oom"].info.status == "FINISHED"
    assert "traceback.txt" in {a.path for a in client.list_artifacts(runs["raises"].info.run_id)}
    html = (project / "results/report.html").read_text()  # written by onerror
    assert "raises" in html and "failed" in html
