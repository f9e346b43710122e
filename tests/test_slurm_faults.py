"""Slurm faults on the real one-node test cluster: accounting (slurmdbd, so sacct) down while a
job is cancelled and another runs out of its time limit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

from tests.helpers import copy_project

#: generous: the time-limited job needs its 1 min plus Slurm's next limit check
WAIT_S = 420


def _write_site(project: Path, cluster) -> None:
    site = {
        "description": "the one-node test cluster, polled every second",
        "executor": "slurm",
        "poll_interval_s": 1,
        "slurm": {"partition": cluster.partition},
        "resources": {"smoke": {"gpus": 0, "cpus": 1, "mem_gb": 1, "time_min": 5},
                      "full": {"gpus": 0, "cpus": 1, "mem_gb": 1, "time_min": 5}},
    }
    (project / "configs/sites/slurm-test.yaml").write_text(yaml.safe_dump(site))


def _submit(project: Path, cluster, variant: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "hopperlab.cli", "submit", f"selftest/faults/{variant}",
           "--no-upload", "--config", "site=slurm-test", "families=selftest"]
    return subprocess.Popen(cmd, cwd=project, env={**os.environ, **cluster.env},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _job_id(run_dir: Path) -> str:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        ids = {p.name.split("_")[0] for p in (run_dir / "submitit").glob("*_submitted.pkl")}
        if ids:
            return ids.pop()
        time.sleep(0.5)
    raise AssertionError(f"no job submitted for {run_dir}")


def _wait_running(cluster, job_id: str) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if cluster.run(["squeue", "-h", "-j", job_id, "-o", "%T"]).stdout.strip() == "RUNNING":
            return
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} never ran")


def test_without_sacct_cancel_and_time_limit_end_and_say_so_once(tmp_path, slurm_cluster):
    project = copy_project(tmp_path / "project")
    _write_site(project, slurm_cluster)
    base = project / "results/selftest/faults"
    procs: dict[str, subprocess.Popen] = {}
    try:
        with slurm_cluster.accounting_down():
            assert slurm_cluster.run(["sacct", "-n", "-X"]).returncode != 0, "sacct still answers"
            procs = {v: _submit(project, slurm_cluster, v) for v in ("overtime", "long")}
            long_id = _job_id(base / "long")
            _wait_running(slurm_cluster, long_id)
            slurm_cluster.run(["scancel", long_id], check=True)
            outputs = {v: p.communicate(timeout=WAIT_S)[0] for v, p in procs.items()}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
    over = json.loads((base / "overtime/record.json").read_text())
    assert over["status"] == "timeout" and over["slurm"]["state"] == "TIMEOUT", over
    long = json.loads((base / "long/record.json").read_text())
    assert long["status"] == "failed" and long["slurm"]["state"].startswith("CANCELLED"), long
    for variant, out in outputs.items():
        assert procs[variant].returncode == 1, out[-3000:]
        assert "Bypassing sacct error" not in out, out[-3000:]
        said = [ln for ln in out.splitlines() if "sacct failed" in ln]
        assert len(said) == 1, out[-3000:]
        assert "squeue" in said[0]


class _NobodyKnows:
    """A Slurm job whose state neither sacct nor squeue has known for an hour."""

    job_id = "42"
    cancelled = False

    class watcher:  # shaped like launch's watcher
        @staticmethod
        def unknown_for_s(job_id: str) -> float:
            return 3600.0

    def done(self) -> bool:
        return False

    def cancel(self, check: bool = True) -> None:
        self.cancelled = True


def test_a_job_no_source_knows_is_given_up_on_not_awaited_forever():
    from hopperlab.config.matrix import load_matrix
    from hopperlab.run import launch
    from tests.helpers import REPO

    spec = load_matrix(REPO, {"site": "slurm", "families": "selftest"}).get("selftest/faults/ok")
    job = _NobodyKnows()
    state, reason = launch._wait(spec, job)
    assert state == "UNKNOWN" and "neither sacct nor squeue" in reason and job.cancelled
