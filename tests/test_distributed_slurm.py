"""A run of 2 tasks as one real Slurm job (the one-node test cluster), through `snakemake
--profile profiles/slurm`: sacct shows one job whose step ran 2 tasks, the record says world
size 2, MLflow holds the ranks' files; a rank that raises fails its run and the workflow goes on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.helpers import copy_project, snakemake

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(900)]


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
