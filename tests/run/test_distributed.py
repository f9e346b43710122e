"""Runs that span several tasks: resources, site caps, the scheduler's environment, and 2-task
runs through the local launcher (the one a GPU node uses): the record of a good run, and a rank
that raises (``failed`` with its traceback, within the collective timeout)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hopperlab.backends.base import MASTER_PORT_ENV
from hopperlab.backends.slurm.jobenv import first_host
from hopperlab.config.matrix import load_matrix
from hopperlab.core.errors import SpecError
from hopperlab.run import distributed
from tests.helpers import copy_project, edit_yaml, hopperlab


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    return copy_project(tmp_path_factory.mktemp("dist") / "project")


def _site(project: Path, name: str, **keys) -> None:
    base = {"executor": "local", "poll_interval_s": 0.2,
            "resources": {"smoke": {"gpus": 0, "cpus": 1, "mem_gb": 1, "time_min": 5},
                          "full": {"gpus": 1, "cpus": 1, "mem_gb": 1, "time_min": 5}}}
    import yaml
    (project / "configs/sites" / f"{name}.yaml").write_text(yaml.safe_dump({**base, **keys}))


def test_resources_resolve_tasks_and_show_in_list(project):
    m = load_matrix(project, {"scale": "full"})
    tp = m.get("inference/tp-long-context/prompt-31k-c1").resources
    assert (tp.gpus, tp.nodes, tp.tasks_on_node, tp.world_size) == (4, 1, 4, 4)
    tp2 = m.get("inference/tp-long-context/prompt-3k-c8-2gpu").resources
    assert (tp2.gpus, tp2.world_size) == (2, 2)
    one = m.get("finetune/full-llama2-13b-sharded/torchao-offload-1gpu").resources
    assert (one.gpus, one.world_size) == (1, 1)
    smoke = load_matrix(project).get("finetune/full-llama2-13b-sharded/fsdp2").resources
    assert (smoke.gpus, smoke.world_size) == (0, 2)
    out = hopperlab(["list", "--json", "--config", "only=inference/tp-long-context"], project)
    rows = json.loads(out.stdout)
    sizes = {r["variant"]: r["resources"]["world_size"] for r in rows}
    assert sizes == {"prompt-31k-c1": 2, "prompt-3k-c8": 2, "prompt-31k-c1-1gpu": 1,
                     "prompt-3k-c8-1gpu": 1, "prompt-31k-c1-2gpu": 1,
                     "prompt-3k-c8-2gpu": 1}, out.stderr  # smoke: TP 2 rows on one process


@pytest.mark.integration
def test_caps_are_refused_before_submission_naming_file_and_key(project, tmp_path):
    _site(project, "capped", max_gpus_per_node=2, max_nodes=1)
    with pytest.raises(SpecError, match=r"experiments/inference.yaml.*tp-long-context.*"
                                        r"gpus_per_node.*max_gpus_per_node 2.*capped.yaml"):
        # (only the TP runs: membench/collective asks for 4 GPUs per node at full scale too)
        load_matrix(project, {"site": "capped", "scale": "full",
                              "only": "inference/tp-long-context"})
    # a plain `hopperlab submit` stops there too: no run directory, no job
    out = hopperlab(["submit", "inference/tp-long-context/prompt-31k-c1", "--no-upload",
                     "--config", "site=capped", "scale=full", f"results_dir={tmp_path}/r"],
                    project)
    assert out.returncode != 0 and "max_gpus_per_node" in out.stderr, out.stderr[-2000:]
    assert not (tmp_path / "r").exists()


def test_nodes_over_the_cap_and_on_the_local_executor_are_refused(project):
    edit_yaml(project / "experiments/selftest.yaml",
              lambda d: d["experiments"]["distributed"]["variants"].update(
                  {"two-nodes": {"resources": {"nodes": 2}}}))
    try:
        _site(project, "slurm-capped", executor="slurm", max_nodes=1)
        with pytest.raises(SpecError, match=r"two-nodes.*resources.nodes.*max_nodes 1"):
            load_matrix(project, {"site": "slurm-capped", "families": "selftest"})
        with pytest.raises(SpecError, match=r"two-nodes.*executor local runs on this one node"):
            load_matrix(project, {"families": "selftest"})
    finally:
        edit_yaml(project / "experiments/selftest.yaml",
                  lambda d: d["experiments"]["distributed"]["variants"].pop("two-nodes"))


def test_task_from_the_schedulers_environment():
    slurm = distributed.task_from_env({
        "SLURM_JOB_ID": "4242", "SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1",
        "SLURM_NODEID": "2", "SLURM_JOB_NUM_NODES": "4", "SLURM_JOB_NODELIST": "gpu[03-06]"})
    assert (slurm.rank, slurm.world_size, slurm.local_rank, slurm.node_rank, slurm.nodes,
            slurm.master_addr, slurm.launcher) == (5, 8, 1, 2, 4, "gpu03", "slurm")
    local = distributed.task_from_env({"SUBMITIT_LOCAL_NTASKS": "2", "SUBMITIT_LOCAL_GLOBALID": "1",
                                       "SUBMITIT_LOCAL_LOCALID": "1", "SUBMITIT_LOCAL_JOB_ID": "9",
                                       MASTER_PORT_ENV: "31111"})
    assert (local.rank, local.world_size, local.master_port, local.launcher) == (1, 2, 31111, "local")
    assert distributed.task_from_env({}).world_size == 1
    assert first_host("a1,b2") == "a1"
    assert first_host("n[7,9-10]") == "n7"


def _record(run_dir: Path) -> dict:
    return json.loads((run_dir / "record.json").read_text())


@pytest.mark.integration
def test_two_tasks_through_the_local_launcher(project, tmp_path):
    results = tmp_path / "results"
    out = hopperlab(["submit", "selftest/distributed/ok", "--no-upload", "--config",
                     "families=selftest", f"results_dir={results}"], project)
    assert out.returncode == 0, out.stderr[-3000:]
    run_dir = results / "selftest/distributed/ok"
    rec = _record(run_dir)
    assert rec["status"] == "ok" and rec["world_size"] == 2 and rec["nodes"] == 1
    assert rec["metrics"]["value"] == 3.0  # 1 + 2: the all-reduce saw both ranks
    assert [r["status"] for r in rec["ranks"]] == ["ok", "ok"]
    assert rec["node_hardware"] and json.loads((run_dir / "metrics.json").read_text())
    for r in (0, 1):
        assert (run_dir / f"ranks/{r}/steps.jsonl").read_text().count("\n") == 4
        assert (run_dir / f"ranks/{r}/logs/job.out").exists()
        assert (run_dir / f"ranks/{r}/hardware.json").exists()


@pytest.mark.integration
def test_a_rank_that_raises_fails_the_run_with_its_traceback(project, tmp_path):
    results = tmp_path / "results"
    out = hopperlab(["submit", "selftest/distributed/rank-raises", "--no-upload", "--config",
                     "families=selftest", f"results_dir={results}"], project, timeout=300)
    assert out.returncode != 0
    run_dir = results / "selftest/distributed/rank-raises"
    rec = _record(run_dir)
    assert rec["status"] == "failed" and rec["reason"].startswith("rank 1: RuntimeError"), rec
    tb = (run_dir / "traceback.txt").read_text()
    assert tb.startswith("rank 1") and "fails at step 1 on purpose" in tb
    assert not (run_dir / "metrics.json").exists()  # Snakemake retries it next time
    # ended by the peer's collective timeout (30 s), not by the job's time limit (issue 28
    # item 10: behaviour, not wall time)
    ends = [json.loads(x) for x in (run_dir / "history.jsonl").read_text().splitlines()]
    assert ends[-1]["event"] == "end" and ends[-1]["state"] != "TIMEOUT", ends[-1]
    assert not (results / "selftest/distributed/ok").exists()  # no other run touched


def test_a_killed_rank_is_named(tmp_path):
    from hopperlab.core.rundir import write_json_atomic
    from hopperlab.run import ranks

    peer = {"attempt": 1, "status": "failed", "metrics": {},
            "reason": "RuntimeError: Connection closed by peer [127.0.0.1]:1234"}
    write_json_atomic(tmp_path / "ranks/0/record.json", peer)
    rec = ranks.merged_record(tmp_path, 1, 2)
    assert rec["status"] == "failed" and rec["reason"].startswith("ranks [1] of 2 left no record")
    assert [r["reason"] for r in rec["ranks"]][1] == "no record"


def test_a_rank_lost_with_its_node_is_named_with_the_node(tmp_path):
    """A node that died took its rank's record with it, not the task file the rank wrote first."""
    from hopperlab.core.rundir import write_json_atomic
    from hopperlab.run import ranks

    peer = {"attempt": 1, "status": "failed", "metrics": {},
            "reason": "RuntimeError: Connection closed by peer [10.231.0.2]:1234"}
    write_json_atomic(tmp_path / "ranks/0/record.json", peer)
    write_json_atomic(tmp_path / "ranks/0/task.json", {"rank": 0, "host": "n1"})
    write_json_atomic(tmp_path / "ranks/1/task.json", {"rank": 1, "host": "n2"})
    rec = ranks.merged_record(tmp_path, 1, 2)
    assert rec["reason"].startswith("ranks [1] (on n2) of 2 left no record"), rec["reason"]
    assert [r["host"] for r in rec["ranks"]] == ["n1", "n2"]


