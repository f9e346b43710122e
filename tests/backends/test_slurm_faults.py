"""Slurm faults on the real one-node test cluster: accounting (slurmdbd, so sacct) down while a
job is cancelled and another runs out of its time limit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.helpers import copy_project, default_signals

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(900)]

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
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=default_signals)


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


# --------------------------------------------------------------------------- issue 28
def _dead_controller(tmp_path: Path) -> dict[str, str]:
    """Slurm installed, its daemons stopped: a slurm.conf whose controller port nobody serves."""
    host = subprocess.run(["hostname", "-s"], capture_output=True, text=True).stdout.strip()
    conf = tmp_path / "slurm-down.conf"
    conf.write_text(f"ClusterName=down\nSlurmctldHost={host}(127.0.0.1)\nSlurmctldPort=6977\n"
                    f"SlurmdPort=6978\nNodeName={host} NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN\n"
                    "PartitionName=debug Nodes=ALL Default=YES State=UP\n")
    return {"SLURM_CONF": str(conf)}


def _site(project: Path, name: str, partition: str, sleep_s: float | None = None) -> None:
    site = {"description": "a Slurm site of the tests", "executor": "slurm",
            "poll_interval_s": 1, "slurm": {"partition": partition},
            "resources": {"smoke": {"gpus": 0, "cpus": 1, "mem_gb": 1, "time_min": 5},
                          "full": {"gpus": 0, "cpus": 1, "mem_gb": 1, "time_min": 5}}}
    (project / f"configs/sites/{name}.yaml").write_text(yaml.safe_dump(site))


def _events(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "history.jsonl").read_text().splitlines()]


@pytest.mark.integration
def test_the_slurm_profile_with_slurm_down_moves_nothing_and_says_so_in_one_line(tmp_path):
    """Issue 28 item 1: after a local run, `snakemake --profile profiles/slurm` on a node whose
    Slurm is installed but not running took every finished run apart (moved to attempts/, a
    start without an end), printed a traceback per run, and the next call redid them all."""
    from tests.helpers import hopperlab, snakemake

    project = copy_project(tmp_path / "project")
    _site(project, "slurm-down", "debug")
    select = ["families=selftest", "only=selftest/faults/ok"]
    first = snakemake(["--cores", "2", "--config", *select], project)
    assert first.returncode == 0, first.stderr[-3000:]
    run_dir = project / "results/selftest/faults/ok"
    before = _events(run_dir)

    down = _dead_controller(tmp_path)
    out = snakemake(["--profile", "profiles/slurm", "--config", "site=slurm-down", *select],
                    project, env=down)
    text = out.stdout + out.stderr
    assert out.returncode != 0
    said = [ln for ln in text.splitlines() if "cannot reach a Slurm controller" in ln]
    assert len(said) == 1 and "configs/sites/slurm-down.yaml" in said[0], text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    assert (run_dir / "metrics.json").exists() and not (run_dir / "attempts").exists()
    assert _events(run_dir) == before

    sub = hopperlab(["submit", "selftest/faults/ok", "--no-upload", "--config",
                     "site=slurm-down", *select], project, env=down)
    assert sub.returncode == 2 and "Traceback" not in sub.stderr, sub.stderr[-3000:]
    assert len(sub.stderr.strip().splitlines()) == 1, sub.stderr
    assert (run_dir / "metrics.json").exists() and not (run_dir / "attempts").exists()

    again = snakemake(["--cores", "2", "--config", *select], project)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads((run_dir / "metrics.json").read_text())["attempt"] == 1
    assert [e["event"] for e in _events(run_dir)] == ["start", "submitted", "end"]


@pytest.mark.integration
def test_a_partition_sbatch_refuses_keeps_the_finished_attempt_and_says_why(tmp_path,
                                                                             slurm_cluster):
    """Issue 28 items 1 and 10: a job sbatch refuses (a partition it does not know) must not
    retire the finished attempt, nor end in a traceback; a run with no earlier attempt gets a
    failed record naming the reason."""
    from tests.helpers import hopperlab

    project = copy_project(tmp_path / "project")
    _site(project, "slurm-test", slurm_cluster.partition)
    _site(project, "slurm-nopart", "no-such-partition")
    ok = hopperlab(["submit", "selftest/faults/ok", "--no-upload", "--config", "site=slurm-test",
                    "families=selftest"], project, env=slurm_cluster.env)
    assert ok.returncode == 0, ok.stdout[-2000:] + ok.stderr[-2000:]
    for variant, earlier in (("ok", True), ("skipped", False)):
        run_dir = project / f"results/selftest/faults/{variant}"
        out = hopperlab(["submit", f"selftest/faults/{variant}", "--no-upload", "--config",
                         "site=slurm-nopart", "families=selftest"], project,
                        env=slurm_cluster.env)
        text = out.stdout + out.stderr
        assert out.returncode == 1 and "Traceback" not in text, text[-3000:]
        assert "invalid partition" in text.lower(), text[-3000:]
        rec = json.loads((run_dir / "record.json").read_text())
        if earlier:  # the finished attempt stays in place, as if nothing happened
            assert rec["attempt"] == 1 and rec["status"] == "ok", rec
            assert (run_dir / "metrics.json").exists() and not (run_dir / "attempts").exists()
        else:
            assert rec["status"] == "failed" and "invalid partition" in rec["reason"].lower()


def _submit_slow(project: Path, cluster) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "hopperlab.cli", "submit", "selftest/faults/slow40", "--no-upload",
         "--config", "site=slurm-test", "families=selftest"], cwd=project,
        env={**os.environ, **cluster.env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True)


def _slow_variant(project: Path, sleep_s: float) -> None:
    from tests.helpers import edit_yaml

    edit_yaml(project / "experiments/selftest.yaml", lambda d: d["experiments"]["faults"][
        "variants"].__setitem__("slow40", {"params": {"action": "sleep", "sleep_s": sleep_s}}))


def _state(cluster, job_id: str) -> str:
    return cluster.run(["squeue", "-h", "--states=all", "-o", "%T", "-j", job_id]).stdout.strip()


def test_sigint_or_sigterm_to_the_submitter_cancels_its_slurm_job(tmp_path, slurm_cluster):
    """Issue 28 item 4: nothing cancelled the job when `hopperlab submit` was interrupted."""
    import signal

    project = copy_project(tmp_path / "project")
    _site(project, "slurm-test", slurm_cluster.partition)
    _slow_variant(project, 40)
    run_dir = project / "results/selftest/faults/slow40"
    seen: set[str] = set()
    for attempt, sig in ((1, signal.SIGINT), (2, signal.SIGTERM)):
        proc = _submit_slow(project, slurm_cluster)
        try:
            deadline = time.monotonic() + 120
            while not (ids := {p.name.split("_")[0] for p in (run_dir / "submitit").glob(
                    "*_submitted.pkl")} - seen):
                assert time.monotonic() < deadline, "no job submitted"
                time.sleep(0.5)
            job_id = ids.pop()
            seen.add(job_id)
            _wait_running(slurm_cluster, job_id)
            proc.send_signal(sig)
            out = proc.communicate(timeout=180)[0]
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 128 + sig, out[-3000:]
        assert _state(slurm_cluster, job_id) in ("", "CANCELLED"), out[-3000:]
        end = _events(run_dir)[-1]
        assert end["event"] == "end" and end["attempt"] == attempt, out[-3000:]
        rec = json.loads((run_dir / "record.json").read_text())
        assert rec["status"] == "failed" and sig.name in rec["reason"], rec


def test_a_killed_submitters_job_is_cancelled_before_the_next_attempt_of_a_changed_spec(
        tmp_path, slurm_cluster):
    """Issue 28 item 4: after the submitter died (SIGKILL: it cannot cancel), the spec was
    fixed (sleep_s 40 -> 5) and the run resubmitted: attempt 2 ran beside the old job, whose
    record then overwrote attempt 2's."""
    project = copy_project(tmp_path / "project")
    _site(project, "slurm-test", slurm_cluster.partition)
    _slow_variant(project, 40)
    run_dir = project / "results/selftest/faults/slow40"
    proc = _submit_slow(project, slurm_cluster)
    try:
        old_job = _job_id(run_dir)
        _wait_running(slurm_cluster, old_job)
        proc.kill()
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    _slow_variant(project, 5)
    again = _submit_slow(project, slurm_cluster)
    out = again.communicate(timeout=WAIT_S)[0]
    assert again.returncode == 0, out[-3000:]
    assert f"job {old_job} of attempt 1 still runs an older spec; cancelling it" in out, out
    assert _state(slurm_cluster, old_job) in ("", "CANCELLED")
    time.sleep(3)
    spec = json.loads((run_dir / "spec.json").read_text())
    rec = json.loads((run_dir / "record.json").read_text())
    assert spec["attempt"] == rec["attempt"] == 2 and rec["run_uid"] == spec["run_uid"], rec
    assert spec["params"]["sleep_s"] == 5 and rec["status"] == "ok"


