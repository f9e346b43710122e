"""Every family through `snakemake --profile profiles/slurm` on a real one-node Slurm cluster,
uploaded to a real MLflow server: each kind of membench job (one task, two tasks in one job, runs
that end skipped on a CPU) and one run of every other family; plus what happens to jobs Slurm
kills or cancels. (The whole default matrix runs locally in test_workflow_local: membench's other
variants differ from these in their parameters only, which the Slurm path does not read; through
Slurm they cost the suite's Slurm worker about 5 minutes more.)"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from hopperlab.config.matrix import load_matrix
from tests.helpers import copy_project, hopperlab, snakemake

pytestmark = pytest.mark.timeout(1200)


def _write_site(project: Path, cluster, tracking_uri: str) -> None:
    site = {
        "description": "the one-node test cluster",
        "executor": "slurm",
        "poll_interval_s": 2,
        "slurm": {"partition": cluster.partition},
        "resources": {"smoke": {"gpus": 1, "cpus": 1, "mem_gb": 1, "time_min": 5},
                      "full": {"gpus": 1, "cpus": 1, "mem_gb": 1, "time_min": 5}},
        "tracking": {"uri": tracking_uri},
    }
    (project / "configs/sites/slurm-test.yaml").write_text(yaml.safe_dump(site))


def _record(run_dir: Path) -> dict:
    for name in ("record.json", "metrics.json"):
        if (run_dir / name).exists():
            return json.loads((run_dir / name).read_text())
    raise AssertionError(f"no record in {run_dir}")


@pytest.fixture(scope="module")
def slurm_project(tmp_path_factory, slurm_cluster, mlflow_server):
    project = copy_project(tmp_path_factory.mktemp("slurm") / "project")
    _write_site(project, slurm_cluster, mlflow_server.uri)
    return project


#: membench: a one-task run from pinned memory, one with a memory knob, a two-task job, and two
#: that end skipped on a CPU (NCCL only, GPU only); one run of each other family (its assets built
#: on the way)
SLURM_SELECTION = ("membench/copy/h2d-pinned,membench/alloc/managed,membench/collective/all-reduce,"
                   "membench/collective/all-reduce-graph,membench/matmul/bf16,"
                   "finetune/lora-llama2-7b/baseline,inference/kv-cache/offload,"
                   "recommender/latency/gpu,database/tpch/host-pinned")


@pytest.mark.integration
def test_every_family_runs_as_slurm_jobs_and_lands_in_mlflow(slurm_project, slurm_cluster,
                                                             mlflow_server):
    from mlflow import MlflowClient
    project = slurm_project
    out = snakemake(["--profile", "profiles/slurm", "--config", "site=slurm-test",
                     f"only={SLURM_SELECTION}"], project, env=slurm_cluster.env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    matrix = load_matrix(project, {"site": "slurm-test", "only": SLURM_SELECTION})
    assert {s.family for s in matrix.runs.values()} >= {"membench", "finetune", "inference",
                                                         "recommender", "database"}
    client = MlflowClient(mlflow_server.uri)
    by_key = {}
    for family in sorted({s.family for s in matrix.runs.values()}):
        exp = client.get_experiment_by_name(family)
        for r in client.search_runs([exp.experiment_id], max_results=500):
            if r.data.tags.get("hopperlab.role") != "parent":
                by_key[f"{family}/{r.data.tags['hopperlab.experiment']}/"
                       f"{r.data.tags['hopperlab.variant']}"] = r
    statuses = set()
    for key, spec in matrix.runs.items():
        rec = _record(project / spec.run_dir)
        assert rec["status"] in ("ok", "skipped"), (key, rec["reason"])
        statuses.add(rec["status"])
        job_id = rec["slurm"]["job_id"]
        rows = slurm_cluster.sacct(job_id)
        assert rows, f"sacct knows no job {job_id} for {key}"
        assert rows[0]["State"].startswith("COMPLETED"), rows
        run = by_key[key]
        assert run.data.tags["slurm_job_id"] == job_id
        assert run.data.tags["hopperlab.status"] == rec["status"]
    assert statuses == {"ok", "skipped"}  # both kinds of end went through Slurm and sacct
    assert (project / "results/report.html").exists()


def test_time_limit_and_cancel_end_as_records_without_hanging(slurm_project, slurm_cluster):
    project = slurm_project
    cmd = [sys.executable, "-m", "snakemake", "--profile", "profiles/slurm", "--config",
           "site=slurm-test", "families=selftest",
           "only=selftest/faults/overtime,selftest/faults/long"]
    env = {**__import__("os").environ, **slurm_cluster.env}
    proc = subprocess.Popen(cmd, cwd=project, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    long_dir = project / "results/selftest/faults/long"
    deadline = time.monotonic() + 180
    job_id = None
    while time.monotonic() < deadline and job_id is None:
        spec = long_dir / "submitit"
        if spec.exists():
            ids = {p.name.split("_")[0] for p in spec.glob("*_submitted.pkl")}
            job_id = next(iter(ids), None)
        time.sleep(1)
    assert job_id, "the long job was never submitted"
    # let it start, then cancel it from outside, as a user would
    for _ in range(60):
        state = slurm_cluster.run(["squeue", "-h", "-j", job_id, "-o", "%T"]).stdout.strip()
        if state == "RUNNING":
            break
        time.sleep(1)
    slurm_cluster.run(["scancel", job_id])
    output, _ = proc.communicate(timeout=600)
    assert proc.returncode != 0, output[-3000:]
    over = _record(project / "results/selftest/faults/overtime")
    assert over["status"] == "timeout", over
    assert over["slurm"]["state"] in ("TIMEOUT", "DEADLINE"), over
    long = _record(long_dir)
    assert long["status"] == "failed" and long["slurm"]["state"].startswith("CANCELLED"), long
    assert slurm_cluster.sacct(long["slurm"]["job_id"])[0]["State"].startswith("CANCELLED")


@pytest.mark.integration
def test_mlflow_outage_loses_nothing_and_sync_uploads_exactly_the_missing(
        slurm_project, slurm_cluster, mlflow_server):
    from mlflow import MlflowClient
    project = slurm_project
    mlflow_server.stop()
    try:
        out = hopperlab(["submit", "selftest/trivial/ok", "--config", "site=slurm-test",
                         "families=selftest"], project, env=slurm_cluster.env)
        assert out.returncode == 0, out.stderr[-3000:]
        assert "hopperlab sync" in out.stdout + out.stderr
        run_dir = project / "results/selftest/trivial/ok"
        assert _record(run_dir)["status"] == "ok" and not (run_dir / "mlflow.json").exists()
    finally:
        mlflow_server.start()
    out = hopperlab(["sync", "--config", "site=slurm-test", "families=selftest"], project)
    assert out.returncode == 0, out.stderr[-3000:]
    assert (project / "results/selftest/trivial/ok/mlflow.json").exists()
    client = MlflowClient(mlflow_server.uri)
    exp = client.get_experiment_by_name("selftest")
    trivial = [r for r in client.search_runs([exp.experiment_id])
               if r.data.tags.get("hopperlab.experiment") == "trivial"
               and r.data.tags.get("hopperlab.role") != "parent"]
    assert len(trivial) == 1
    again = hopperlab(["sync", "--config", "site=slurm-test", "families=selftest"], project)
    assert again.returncode == 0
    assert len([r for r in client.search_runs([exp.experiment_id])
                if r.data.tags.get("hopperlab.experiment") == "trivial"
                and r.data.tags.get("hopperlab.role") != "parent"]) == 1
