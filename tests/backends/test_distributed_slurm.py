"""A run of 2 tasks as one real Slurm job (the test cluster), through `snakemake --profile
profiles/slurm`: sacct shows one job whose step ran 2 tasks, the record says world size 2, MLflow
holds the ranks' files; a rank that raises fails its run and the workflow goes on. Then over the
cluster's two nodes: a run of one task on each, and a node that dies in the middle of one (its
slurmd and its task killed): the run ends failed, naming the rank and the node, in bounded time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.helpers import copy_project, edit_yaml, snakemake

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(900)]


@pytest.mark.integration
def test_two_tasks_as_one_slurm_job(tmp_path, slurm_cluster):
    project = copy_project(tmp_path / "project")
    site = {"executor": "slurm", "poll_interval_s": 1,
            "slurm": {"partition": slurm_cluster.partition}, "max_nodes": 1,
            "resources": {"smoke": {"gpus": 0, "cpus": 1, "mem_gb": 1, "time_min": 5},
                          "full": {"gpus": 0, "cpus": 1, "mem_gb": 1, "time_min": 5}}}
    (project / "configs/sites/slurm-test.yaml").write_text(yaml.safe_dump(site))
    out = snakemake(["--profile", "profiles/slurm", "--config", "site=slurm-test",
                     "families=selftest", "only=selftest/distributed"], project,
                    env=slurm_cluster.env, timeout=600)
    assert out.returncode != 0  # rank-raises failed; keep-going finished the other run
    ok = project / "results/selftest/distributed/ok"
    rec = json.loads((ok / "metrics.json").read_text())
    assert rec["status"] == "ok" and rec["world_size"] == 2, out.stderr[-4000:]
    job_id = rec["slurm"]["job_id"]
    rows = slurm_cluster.run(["sacct", "-j", job_id, "--parsable2", "--noheader",
                              "--format=JobID,NTasks,State"]).stdout.split()
    steps = [r.split("|") for r in rows]
    assert [s for s in steps if s[0] == job_id], rows  # one job ...
    assert any(s[0] == f"{job_id}.0" and s[1] == "2" for s in steps), rows  # ... of 2 tasks
    bad = json.loads((project / "results/selftest/distributed/rank-raises/record.json").read_text())
    assert bad["status"] == "failed" and bad["reason"].startswith("rank 1:"), bad
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{project / 'results/mlflow.db'}")
    exp = client.get_experiment_by_name("selftest")
    runs = [r for r in client.search_runs([exp.experiment_id])
            if r.data.tags.get("hopperlab.variant") == "ok"]
    assert runs
    names = {a.path for a in client.list_artifacts(runs[0].info.run_id, "ranks")}
    assert names == {"ranks/0", "ranks/1"}


def _two_node_project(tmp_path, slurm_cluster) -> Path:
    """The project with a site of up to 2 nodes whose jobs reach each other on the cluster's
    interface, and two selftest variants of one task on each of 2 nodes."""
    slurm_cluster.need_two_nodes()
    project = copy_project(tmp_path / "project")
    site = {"executor": "slurm", "poll_interval_s": 1, "max_nodes": 2,
            "slurm": {"partition": slurm_cluster.partition,
                      "setup": [f"export GLOO_SOCKET_IFNAME={slurm_cluster.ifname}"]},
            "resources": {"smoke": {"gpus": 0, "cpus": 1, "mem_gb": 1, "time_min": 5},
                          "full": {"gpus": 0, "cpus": 1, "mem_gb": 1, "time_min": 5}}}
    (project / "configs/sites/slurm-2n.yaml").write_text(yaml.safe_dump(site))
    two = {"nodes": 2, "tasks_per_node": 1}
    edit_yaml(project / "experiments/selftest.yaml",
              lambda d: d["experiments"]["distributed"]["variants"].update({
                  "two-nodes": {"resources": two},
                  "node-dies": {"params": {"steps": 600, "sleep_s": 0.5},
                                "resources": {**two, "time_min": 10}}}))
    return project


@pytest.mark.integration
def test_a_two_node_gloo_run_through_slurm_and_the_workflow(tmp_path, slurm_cluster):
    project = _two_node_project(tmp_path, slurm_cluster)
    out = snakemake(["--profile", "profiles/slurm", "--config", "site=slurm-2n",
                     "families=selftest", "only=selftest/distributed/two-nodes"], project,
                    env=slurm_cluster.env, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    rec = json.loads((project / "results/selftest/distributed/two-nodes/metrics.json").read_text())
    assert rec["status"] == "ok" and rec["world_size"] == 2 and rec["nodes"] == 2, rec
    assert rec["metrics"]["value"] == 3.0  # the all-reduce crossed the nodes
    assert {r["host"] for r in rec["ranks"]} == set(slurm_cluster.nodes)
    assert set(rec["node_hardware"]) == set(slurm_cluster.nodes)
    rows = slurm_cluster.run(["sacct", "-j", rec["slurm"]["job_id"], "-X", "--parsable2",
                              "--noheader", "--format=NNodes,NodeList"]).stdout.split()
    assert rows and rows[0].split("|")[0] == "2", rows


def test_a_node_that_dies_mid_run_ends_the_run_failed_naming_it(tmp_path, slurm_cluster):
    project = _two_node_project(tmp_path, slurm_cluster)
    key = "selftest/distributed/node-dies"
    run_dir = project / "results" / key
    proc = subprocess.Popen(
        [sys.executable, "-m", "hopperlab.cli", "submit", key, "--no-upload", "--config",
         "site=slurm-2n", "families=selftest"], cwd=project, env={**os.environ,
                                                                   **slurm_cluster.env},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 240
        while not all((run_dir / f"ranks/{r}/steps.jsonl").exists() for r in (0, 1)):
            assert proc.poll() is None, proc.communicate()[0][-3000:]
            assert time.monotonic() < deadline, "the ranks never stepped"
            time.sleep(0.5)
        hosts = {r: json.loads((run_dir / f"ranks/{r}/task.json").read_text())["host"]
                 for r in (0, 1)}
        dead = next(r for r, h in hosts.items() if h == slurm_cluster.nodes[1])
        slurm_cluster.kill_node()
        killed_at = time.monotonic()
        output, _ = proc.communicate(timeout=300)  # bounded: the node's death ends the run
        waited = time.monotonic() - killed_at
    finally:
        if proc.poll() is None:
            proc.kill()
        slurm_cluster.start_node()
    assert proc.returncode != 0, output[-3000:]
    rec = json.loads((run_dir / "record.json").read_text())
    assert rec["status"] == "failed", rec
    assert f"ranks [{dead}]" in rec["reason"] and slurm_cluster.nodes[1] in rec["reason"], rec
    assert rec["slurm"]["state"] == "NODE_FAIL", rec["slurm"]
    assert waited < 240, waited  # the bound: SlurmdTimeout, then the next poll
    # and with the node back, Slurm does not queue the job again: a requeued job ran the whole
    # run a second time (5 minutes on both nodes) and rewrote the record the submitter had left
    job_id = rec["slurm"]["job_id"]
    state = slurm_cluster.run(["squeue", "-h", "--states=all", "-j", job_id,
                               "-o", "%T"]).stdout.split()
    assert state and state[0] not in ("PENDING", "REQUEUED", "REQUEUE_HOLD", "CONFIGURING",
                                      "RUNNING"), state
    shown = slurm_cluster.run(["scontrol", "show", "job", job_id]).stdout
    assert "Restarts=0" in shown.split(), shown
