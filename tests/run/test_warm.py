"""The warm starter (run/warm.py, run/warm_client.py): a local job forked from one process that
imported torch and transformers once must still be the job it would have been as a fresh
python: its arguments, environment, working folder and output; its exit code or the signal
that ended it; Ctrl-C passed on; gone when its stand-in is killed; started cold where the
starter cannot take it."""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hopperlab.config.matrix import load_matrix
from hopperlab.node import oom_kills
from hopperlab.run import launch, warm
from hopperlab.run.warm_client import FORKED_ENV, SOCKET_ENV, recv_msg, send_msg
from tests.helpers import REPO

PROBE = """
import json, os, sys, time
print(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(), "x": os.environ.get("S37_X"),
                  "forked": os.environ.get("%s"), "torch": "torch" in sys.modules,
                  "pid": os.getpid()}), flush=True)
print("on stderr", file=sys.stderr, flush=True)
mode = sys.argv[1]
if mode == "exit3":
    sys.exit(3)
if mode == "sleep":
    time.sleep(60)
if mode == "kill9":
    os.kill(os.getpid(), 9)
""" % FORKED_ENV


# -- what needs no process --------------------------------------------------------------------

def test_a_message_carries_its_descriptors(tmp_path):
    a, b = socket.socketpair()
    with open(tmp_path / "f", "w") as f:
        send_msg(a, {"argv": ["-u", "-m", "x"], "big": "y" * 200_000}, [f.fileno()])
        msg, fds = recv_msg(b, max_fds=3)
    assert msg["argv"] == ["-u", "-m", "x"] and len(msg["big"]) == 200_000
    assert len(fds) == 1
    os.write(fds[0], b"through the passed descriptor")
    os.close(fds[0])
    assert (tmp_path / "f").read_text() == "through the passed descriptor"
    a.close()
    assert recv_msg(b) is None


def test_the_starter_refuses_what_it_cannot_start_as_it_would_start(monkeypatch):
    # the starter itself runs no Python thread; pytest's process may (earlier tests' leftovers)
    monkeypatch.setattr(warm.threading, "active_count", lambda: 1)
    own = {"PYTHONPATH": "/src", "HF_HOME": "/hf"}
    ok = {"argv": ["-u", "-m", "submitit.core._submit", "/f"],
          "env": {"PYTHONPATH": "/src", "HF_HOME": "/hf", "OMP_NUM_THREADS": "1", "PATH": "/x"}}
    assert warm.refusal(ok, warm.import_env(own)) is None  # pool sizes: the runner sets them
    other_path = {**ok, "env": {**ok["env"], "PYTHONPATH": "/elsewhere"}}
    assert "PYTHONPATH" in warm.refusal(other_path, warm.import_env(own))
    missing = {**ok, "env": {"PYTHONPATH": "/src"}}
    assert "HF_HOME" in warm.refusal(missing, warm.import_env(own))
    assert "does not run" in warm.refusal({**ok, "argv": ["script.py"]}, warm.import_env(own))
    monkeypatch.setattr(warm.threading, "active_count", lambda: 2)
    assert "thread" in warm.refusal(ok, warm.import_env(own))


def test_only_a_local_job_without_gpus_goes_to_the_starter(monkeypatch, tmp_path):
    matrix = load_matrix(REPO, {"scale": "smoke", "only": "membench/copy/h2d-pinned"})
    spec = matrix.runs["membench/copy/h2d-pinned"]
    run_dir = tmp_path / "run"
    monkeypatch.delenv(SOCKET_ENV, raising=False)
    assert shlex.split(launch.job_python(spec, run_dir)) == [sys.executable]
    monkeypatch.setenv(SOCKET_ENV, "/tmp/x.sock")
    assert shlex.split(launch.job_python(spec, run_dir)) == [
        sys.executable, "-m", "hopperlab.run.warm_client", "/tmp/x.sock"]
    full = load_matrix(REPO, {"scale": "full", "only": "membench/copy/h2d-pinned"})
    gpu_spec = full.runs["membench/copy/h2d-pinned"]
    assert gpu_spec.resources.gpus > 0
    assert shlex.split(launch.job_python(gpu_spec, run_dir)) == [sys.executable]


def test_the_oom_watch_reads_the_tasks_a_starter_forked(tmp_path):
    (tmp_path / oom_kills.STAND_IN_FILE.format(client=11)).write_text("1234\n")
    (tmp_path / oom_kills.STAND_IN_FILE.format(client=12)).write_text("garbage")
    assert oom_kills.stand_ins(tmp_path) == {1234}


# -- a real starter ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def starter(tmp_path_factory):
    folder = tmp_path_factory.mktemp("warm")
    (folder / "s37probe.py").write_text(PROBE)
    env_path = os.pathsep.join([str(folder), str(REPO / "src"), os.environ.get("PYTHONPATH", "")])
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = env_path
    try:
        started = warm.Starter(folder / "starter.log")
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH")
        else:
            os.environ["PYTHONPATH"] = saved
    deadline = time.monotonic() + 120
    while not Path(started.socket).exists():
        assert started.process.poll() is None, (folder / "starter.log").read_text()
        assert time.monotonic() < deadline, "the starter never listened"
        time.sleep(0.2)
    yield started, folder, env_path
    started.stop()
    assert started.process.poll() is not None and not Path(started.socket).exists()