def test_the_profile_wrapper_puts_each_task_under_its_rank(tmp_path):
    """`profiler: nsys|torch` of a distributed run: the command names ranks/{rank}/; each task's
    wrapper fills in its own rank (here task 1 of the local launcher)."""
    import os
    import subprocess
    import sys

    target = tmp_path / "ranks" / "{rank}"
    (tmp_path / "ranks/1").mkdir(parents=True)
    code = "import sys; open(sys.argv[1], 'w').write('seen')"
    env = {**os.environ, "SUBMITIT_LOCAL_NTASKS": "2", "SUBMITIT_LOCAL_GLOBALID": "1"}
    out = subprocess.run([sys.executable, "-m", "hopperlab.cli", "profile", "job", "--run-dir",
                          str(target), "--profiler", "torch", "--", sys.executable, "-c", code,
                          str(target / "seen")], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "ranks/1/seen").read_text() == "seen"
    assert str(tmp_path / "ranks/1") in out.stderr  # the profile was finished there


def add_hung_rank_variant(project: Path) -> None:
    edit_yaml(project / "experiments/selftest.yaml", lambda d: d["experiments"]["distributed"][
        "variants"].__setitem__("rank-hangs", {"params": {"hang_rank": 1, "fail_step": 1}}))


def check_hung_rank_run(run_dir: Path) -> None:
    """The run ended by its peer's collective timeout and our cancel, not by its time limit."""
    rec = _record(run_dir)
    assert rec["status"] == "failed", rec
    assert "rank 1 still ran" in rec["reason"] and "hung" in rec["reason"], rec["reason"]
    ends = [json.loads(x) for x in (run_dir / "history.jsonl").read_text().splitlines()]
    assert ends[-1]["event"] == "end" and ends[-1]["state"] == "CANCELLED", ends[-1]


