"""Integration tests against the real one-node Slurm cluster (fixture in tests/infra/slurm_fixture.py).

They pin down what the platform relies on: sbatch + sacct accounting, a schedulable (fake) GPU, and
submitit's result/error/timeout/cancel paths ending instead of hanging (which needs a working sacct).
Timeouts use func_only so a first-time package install in the fixture does not count against them.
"""

from __future__ import annotations

import time

import pytest
import submitit
from submitit.core.utils import FailedJobError, UncompletedJobError

pytestmark = pytest.mark.slurm


def _sbatch(slurm_cluster, tmp_path, *args: str) -> str:
    proc = slurm_cluster.run(
        ["sbatch", "--parsable", f"--output={tmp_path}/%j.out", *args], cwd=tmp_path, check=True
    )
    return proc.stdout.strip().split(";")[0]


def _squeue_state(slurm_cluster, job_id: str) -> str:
    return slurm_cluster.run(["squeue", "-h", "-j", job_id, "-o", "%T"]).stdout.strip()


def _no_result_grace(job: submitit.Job) -> None:
    """Before raising for a job without a result file, result() waits 15 s in case a slow shared
    filesystem has not shown the file yet; the folder here is local, so drop that wait (as
    submitit's own tests do)."""
    job._results_timeout_s = 0


@pytest.fixture
def executor(slurm_cluster, tmp_path, monkeypatch) -> submitit.AutoExecutor:
    """A submitit executor on the test cluster; submitit calls sbatch/sacct with os.environ."""
    for key, value in slurm_cluster.env.items():
        monkeypatch.setenv(key, value)
    ex = submitit.AutoExecutor(folder=tmp_path / "%j", cluster="slurm")
    ex.update_parameters(timeout_min=5, slurm_partition=slurm_cluster.partition)
    return ex


@pytest.mark.timeout(60, func_only=True)
def test_sbatch_wrap_completes_in_sacct(slurm_cluster, tmp_path):
    job_id = _sbatch(slurm_cluster, tmp_path, "--wrap", "echo hello-from-slurm")
    row = slurm_cluster.wait(job_id)
    assert (row["State"], row["ExitCode"], row["Partition"]) == ("COMPLETED", "0:0", "debug")
    assert (tmp_path / f"{job_id}.out").read_text().strip() == "hello-from-slurm"


@pytest.mark.timeout(60, func_only=True)
def test_gpu_job_is_scheduled(slurm_cluster, tmp_path):
    job_id = _sbatch(slurm_cluster, tmp_path, "--gpus=1", "--wrap", "echo gpus=$SLURM_JOB_GPUS")
    row = slurm_cluster.wait(job_id)
    assert row["State"] == "COMPLETED"
    assert "gres/gpu=1" in row["AllocTRES"]
    assert (tmp_path / f"{job_id}.out").read_text().strip() == "gpus=0"


@pytest.mark.integration
@pytest.mark.timeout(120, func_only=True)
def test_submitit_returns_value(executor, slurm_cluster):
    def add(a, b):
        import os

        return a + b, os.environ["SLURM_JOB_ID"]

    job = executor.submit(add, 2, 3)
    assert job.result() == (5, job.job_id)
    # Not job.state: submitit caches it and may still say PENDING once the result file exists.
    assert slurm_cluster.wait(job.job_id)["State"] == "COMPLETED"


@pytest.mark.integration
@pytest.mark.timeout(120, func_only=True)
def test_submitit_gpu_job(executor):
    def visible_gpus():
        import os

        return os.environ.get("CUDA_VISIBLE_DEVICES")

    executor.update_parameters(gpus_per_node=1)
    assert executor.submit(visible_gpus).result() == "0"


@pytest.mark.integration
@pytest.mark.timeout(120, func_only=True)
def test_submitit_remote_exception_surfaces(executor):
    def explode():
        raise ValueError("remote-boom-7431")

    job = executor.submit(explode)
    with pytest.raises(FailedJobError) as info:
        job.result()
    assert "Traceback" in str(info.value)
    assert "ValueError: remote-boom-7431" in str(info.value)


