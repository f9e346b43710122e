"""``--config processes=3`` on the real Slurm cluster of the tests: three Slurm jobs per run
(sacct knows each), a record of three process medians, references of n 3 from them, and a
fresh check of a new folder (one process) that passes against them. The run is declared
host-bound here, so each of its jobs asks Slurm for an exclusive allocation and says so."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.helpers import copy_project, edit_yaml, hopperlab, snakemake
from tests.platform.test_workflow_slurm import _write_site

pytestmark = pytest.mark.timeout(1200)

KEY = "selftest/noise/noisy"


@pytest.mark.integration
def test_three_processes_are_three_slurm_jobs_and_give_references_of_n_3(
        tmp_path, slurm_cluster):
    project = copy_project(tmp_path / "project")
    _write_site(project, slurm_cluster, None)  # no tracking server: the runs stay on disk
    edit_yaml(project / "experiments/selftest.yaml", lambda d: d["experiments"]["noise"].update(
        host_bound="the stand-in of a host-bound run"))
    common = ["--profile", "profiles/slurm", "--config", "site=slurm-test", "families=selftest",
              f"only={KEY}"]
    out = snakemake([*common, "processes=3", "repeats=2"], project, env=slurm_cluster.env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    run_dir = project / "results" / KEY
    rec = json.loads((run_dir / "record.json").read_text())
    assert rec["status"] == "ok", rec["reason"]
    procs = rec["processes"]
    assert [p["process"] for p in procs] == [0, 1, 2]
    assert all(p["status"] == "ok" and p["windows"] == 2 and p["node"] in slurm_cluster.nodes
               and "value" in p["metrics"] for p in procs), procs
    jobs = {p["job_id"] for p in procs}
    assert len(jobs) == 3, procs  # three jobs, not one job measured three times
    for job in jobs:
        rows = slurm_cluster.sacct(job)
        assert rows and rows[0]["State"].startswith("COMPLETED"), (job, rows)
    assert rec["metrics"]["value_n"] == 3  # the median of the three processes' medians
    assert rec["isolation"]["isolated"] is True and "exclusive" in rec["isolation"]["how"]
    for i in range(3):  # each process's own job asked for its node alone
        scripts = list((run_dir / "processes" / str(i) / "submitit").glob("*.sh"))
        assert scripts and "#SBATCH --exclusive" in scripts[0].read_text(), scripts
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert sorted({s["process"] for s in samples}) == [0, 1, 2] and len(samples) == 6

    refs = hopperlab(["references", "update", "results", "--config", "site=slurm-test",
                      "families=selftest"], project)
    assert refs.returncode == 0, refs.stdout + refs.stderr
    assert "one process per run" not in refs.stdout  # no warning: the spread is the processes'
    machine = rec["machine"]
    written = yaml.safe_load((project / f"configs/references/{machine}.yaml").read_text())
    entry = written["references"][KEY]["value"]
    assert entry["n"] == 3 and "3 independent processes" in entry["source"], entry

    fresh = snakemake([*common, "results_dir=results-fresh"], project, env=slurm_cluster.env)
    assert fresh.returncode == 0, fresh.stdout[-3000:] + fresh.stderr[-5000:]
    fresh_rec = json.loads((project / "results-fresh" / KEY / "record.json").read_text())
    assert "processes" not in fresh_rec  # a fresh check judges one process
    check = hopperlab(["check", "results-fresh", "--strict", "--config", "site=slurm-test",
                       "families=selftest", f"only={KEY}"], project)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "pass 1" in check.stdout, check.stdout