@pytest.mark.integration
def test_a_sites_env_reaches_every_slurm_task_and_the_secrets_do_not(tmp_path, slurm_cluster):
    """Issue 28 items 9 and 10, through Slurm: the site's `env:` verbatim (no shell) in the job;
    MLFLOW_TRACKING_PASSWORD and HF_TOKEN neither in the job nor in Slurm's saved environment."""
    from tests.helpers import hopperlab
    from tests.run.test_faults_local import SECRETS, _env_variant, check_job_environment

    project = copy_project(tmp_path / "project")
    _site(project, "slurm-test", slurm_cluster.partition)
    _env_variant(project, "slurm-test")
    out = hopperlab(["submit", "selftest/faults/env", "--no-upload", "--config",
                     "site=slurm-test", "families=selftest"], project,
                    env={**slurm_cluster.env, **SECRETS})
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    run_dir = project / "results/selftest/faults/env"
    check_job_environment(run_dir)
    job = json.loads((run_dir / "record.json").read_text())["slurm"]["job_id"]
    saved = list(slurm_cluster.dir.rglob(f"job.{job}/environment")) + list(
        slurm_cluster.dir.rglob(f"hash.*/job.{job}/environment"))
    for path in saved:  # slurmctld's copy of the job's environment, when still kept
        data = path.read_bytes()
        assert b"hf_secret_token" not in data and b"pw-secret" not in data, path


