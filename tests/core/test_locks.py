"""hopperlab.locks: one writer per results folder and run directory, stale locks taken over."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from hopperlab.core import locks


@pytest.fixture
def other_live_process():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    yield proc
    proc.kill()
    proc.wait()


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _write_holder(path, **holder):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"since": "earlier", "cwd": "/elsewhere", **holder}))


def test_acquire_names_this_process_and_release_removes_it(tmp_path):
    path = tmp_path / "results" / locks.RESULTS_LOCK
    assert locks.acquire(path, "results") is True
    holder = json.loads(path.read_text())
    assert holder["host"] == socket.gethostname() and holder["pid"] == os.getpid()
    assert locks.acquire(path, "results") is False  # held already: nothing to do
    locks.release(path)
    assert not path.exists()


def test_a_live_holder_is_refused_with_its_host_and_pid(tmp_path, other_live_process):
    path = tmp_path / locks.RUN_LOCK
    _write_holder(path, host=socket.gethostname(), pid=other_live_process.pid)
    with pytest.raises(locks.LockHeld) as err:
        locks.acquire(path, "run directory X")
    text = str(err.value)
    assert f"pid {other_live_process.pid} on host {socket.gethostname()}" in text
    assert "run directory X" in text and str(path) in text
    locks.release(path)  # not ours: left alone
    assert path.exists()
    with pytest.raises(locks.LockHeld):
        locks.check_free(path, "run directory X")
    locks.check_free(path, "run directory X",
                     allowed={f"{socket.gethostname()}:{other_live_process.pid}"})


def test_a_dead_holder_on_this_host_is_stale_and_taken_over(tmp_path):
    path = tmp_path / locks.RUN_LOCK
    _write_holder(path, host=socket.gethostname(), pid=_dead_pid())
    locks.check_free(path, "x")
    assert locks.acquire(path, "x") is True
    assert json.loads(path.read_text())["pid"] == os.getpid()


def test_a_reused_pid_is_stale(tmp_path, other_live_process):
    path = tmp_path / locks.RUN_LOCK
    _write_holder(path, host=socket.gethostname(), pid=other_live_process.pid, start="1")
    assert locks.acquire(path, "x") is True  # that pid now belongs to a later process


def test_a_holder_on_another_host_is_never_taken_over(tmp_path):
    path = tmp_path / locks.RUN_LOCK
    _write_holder(path, host="some-other-node", pid=_dead_pid())
    with pytest.raises(locks.LockHeld, match="on host some-other-node"):
        locks.acquire(path, "x")


def test_holding_releases_what_it_took(tmp_path):
    path = tmp_path / locks.RUN_LOCK
    with locks.holding(path, "x"):
        assert path.exists()
    assert not path.exists()


@pytest.mark.parametrize("text", ['[1, 2]', '"a string"', '7', 'null',
                                  '{"host": "%s", "pid": "not-a-number"}',
                                  '{"host": ["x"], "pid": 1}'])
def test_a_wrong_typed_lock_file_is_taken_over_never_a_crash(tmp_path, text):
    """Issue 28 item 10: such a results lock crashed the workflow's onstart, naming no file."""

    path = tmp_path / ".hopperlab" / "writer.lock"
    path.parent.mkdir()
    path.write_text(text.replace("%s", socket.gethostname()))
    assert locks.acquire(path, "results folder x")
    assert locks.read_holder(path)["pid"] == os.getpid()
