"""pytest plugin: where the suite's time goes, per test file, in wall and CPU seconds.

``--durations`` names the slowest tests by wall time; on 2 cores what decides the suite's length
is CPU too (a test that waits costs a worker, a test that computes costs a core). With
``HOPPERLAB_TEST_TIMES=FILE`` set, each worker appends one JSON line per test: its node id, its
xdist group, whether it is an integration test, wall seconds of setup + call + teardown, and CPU seconds of the worker and its
reaped children over the same span. ``scripts/test_times.py FILE`` sums them per file.
"""

from __future__ import annotations

import json
import os
import resource
import time
from pathlib import Path

import pytest

ENV = "HOPPERLAB_TEST_TIMES"


def _cpu_s() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    out = os.environ.get(ENV)
    if not out:
        yield
        return
    wall0, cpu0 = time.monotonic(), _cpu_s()
    yield
    mark = item.get_closest_marker("xdist_group")
    row = {"test": item.nodeid, "group": mark.args[0] if mark and mark.args else None,
           "integration": item.get_closest_marker("integration") is not None,
           "wall_s": round(time.monotonic() - wall0, 3), "cpu_s": round(_cpu_s() - cpu0, 3),
           "worker": os.environ.get("PYTEST_XDIST_WORKER", "main")}
    with Path(out).open("a") as f:  # one short line per write: appends do not interleave
        f.write(json.dumps(row) + "\n")