@pytest.mark.integration
@pytest.mark.timeout(300, func_only=True)
def test_submitit_timeout_ends_uncompleted(executor, slurm_cluster):
    # submitit asks Slurm for USR2 `signal_delay_s` before the limit (default 90 s); with a 1 min
    # limit that arrives at once and submitit ends the job itself as FAILED. Delay 0 lets Slurm
    # enforce the limit. Slurm checks limits only every 30 s, so this takes 60-90 s.
    executor.update_parameters(timeout_min=1, slurm_signal_delay_s=0)
    job = executor.submit(time.sleep, 600)
    row = slurm_cluster.wait(job.job_id, timeout=200)
    assert row["State"] == "TIMEOUT"
    # force_check: submitit's own polling backs off to ~45 s between sacct calls by now.
    assert job.done(force_check=True)
    assert job.state == "TIMEOUT"
    _no_result_grace(job)
    with pytest.raises(UncompletedJobError, match="TIMEOUT"):
        job.result()


@pytest.mark.integration
@pytest.mark.timeout(120, func_only=True)
def test_scancelled_job_ends_cancelled(executor, slurm_cluster):
    job = executor.submit(time.sleep, 600)
    deadline = time.monotonic() + 60
    while _squeue_state(slurm_cluster, job.job_id) != "RUNNING":  # cancel a running job, not a queued one
        assert time.monotonic() < deadline, "job never started"
        time.sleep(0.2)
    slurm_cluster.run(["scancel", job.job_id], check=True)
    assert slurm_cluster.wait(job.job_id)["State"].startswith("CANCELLED")
    _no_result_grace(job)
    with pytest.raises(UncompletedJobError, match="CANCELLED"):
        job.result()


@pytest.mark.timeout(120, func_only=True)
def test_two_nodes_each_with_its_own_name_and_address(slurm_cluster, tmp_path):
    """The second slurmd (its own network namespace, hostname and files) makes a 2-node job."""
    slurm_cluster.need_two_nodes()
    states = slurm_cluster.run(["sinfo", "-h", "-N", "-o", "%N %T"], check=True).stdout.split("\n")
    assert sorted(line.split()[0] for line in states if line) == sorted(slurm_cluster.nodes)
    job_id = _sbatch(slurm_cluster, tmp_path, "-N2", "--ntasks-per-node=1", "--wrap",
                     "srun bash -c 'echo $SLURM_NODEID $(hostname) $(hostname -I)'")
    row = slurm_cluster.wait(job_id)
    assert row["State"] == "COMPLETED", row
    lines = sorted((tmp_path / f"{job_id}.out").read_text().split("\n"))
    seen = {line.split()[1]: line.split()[2:] for line in lines if line}
    assert set(seen) == set(slurm_cluster.nodes)  # each task on its node, by that node's name
    assert seen[slurm_cluster.nodes[0]] != seen[slurm_cluster.nodes[1]]  # two network stacks


def test_a_one_node_cluster_fails_two_node_tests_when_slurm_is_required(monkeypatch, tmp_path):
    """Under HOPPERLAB_REQUIRE_SLURM=1 (CI) a missing second node fails the test, never skips."""
    from tests.infra.slurm_fixture import REQUIRE_ENV, SlurmCluster

    one = SlurmCluster(dir=tmp_path, conf=tmp_path / "slurm.conf", env={}, nodes=("vm",))
    monkeypatch.setenv(REQUIRE_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match="one node"):
        one.need_two_nodes()
    monkeypatch.delenv(REQUIRE_ENV)
    with pytest.raises(pytest.skip.Exception, match="one node"):
        one.need_two_nodes()
    SlurmCluster(dir=tmp_path, conf=tmp_path, env={}, nodes=("a", "b")).need_two_nodes()
