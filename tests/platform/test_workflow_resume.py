"""The workflow after a failure, an interrupt or beside a second writer (issue 16, items 1, 4, 5):
real snakemake runs of the selftest family, small and quick.

- a failed run is retried by the next plain call, and a newly selected run runs;
- runs that finished before an interrupt (SIGINT, or SIGKILL then --unlock) are adopted, not
  redone as attempt 2, while `--forcerun` still redoes one;
- a second checkout writing into the same results folder is refused, naming the holder.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.helpers import copy_project, default_signals, edit_yaml, snakemake

pytestmark = pytest.mark.timeout(900)

#: a run that sleeps long enough to be interrupted (or overlapped) while it runs
SLOW_S = 8


def _add_slow_variant(project: Path) -> None:
    def change(data):
        data["experiments"]["faults"]["variants"]["slow"] = {
            "params": {"action": "sleep", "sleep_s": SLOW_S}}
    edit_yaml(project / "experiments/selftest.yaml", change)


def _config(*keys: str, results: str = "results") -> list[str]:
    return ["--config", "families=selftest", f"only={','.join(keys)}", f"results_dir={results}"]


def _start(project: Path, args: list[str]) -> subprocess.Popen:
    log = open(project / f"snakemake-{time.monotonic_ns()}.log", "w")  # noqa: SIM115 - Popen writes it
    return subprocess.Popen([sys.executable, "-m", "snakemake", "--cores", "2", *args],
                            cwd=project, stdout=log, stderr=subprocess.STDOUT,
                            preexec_fn=default_signals)


def _wait_for(predicate, what: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.1)


def _spec_attempt(run_dir: Path) -> int | None:
    """The attempt ``spec.json`` names, or None while there is none: a new attempt moves the
    last one's files to ``attempts/<n>/`` before it writes its own spec, so a poll can land
    in between and find no file."""
    try:
        return json.loads((run_dir / "spec.json").read_text()).get("attempt")
    except (OSError, ValueError):
        return None


def _history(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]


def _mlflow_children(results: Path, variant: str) -> list:
    from mlflow import MlflowClient
    client = MlflowClient(f"sqlite:///{results / 'mlflow.db'}")
    exp = client.get_experiment_by_name("selftest")
    return [r for r in client.search_runs([exp.experiment_id], max_results=100)
            if r.data.tags.get("hopperlab.variant") == variant]


@pytest.mark.integration
def test_failed_run_is_retried_and_a_new_selection_runs(tmp_path):
    project = copy_project(tmp_path / "project")
    base = project / "results-da/selftest/faults"
    first = snakemake(["--cores", "2", "--keep-going",
                       *_config("selftest/faults/raises", "selftest/faults/ok",
                                results="results-da")], project)
    assert first.returncode != 0
    assert (project / "results-da/report.html").exists()  # written by onerror
    assert json.loads((base / "raises/record.json").read_text())["status"] == "failed"
    assert not (base / "raises/metrics.json").exists()

    second = snakemake(["--cores", "2", "--keep-going",
                        *_config("selftest/faults/raises", "selftest/faults/ok",
                                 "selftest/faults/oom", results="results-da")], project)
    text = second.stdout + second.stderr
    assert "Nothing to be done" not in text, text[-3000:]
    assert json.loads((base / "oom/record.json").read_text())["status"] == "oom"  # it ran
    assert json.loads((base / "raises/record.json").read_text())["attempt"] == 2  # retried
    assert [e["attempt"] for e in _history(base / "ok")
            if e["event"] != "submitted"] == [1, 1]  # ok was left alone
    rows = (project / "results-da/summary.csv").read_text()
    assert ",oom," in rows


@pytest.mark.integration
@pytest.mark.parametrize("interrupt", ["sigint", "sigkill"])
def test_runs_finished_before_an_interrupt_are_adopted_not_redone(tmp_path, interrupt):
    project = copy_project(tmp_path / "project")
    _add_slow_variant(project)
    config = _config("selftest/faults/slow")
    run_dir = project / "results/selftest/faults/slow"
    proc = _start(project, config)
    # interrupt while the job runs (it has fingerprinted the node and sleeps)
    _wait_for(lambda: (run_dir / "hardware.json").exists(), "the job to start")
    if interrupt == "sigint":
        proc.send_signal(signal.SIGINT)  # Snakemake waits for the job, then stops
        proc.wait(timeout=600)
    else:
        proc.kill()  # Snakemake dies; its job goes on and finishes
        proc.wait(timeout=60)
    # the local site uploads at the workflow's end (tracking.upload: at-end): a killed workflow
    # has not, the next one does; either way the run is uploaded once (asserted below)
    _wait_for(lambda: (run_dir / "record.json").exists()
              and not (run_dir / ".writer.lock").exists(), "the run to finish")
    assert json.loads((run_dir / "record.json").read_text())["status"] == "ok"
    if interrupt == "sigkill":
        unlock = snakemake(["--unlock", *config], project)
        assert unlock.returncode == 0, unlock.stderr[-2000:]

    again = snakemake(["--cores", "2", *config], project)  # the profile reruns incomplete jobs
    assert again.returncode == 0, again.stderr[-3000:]
    assert "adopted, not rerun" in again.stdout + again.stderr
    assert json.loads((run_dir / "metrics.json").read_text())["attempt"] == 1
    assert [e["event"] for e in _history(run_dir)] == ["start", "submitted", "end", "adopted"]
    assert not (run_dir / "attempts").exists()
    assert len(_mlflow_children(project / "results", "slow")) == 1

    if interrupt == "sigint":  # asking for a rerun still reruns
        target = "results/selftest/faults/slow/metrics.json"
        forced = snakemake(["--cores", "2", "--forcerun", target, *config], project)
        assert forced.returncode == 0, forced.stderr[-3000:]
        assert json.loads((run_dir / "metrics.json").read_text())["attempt"] == 2
        assert len(_mlflow_children(project / "results", "slow")) == 2


@pytest.mark.integration
def test_second_checkout_is_refused_while_the_first_writes(tmp_path):
    first = copy_project(tmp_path / "first")
    second = copy_project(tmp_path / "second")
    _add_slow_variant(first)
    shared = tmp_path / "shared-results"
    writer = _start(first, _config("selftest/faults/slow", results=str(shared)))
    slow = shared / "selftest/faults/slow"
    _wait_for(lambda: (slow / "spec.json").exists(), "the first checkout's run to start")

    refused = snakemake(["--cores", "2", *_config("selftest/faults/ok", results=str(shared))],
                        second)
    text = refused.stdout + refused.stderr
    assert refused.returncode != 0
    assert f"pid {writer.pid} on host {socket.gethostname()}" in text, text[-3000:]
    assert not (shared / "selftest/faults/ok").exists()  # nothing written

    assert writer.wait(timeout=600) == 0
    assert json.loads((slow / "record.json").read_text())["status"] == "ok"
    assert not (shared / ".hopperlab/writer.lock").exists()  # given back at the end
    after = snakemake(["--cores", "2", *_config("selftest/faults/ok", results=str(shared))],
                      second)
    assert after.returncode == 0, after.stderr[-3000:]
    assert json.loads((shared / "selftest/faults/ok/record.json").read_text())["status"] == "ok"


def test_hand_run_submit_is_refused_on_a_run_directory_another_process_writes(tmp_path):
    project = copy_project(tmp_path / "project")
    run_dir = project / "results/selftest/faults/ok"
    run_dir.mkdir(parents=True)
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        (run_dir / ".writer.lock").write_text(json.dumps(
            {"host": socket.gethostname(), "pid": holder.pid, "since": "now", "cwd": "elsewhere"}))
        out = subprocess.run(
            [sys.executable, "-m", "hopperlab.cli", "submit", "selftest/faults/ok", "--no-upload",
             "--config", "families=selftest", "only=selftest/faults/ok"],
            cwd=project, capture_output=True, text=True, timeout=300, check=False)
    finally:
        holder.kill()
        holder.wait()
    assert out.returncode == 2, out.stderr  # an expected error
    assert f"pid {holder.pid} on host {socket.gethostname()}" in out.stderr
    assert "Traceback" not in out.stderr
    assert not (run_dir / "spec.json").exists()


@pytest.mark.integration
def test_ctrl_c_to_the_process_group_after_the_job_recorded_ok_adopts_it(tmp_path):
    """Issue 28 item 3: a terminal's Ctrl-C reaches the whole process group, `hopperlab submit`
    included. A run whose job wrote its `ok` record before the submit could append the
    history's `end` line was redone by the next call (and reached MLflow twice)."""
    project = copy_project(tmp_path / "project")
    _add_slow_variant(project)
    site = yaml.safe_load((project / "configs/sites/local.yaml").read_text())
    site["poll_interval_s"] = 1  # the submit looks at its job once a second: a window to hit
    (project / "configs/sites/slow-poll.yaml").write_text(yaml.safe_dump(site))
    config = [*_config("selftest/faults/slow"), "site=slow-poll"]
    run_dir = project / "results/selftest/faults/slow"
    log = open(project / "snakemake-pg.log", "w")  # noqa: SIM115 - Popen writes it
    proc = subprocess.Popen([sys.executable, "-m", "snakemake", "--cores", "2", *config],
                            cwd=project, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True,  # its own group, as a terminal's job is
                            preexec_fn=default_signals)

    def recorded_ok() -> bool:
        try:
            return json.loads((run_dir / "record.json").read_text())["status"] == "ok"
        except (OSError, ValueError, KeyError):
            return False

    _wait_for(recorded_ok, "the job's ok record")
    ended_before = any(e["event"] == "end" for e in _history(run_dir))
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: every process of the group
    proc.wait(timeout=600)
    _wait_for(lambda: not (run_dir / ".writer.lock").exists(), "the submit to let go")

    again = snakemake(["--cores", "2", *config], project)
    text = again.stdout + again.stderr
    assert again.returncode == 0, text[-3000:]
    assert json.loads((run_dir / "metrics.json").read_text())["attempt"] == 1, text[-3000:]
    assert not any(e["event"] == "start" and e["attempt"] == 2 for e in _history(run_dir))
    assert len(_mlflow_children(project / "results", "slow")) == 1
    assert not ended_before or "adopted" in text  # the window was hit, or at least adopted


