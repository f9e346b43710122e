"""Thread pools sized from the CPUs the job was given (issue 21, part 3c)."""

from __future__ import annotations

import pytest

from hopperlab.backends import where_am_i
from hopperlab.node.threads import DUCKDB_ENV, WORKERS_ENV, apply, plan_threads
from hopperlab.node.threads import cpus_given as _cpus_given
from hopperlab.results.report.html import _hardware_value


def cpus_given(environ, affinity, requested=None):
    """The count as the job sees it: what its backend reads of the environment (Slurm's
    variables are read in backends/slurm only), bounded by the affinity."""
    here = where_am_i(environ)
    given = (here.cpus, here.cpus_source) if here.cpus is not None else None
    return _cpus_given(given, affinity, requested)

NODE = range(72)  # a GH200 node's Grace cores


def test_affinity_alone():
    assert cpus_given({}, {0, 1, 2, 3}) == (4, "affinity")


def test_slurm_cpus_per_task_beats_a_whole_node_affinity():
    # TaskPlugin=task/none: the affinity is the whole node, Slurm's number is the allocation
    assert cpus_given({"SLURM_CPUS_PER_TASK": "8"}, NODE) == (8, "SLURM_CPUS_PER_TASK")


@pytest.mark.parametrize("value,tasks,expected", [
    ("16", None, 16), ("72(x2)", None, 72), ("16,8", None, 16), ("72(x2)", "4", 18)])
def test_slurm_job_cpus_per_node(value, tasks, expected):
    env = {"SLURM_JOB_CPUS_PER_NODE": value}
    if tasks:
        env["SLURM_NTASKS_PER_NODE"] = tasks
    n, source = cpus_given(env, NODE)
    assert n == expected and source.startswith("SLURM_JOB_CPUS_PER_NODE")


def test_a_tighter_affinity_wins_over_slurm():
    n, source = cpus_given({"SLURM_CPUS_PER_TASK": "16"}, {0, 1, 2})
    assert n == 3 and "affinity" in source and "16" in source


def test_without_slurm_the_runs_cpus_bound_the_affinity():
    # issue 28, item 11: the local executor runs jobs side by side (Snakemake's --cores), each
    # asking resources.cpus; sized from the whole mask, two smoke jobs put 4 threads on 2 cores
    n, source = cpus_given({}, {0, 1}, requested=1)
    assert n == 1 and source.startswith("resources.cpus") and "2 CPUs" in source
    assert cpus_given({}, {0, 1}, requested=8) == (2, "affinity")
    assert cpus_given({"SLURM_CPUS_PER_TASK": "4"}, NODE, requested=1) == (4, "SLURM_CPUS_PER_TASK")


def test_the_runner_sizes_a_local_job_from_its_resources(tmp_path, monkeypatch):
    from types import SimpleNamespace
    from hopperlab.core.rundir import Recorder
    from hopperlab.run import runner
    monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)
    monkeypatch.delenv("SLURM_JOB_CPUS_PER_NODE", raising=False)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2, 3})
    seen = {}
    monkeypatch.setattr(runner.threads, "apply", lambda plan: seen.setdefault("plan", plan))
    rec = Recorder(tmp_path / "run")
    spec = SimpleNamespace(resources=SimpleNamespace(cpus=1, threads=None),
                           site=SimpleNamespace(env={}))
    runner._size_threads(spec, rec)
    assert seen["plan"].intra_op == 1 and rec.hardware["threads"]["intra_op"] == 1


def test_plan_sizes_and_overrides():
    plan = plan_threads(8, "SLURM_CPUS_PER_TASK")
    assert (plan.intra_op, plan.dataloader_workers, plan.duckdb) == (8, 7, 8)
    assert plan_threads(1, "affinity").dataloader_workers == 0
    over = plan_threads(8, "x", {"duckdb": 2, "dataloader_workers": 0})
    assert (over.intra_op, over.dataloader_workers, over.duckdb) == (8, 0, 2)
    assert over.overridden == ("dataloader_workers", "duckdb")
    with pytest.raises(ValueError, match="unknown pool"):
        plan_threads(8, "x", {"omp": 2})
    with pytest.raises(ValueError, match="intra_op"):
        plan_threads(8, "x", {"intra_op": 0})


def test_apply_keeps_what_the_environment_already_says():
    env = {"MKL_NUM_THREADS": "1"}
    set_now = apply(plan_threads(6, "affinity"), env)
    assert env["OMP_NUM_THREADS"] == "6" and env["OPENBLAS_NUM_THREADS"] == "6"
    assert env["MKL_NUM_THREADS"] == "1" and "MKL_NUM_THREADS" not in set_now
    assert env[DUCKDB_ENV] == "6" and env[WORKERS_ENV] == "5"


def test_report_shows_the_plan():
    text = _hardware_value("threads", plan_threads(8, "SLURM_CPUS_PER_TASK").as_record())
    assert text == "8 (SLURM_CPUS_PER_TASK): intra-op 8, loader workers 7, DuckDB 8"


def test_a_launchers_thread_count_is_dropped_but_the_sites_is_kept():
    """Issue 35: Snakemake's shell: gave every job OMP_NUM_THREADS=1; apply kept it and torch
    ran one thread while the record said 16. What the launcher set goes; the site's stays."""
    from hopperlab.node.threads import drop_inherited

    env = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "GOTO_NUM_THREADS": "1", "HOME": "/h"}
    dropped = drop_inherited({"MKL_NUM_THREADS": 1}, env)
    assert dropped == {"OMP_NUM_THREADS": "1", "GOTO_NUM_THREADS": "1"}
    apply(plan_threads(16, "resources.cpus"), env)
    assert env["OMP_NUM_THREADS"] == "16" and env["MKL_NUM_THREADS"] == "1"
    assert env["HOME"] == "/h" and "GOTO_NUM_THREADS" not in env
