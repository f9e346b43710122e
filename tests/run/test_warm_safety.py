"""The warm starter and the workflow's secrets, its cold starts and a frozen starter (issue 46:
D7, D6, D4). A job forked by the starter has the starter's process image, environment block
included (``/proc/<pid>/environ``, ``ps eww``): the starter is started with the jobs'
environment, no secret in it; then a workflow with ``HF_TOKEN`` set still starts its jobs warm.
A job started cold says why in its own output and record. A starter that does not answer costs
a job a bounded wait, then the job starts cold (or ends), naming the warm starter."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hopperlab.config.matrix import load_matrix
from hopperlab.core import rundir
from hopperlab.run import jobenv, runner, warm
from hopperlab.run.warm_client import COLD_ENV, FORKED_ENV, REPLY_S_ENV
from tests.helpers import REPO
from tests.run.test_warm import _said

SECRETS = {"MLFLOW_TRACKING_PASSWORD": "pw-issue46-d7-secret",
           "HF_TOKEN": "hf_issue46d6secrettoken"}

PROBE = """
import json, os, sys, time
print(json.dumps({"forked": os.environ.get(%r), "cold": os.environ.get(%r),
                  "pid": os.getpid()}), flush=True)
mode = sys.argv[1]
if mode == "sleep":
    time.sleep(60)
if mode == "nap":
    time.sleep(3)
sys.exit(3)
""" % (FORKED_ENV, COLD_ENV)


# -- what needs no process --------------------------------------------------------------------

def test_the_jobs_environment_has_the_sites_env_and_no_secret():
    env = jobenv.job_env({"PATH": "/bin", **SECRETS}, {"OMP_NUM_THREADS": 1})
    assert env == {"PATH": "/bin", "OMP_NUM_THREADS": "1"}


def test_a_secret_never_makes_a_job_start_cold(monkeypatch):
    monkeypatch.setattr(warm.threading, "active_count", lambda: 1)
    own = warm.import_env({"HF_HOME": "/hf", **SECRETS})
    job = {"argv": ["-u", "-m", "submitit.core._submit", "/f"], "env": {"HF_HOME": "/hf"}}
    assert warm.refusal(job, own) is None


def test_a_job_started_cold_says_why_in_its_record(tmp_path, monkeypatch):
    spec = load_matrix(REPO, {"families": "selftest"}).get("selftest/trivial/ok")
    spec_file = tmp_path / "run" / "spec.json"
    rundir.write_json_atomic(spec_file, {**spec.to_dict(), "attempt": 1})
    monkeypatch.delenv(FORKED_ENV, raising=False)
    monkeypatch.setenv(COLD_ENV, "the warm starter at /x.sock did not answer within 30 s")
    rec = runner.execute(str(spec_file))
    assert rec["status"] == "ok", rec
    assert rec["hardware"]["warm_start"] == (
        "started cold: the warm starter at /x.sock did not answer within 30 s")


# -- a real starter, started by a workflow that holds secrets ---------------------------------

@pytest.fixture(scope="module")
def starter(tmp_path_factory):
    folder = tmp_path_factory.mktemp("warm46")
    (folder / "probe46.py").write_text(PROBE)
    env_path = os.pathsep.join([str(folder), str(REPO / "src"), os.environ.get("PYTHONPATH", "")])
    with pytest.MonkeyPatch.context() as mp:  # as snakemake's environment
        for name, value in {**SECRETS, "PYTHONPATH": env_path}.items():
            mp.setenv(name, value)
        started = warm.Starter(folder / "starter.log")
        image = Path(f"/proc/{started.process.pid}/environ").read_bytes()
    deadline = time.monotonic() + 120
    while not Path(started.socket).exists():
        assert started.process.poll() is None, (folder / "starter.log").read_text()
        assert time.monotonic() < deadline, "the starter never listened"
        time.sleep(0.2)
    yield started, folder, env_path, image
    started.process.send_signal(signal.SIGCONT)
    started.stop()


def _client(starter, mode, name=None, **env):
    """A job as the local controller starts it: the job's environment (no secret)."""
    started, folder, env_path, _ = starter
    name = name or mode
    job_env = {**jobenv.job_env(os.environ, {}), "PYTHONPATH": env_path,
               "CUDA_VISIBLE_DEVICES": "", **env}
    out, err = open(folder / f"{name}.out", "w"), open(folder / f"{name}.err", "w")
    return subprocess.Popen([sys.executable, "-m", "hopperlab.run.warm_client", started.socket,
                             "-u", "-m", "probe46", mode], cwd=folder, env=job_env,
                            stdout=out, stderr=err)


def _holds_no_secret(image: bytes, what: str) -> None:
    for name, value in SECRETS.items():
        assert value.encode() not in image, f"{what} holds {name} in its environment block"


@pytest.mark.integration
def test_no_secret_in_the_starter_nor_in_a_job_it_forked_and_the_job_starts_warm(starter):
    started, folder, _, image = starter
    _holds_no_secret(image, "the starter")
    proc = _client(starter, "sleep")
    try:
        said = _said(folder, "sleep")
        assert said["forked"] == str(started.process.pid), said  # warm, with HF_TOKEN set
        _holds_no_secret(Path(f"/proc/{said['pid']}/environ").read_bytes(), "the forked job")
    finally:
        proc.kill()
        proc.wait(timeout=30)


@pytest.mark.integration
def test_a_job_started_cold_says_why_in_its_own_output(starter):
    _, folder, _, _ = starter
    proc = _client(starter, "exit", "refused", PYTHONFAULTHANDLER="1")
    assert proc.wait(timeout=120) == 3
    said = _said(folder, "refused")
    assert said["forked"] is None and "PYTHONFAULTHANDLER" in said["cold"], said
    err = (folder / "refused.err").read_text()
    assert ("hopperlab: warm start: job started cold: the warm starter refused it: the job's "
            "environment differs where imports read it: PYTHONFAULTHANDLER") in err, err


@pytest.mark.integration
def test_a_frozen_starter_costs_a_bounded_wait_then_the_job_starts_cold(starter):
    started, folder, _, _ = starter
    started.process.send_signal(signal.SIGSTOP)
    try:
        proc = _client(starter, "exit", "frozen", **{REPLY_S_ENV: "2"})
        assert proc.wait(timeout=45) == 3  # the job ran, cold
    finally:
        started.process.send_signal(signal.SIGCONT)
    said = _said(folder, "frozen")
    assert said["forked"] is None and "did not answer within 2 s" in said["cold"], said
    assert (f"job started cold: the warm starter at {started.socket} did not answer within 2 s"
            in (folder / "frozen.err").read_text())
    # the thawed starter forks the request it had queued: that child must run nothing
    after = _client(starter, "exit", "after")
    assert after.wait(timeout=60) == 3 and _said(folder, "after")["forked"]
    assert len((folder / "frozen.out").read_text().splitlines()) == 1


@pytest.mark.integration
def test_a_starter_frozen_while_its_job_runs_does_not_hold_the_job_past_its_end(starter):
    started, folder, _, _ = starter
    proc = _client(starter, "nap", **{REPLY_S_ENV: "2"})
    try:
        assert _said(folder, "nap")["forked"]
        started.process.send_signal(signal.SIGSTOP)
        assert proc.wait(timeout=45) == 1
    finally:
        started.process.send_signal(signal.SIGCONT)
    assert "ended but the warm starter did not say how within 2 s" in (
        folder / "nap.err").read_text()