@pytest.mark.integration
def test_a_killed_hopperlab_run_leaves_the_finished_attempt_adoptable(tmp_path):
    """Issue 28 item 2: a killed `hopperlab run` left a dangling attempt, and the next
    `snakemake` redid the run although an `ok` earlier attempt was on disk."""
    project = copy_project(tmp_path / "project")
    _add_slow_variant(project)
    config = _config("selftest/faults/slow")
    run_dir = project / "results/selftest/faults/slow"
    first = snakemake(["--cores", "2", *config], project)
    assert first.returncode == 0, first.stderr[-3000:]
    by_hand = subprocess.Popen([sys.executable, "-m", "hopperlab.cli", "run",
                                "selftest/faults/slow", "--no-upload", "--config",
                                *config[1:]], cwd=project)
    _wait_for(lambda: _spec_attempt(run_dir) == 2 and (run_dir / "hardware.json").exists(),
              "the hand run to start")
    by_hand.kill()
    by_hand.wait(timeout=60)
    (run_dir / ".writer.lock").unlink(missing_ok=True)  # SIGKILL: no chance to let go

    again = snakemake(["--cores", "2", *config], project)
    text = again.stdout + again.stderr
    assert again.returncode == 0, text[-3000:]
    assert "adopted, not rerun" in text, text[-3000:]
    assert json.loads((run_dir / "metrics.json").read_text())["attempt"] == 1
    assert not any(e["event"] == "start" and e["attempt"] == 3 for e in _history(run_dir))
    assert (run_dir / "attempts/2").is_dir()  # the killed attempt's files, kept aside