def test_a_run_waiting_on_drained_nodes_says_why(tmp_path, slurm_cluster):
    """Issue 28 item 10: on a drained node a run waited with no word."""

    project = copy_project(tmp_path / "project")
    _site(project, "slurm-test", slurm_cluster.partition)
    nodes = slurm_cluster.run(["sinfo", "-h", "-o", "%N", "-p", slurm_cluster.partition]
                              ).stdout.strip()
    slurm_cluster.run(["scontrol", "update", f"nodename={nodes}", "state=drain",
                       "reason=hopperlab test"], check=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "hopperlab.cli", "submit", "selftest/faults/ok", "--no-upload",
         "--config", "site=slurm-test", "families=selftest"], cwd=project,
        env={**os.environ, **slurm_cluster.env}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    import queue
    import threading

    lines: queue.Queue = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(ln) for ln in proc.stdout], daemon=True)
    reader.start()
    said: list[str] = []
    try:
        deadline = time.monotonic() + 90  # a word within a few polls, or none at all
        while not any("waits in the queue" in ln for ln in said) and time.monotonic() < deadline:
            try:
                said.append(lines.get(timeout=1))
            except queue.Empty:
                pass
    finally:
        slurm_cluster.run(["scontrol", "update", f"nodename={nodes}", "state=resume"])
    proc.wait(timeout=WAIT_S)
    reader.join(timeout=30)
    while not lines.empty():
        said.append(lines.get())
    text = "".join(said)
    assert proc.returncode == 0, text[-3000:]
    line = next((ln for ln in said if "waits in the queue" in ln), None)
    assert line is not None, text[-3000:]
    assert "ReqNodeNotAvail" in line or "drained" in line, line
    assert "sinfo -R" in line, line


@pytest.mark.integration
def test_a_hung_rank_on_slurm_is_cancelled_once_its_peers_gave_up_on_it(tmp_path, slurm_cluster):
    """Issue 28 item 10, through Slurm: the hung rank held the job to its time limit."""
    from tests.helpers import hopperlab
    from tests.run.test_distributed import add_hung_rank_variant, check_hung_rank_run

    project = copy_project(tmp_path / "project")
    _site(project, "slurm-test", slurm_cluster.partition)
    add_hung_rank_variant(project)
    out = hopperlab(["submit", "selftest/distributed/rank-hangs", "--no-upload", "--config",
                     "site=slurm-test", "families=selftest"], project, env=slurm_cluster.env,
                    timeout=WAIT_S)
    assert out.returncode == 1, out.stdout[-2000:] + out.stderr[-3000:]
    check_hung_rank_run(project / "results/selftest/distributed/rank-hangs")