@pytest.mark.integration
def test_a_hung_rank_is_cancelled_once_its_peers_gave_up_on_it(tmp_path):
    """Issue 28 item 10: a hung rank held the job to its time limit although its peers hit the
    collective timeout."""
    project = copy_project(tmp_path / "project")
    add_hung_rank_variant(project)
    out = hopperlab(["submit", "selftest/distributed/rank-hangs", "--no-upload", "--config",
                     "families=selftest"], project, timeout=400)
    assert out.returncode == 1, out.stdout[-2000:] + out.stderr[-3000:]
    check_hung_rank_run(project / "results/selftest/distributed/rank-hangs")


def test_a_run_of_several_ranks_keeps_rank_0s_samples_where_references_read_them(tmp_path):
    """A 2-GPU run measured with repeats (TP 2, 13B FSDP2): `references update` and `compare`
    read samples.jsonl in the run directory, as of a one-process run; the merge puts rank 0's
    there (its figures are the run's), not rank 1's."""
    from hopperlab.core.rundir import read_samples, write_json_atomic
    from hopperlab.run import ranks

    for r, value in ((0, 10.0), (1, 99.0)):
        write_json_atomic(tmp_path / f"ranks/{r}/record.json",
                          {"attempt": 1, "status": "ok", "metrics": {"x": value}})
        (tmp_path / f"ranks/{r}/samples.jsonl").write_text("".join(
            json.dumps({"repeat": i, "metrics": {"x": value + i}}) + "\n" for i in range(3)))
    rec = ranks.merged_record(tmp_path, 1, 2)
    ranks.write_run_files(tmp_path, rec)
    assert [s["x"] for s in read_samples(tmp_path)] == [10.0, 11.0, 12.0]