def _client(starter, mode, **kw):
    started, folder, env_path = starter
    env = {**os.environ, "PYTHONPATH": env_path, "CUDA_VISIBLE_DEVICES": "", "S37_X": mode,
           **kw.pop("env", {})}
    out = open(folder / f"{mode}.out", "w")
    err = open(folder / f"{mode}.err", "w")
    proc = subprocess.Popen([sys.executable, "-m", "hopperlab.run.warm_client", started.socket,
                             "-u", "-m", "s37probe", mode, str(folder)],
                            cwd=folder, env=env, stdout=out, stderr=err)
    return proc, folder


def _said(folder, mode, wait_s=60.0):
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        text = (folder / f"{mode}.out").read_text()
        if text.strip():
            return json.loads(text.splitlines()[0])
        time.sleep(0.1)
    raise AssertionError(f"{mode}: the job said nothing")


@pytest.mark.integration
def test_a_forked_job_is_the_job_it_was_asked_to_be(starter):
    proc, folder = _client(starter, "exit3")
    assert proc.wait(timeout=60) == 3
    said = _said(folder, "exit3")
    assert said["forked"] == str(starter[0].process.pid)  # it came from the starter
    assert said["torch"] is True                            # with torch imported already
    assert said["argv"] == ["exit3", str(folder)] and said["cwd"] == str(folder)
    assert said["x"] == "exit3"                             # the client's environment
    assert (folder / "exit3.err").read_text().strip() == "on stderr"
    assert oom_kills.stand_ins(folder) >= {said["pid"]}     # named for the OOM watch


@pytest.mark.integration
def test_a_job_killed_by_a_signal_ends_its_stand_in_by_the_same_signal(starter):
    proc, _ = _client(starter, "kill9")
    assert proc.wait(timeout=60) == -signal.SIGKILL


@pytest.mark.integration
def test_ctrl_c_reaches_the_forked_job(starter):
    proc, folder = _client(starter, "sleep")
    _said(folder, "sleep")
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == -signal.SIGINT  # KeyboardInterrupt, as python ends on it
    assert "KeyboardInterrupt" not in (folder / "sleep.out").read_text()


@pytest.mark.integration
def test_a_killed_stand_in_takes_its_job_with_it(starter):
    proc, folder = _client(starter, "sleep")
    child = _said(folder, "sleep")["pid"]
    proc.kill()
    proc.wait(timeout=10)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{child}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(f"/proc/{child}").exists()


@pytest.mark.integration
def test_a_job_the_starter_refuses_runs_cold(starter):
    proc, folder = _client(starter, "exit3", env={"PYTHONFAULTHANDLER": "1"})
    assert proc.wait(timeout=120) == 3
    said = _said(folder, "exit3")
    assert said["forked"] is None and said["torch"] is False
    assert "PYTHONFAULTHANDLER" in (folder / "starter.log").read_text()


def test_the_workflow_starts_a_starter_only_for_local_jobs_without_gpus(monkeypatch, tmp_path):
    from hopperlab.cli import workflow as wf

    said = []

    class Recorded:  # the starter's process is the integration tests' (below)
        def __init__(self, log, site_env=None):
            self.socket = str(tmp_path / "starter.sock")
            said.append(("started", log.name))

        def stop(self):
            said.append(("stopped", None))

    monkeypatch.setattr(wf, "Starter", Recorded)
    monkeypatch.delenv(SOCKET_ENV, raising=False)
    monkeypatch.delenv(wf.WARM_START_ENV, raising=False)
    smoke = load_matrix(REPO, {"scale": "smoke", "only": "membench/copy"})
    full = load_matrix(REPO, {"scale": "full", "only": "membench/copy"})
    assert not wf.start_warm_starter(full, list(full.runs))  # every job holds a GPU
    assert not wf.start_warm_starter(smoke, [])               # nothing to run
    monkeypatch.setenv(wf.WARM_START_ENV, "0")
    assert not wf.start_warm_starter(smoke, list(smoke.runs))
    monkeypatch.delenv(wf.WARM_START_ENV)
    assert said == []
    assert wf.start_warm_starter(smoke, list(smoke.runs))
    assert os.environ[SOCKET_ENV] == str(tmp_path / "starter.sock")
    assert not wf.start_warm_starter(smoke, list(smoke.runs))  # one per workflow
    wf.stop_warm_starter()
    assert SOCKET_ENV not in os.environ
    assert said == [("started", wf.WARM_LOG), ("stopped", None)]


@pytest.mark.integration
@pytest.mark.parametrize("early", [False, True], ids=["listening", "importing"])
def test_a_starter_whose_workflow_was_killed_goes_too(tmp_path, early):
    """SIGKILL to the workflow runs no atexit: the starter must not stay behind (it holds
    torch and transformers in memory, in a session of its own)."""
    script = ("import sys, time; from pathlib import Path; from hopperlab.run import warm; "
              f"s = warm.Starter(Path({str(tmp_path)!r}) / 'starter.log'); "
              "print(s.process.pid, s.socket, flush=True); time.sleep(600)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"),
                                                        os.environ.get("PYTHONPATH", "")])}
    workflow = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE,
                                text=True)
    pid, sock = workflow.stdout.readline().split()
    if not early:
        deadline = time.monotonic() + 120
        while not Path(sock).exists():
            assert time.monotonic() < deadline, (tmp_path / "starter.log").read_text()
            time.sleep(0.2)
    workflow.kill()  # early: while the starter still imports
    workflow.wait()
    deadline = time.monotonic() + 120  # (an importing starter ends once its imports are done)
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().split(")")[-1].split()[0] == "Z":
                break  # ended; its parent (init here) reaps it
        time.sleep(0.1)
    state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] if Path(
        f"/proc/{pid}").exists() else "gone"
    assert state in ("gone", "Z"), state
    assert not Path(sock).exists()
