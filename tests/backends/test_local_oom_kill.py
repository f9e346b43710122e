"""Issue 37, item 5: a local job the kernel kills for its memory is ``oom`` with the kernel's
word (exit by SIGKILL, the memory cgroup's ``oom_kill`` count), never the last stray line of
its stderr (a warning). A real kill: the submitter runs in a memory cgroup of its own with a
cap, and the job fills memory past it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from hopperlab.node import oom_kills
from hopperlab.run import warm
from hopperlab.run.warm_client import SOCKET_ENV
from tests.helpers import copy_project

pytestmark = pytest.mark.timeout(300)

CAP_BYTES = 768 << 20
VARIANT = """      exhausts-memory: {params: {action: exhaust-memory, exhaust_gib: 4}}
"""


@pytest.fixture
def capped_cgroup():
    """A child of this process's memory cgroup (v1 or v2) with a 768 MiB cap."""
    found = oom_kills.memory_cgroup()
    if found is None:
        pytest.skip("no memory cgroup is mounted here")
    parent, counter = found
    child = parent / f"hopperlab-test-{uuid.uuid4().hex[:8]}"
    try:
        child.mkdir()
        limit = "memory.limit_in_bytes" if counter == oom_kills.V1_CONTROL else "memory.max"
        (child / limit).write_text(str(CAP_BYTES))
    except OSError as exc:
        pytest.skip(f"cannot make a capped memory cgroup under {parent}: {exc}")
    try:
        yield child
    finally:
        try:
            child.rmdir()
        except OSError:
            pass


@pytest.fixture
def starter(tmp_path, monkeypatch):
    """A warm starter (run/warm.py) outside the capped cgroup, listening."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(sys.path))
    started = warm.Starter(tmp_path / "starter.log")
    try:
        deadline = time.monotonic() + 120
        while not Path(started.socket).exists():
            assert started.process.poll() is None, (tmp_path / "starter.log").read_text()
            assert time.monotonic() < deadline, "the starter never listened"
            time.sleep(0.2)
        yield started
    finally:
        started.stop()


@pytest.mark.integration
@pytest.mark.parametrize("warm_start", [False, True], ids=["fresh-python", "warm-starter"])
def test_a_job_the_kernel_killed_for_memory_is_oom_with_the_kernels_word(tmp_path,
                                                                          capped_cgroup,
                                                                          warm_start, request):
    project = copy_project(tmp_path / "project")
    yaml = project / "experiments/selftest.yaml"
    text = yaml.read_text()
    anchor = "      oom: {params: {action: oom}}\n"
    assert anchor in text
    yaml.write_text(text.replace(anchor, anchor + VARIANT))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop(SOCKET_ENV, None)
    if warm_start:  # the job forked by a starter outside the cap: it joins the cap's cgroup
        env[SOCKET_ENV] = request.getfixturevalue("starter").socket
    script = (f'echo $$ > {capped_cgroup / "cgroup.procs"} && exec "$0" -m hopperlab.cli submit '
              "selftest/faults/exhausts-memory --no-upload --config families=selftest")
    out = subprocess.run(["sh", "-c", script, sys.executable], cwd=project, env=env,
                         capture_output=True, text=True, timeout=240, check=False)
    rec_file = project / "results/selftest/faults/exhausts-memory/record.json"
    assert rec_file.exists(), out.stdout[-2000:] + out.stderr[-3000:]
    rec = json.loads(rec_file.read_text())
    assert rec["status"] == "oom", rec
    reason = rec["reason"]
    assert "out-of-memory killer" in reason and "SIGKILL" in reason, reason
    assert "oom_kill" in reason and str(capped_cgroup.name) in reason, reason
    assert "warn" not in reason, reason
    assert out.returncode == 0, out.stderr[-3000:]   # oom is a result, as a MemoryError is
    hardware = json.loads((rec_file.parent / "hardware.json").read_text())
    assert ("warm_start" in hardware) == warm_start, hardware


def test_the_counters_say_nothing_when_nothing_rose(tmp_path):
    now = oom_kills.OomCounts(host=3, cgroup=1, cgroup_file="/cg/memory.events", limit_bytes=None)
    assert oom_kills.kernel_oom_kill(now, now) is None
    later = oom_kills.OomCounts(host=4, cgroup=1, cgroup_file="/cg/memory.events",
                                limit_bytes=None)
    assert oom_kills.kernel_oom_kill(now, later) == "oom_kill 3 -> 4 in /proc/vmstat"


def test_v2_and_v1_counter_files_are_read(tmp_path):
    v2 = tmp_path / "memory.events"
    v2.write_text("low 0\nhigh 0\nmax 5\noom 2\noom_kill 2\noom_group_kill 0\n")
    v1 = tmp_path / "memory.oom_control"
    v1.write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 7\n")
    assert oom_kills._count(v2) == 2 and oom_kills._count(v1) == 7
    assert oom_kills._count(tmp_path / "absent") is None
