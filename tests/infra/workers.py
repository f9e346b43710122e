"""pytest plugin: how the suite is shared between xdist workers (scripts/test.sh runs ``-n``).

Each test file is one unit of work (``xdist_group`` = its path; run with ``--dist loadgroup``),
so a module's expensive fixture (a workflow, an image build) is made once, on one worker. Every
test that uses the Slurm cluster joins one group, ``slurm``: one cluster fits on a machine (fixed
ports, the /etc/slurm link, a machine-wide lock), so one worker owns it for the whole run.

Units start longest first (longest-processing-time order), from the per-unit seconds of a
measured run in ``unit_seconds.json`` (``scripts/test_times.py --write`` renews it); a unit not
in it counts as the median, so a new test file needs no bookkeeping to be scheduled sensibly.

The units that set the suite's length get the CPU first: on 2 cores six workers compete, and a
long unit that waits most of the time (the Slurm group) or computes on one core (the
Charliecloud image build, a file marked ``head_start``) took four times its idle wall time,
ending last. Its worker keeps the CPU priority the run started with; a worker on any other unit
runs ``HOPPERLAB_TEST_NICE`` (default 5) nice steps lower, it and the processes it starts. The
CPU the suite needs is the same; the long units no longer wait behind the short ones.
"""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

SLURM_GROUP = "slurm"
WEIGHTS = Path(__file__).with_name("unit_seconds.json")
#: the marker of a file whose unit sets the suite's length (the Slurm group always does)
HEAD_START = "head_start"
NICE_ENV = "HOPPERLAB_TEST_NICE"
DEFAULT_NICE_STEPS = 5
#: this worker's (nice value at its start, steps), set where units are shared
_NICE = pytest.StashKey[tuple[int, int]]()


def unit_of(nodeid: str, fixturenames: Sequence[str]) -> str:
    """The work unit a test belongs to: the Slurm group, or its file."""
    return SLURM_GROUP if "slurm_cluster" in fixturenames else nodeid.split("::", 1)[0]


def read_weights(path: Path = WEIGHTS) -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in json.loads(path.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def plan(tests: Sequence[tuple[str, str]], weights: Mapping[str, float]) -> list[str]:
    """The order to hand out ``(nodeid, unit)`` pairs: units longest first (an unknown unit
    counts as the median), each unit's tests in their own order, except that a Slurm test
    whose file also runs elsewhere comes last in its group: a fixture the two share
    (tests/infra/shared.py) has been made by the file's own worker by then, not waited for."""
    default = statistics.median(weights.values()) if weights else 1.0
    units: dict[str, list[str]] = {}
    for nodeid, unit in tests:
        units.setdefault(unit, []).append(nodeid)
    split = {u for u in units if u != SLURM_GROUP}
    if SLURM_GROUP in units:
        units[SLURM_GROUP].sort(key=lambda nodeid: nodeid.split("::", 1)[0] in split)
    order = sorted(units, key=lambda u: (-weights.get(u, default), u))
    return [nodeid for unit in order for nodeid in units[unit]]


def nice_steps(environ: Mapping[str, str] = os.environ) -> int:
    """How many nice steps below a head-start unit the other units run (0: all alike)."""
    raw = environ.get(NICE_ENV, "").strip()
    try:
        steps = int(raw) if raw else DEFAULT_NICE_STEPS
    except ValueError:
        raise pytest.UsageError(f"{NICE_ENV}={raw!r}: not a whole number of nice steps") from None
    if not 0 <= steps <= 19:
        raise pytest.UsageError(f"{NICE_ENV}={raw!r}: nice steps go from 0 to 19")
    return steps


def niceness(unit: str, marked: bool, base: int, steps: int) -> int:
    """The nice value a worker runs ``unit`` at: ``base`` (the run's) for the Slurm group and a
    ``head_start`` file, ``steps`` higher for any other unit."""
    return base if unit == SLURM_GROUP or marked else min(19, base + steps)


def _shared(config) -> bool:
    """Whether this process is part of a ``--dist loadgroup`` run (a worker runs with dist "no"
    and xdist's own ``loadgroup`` flag; the controller with dist)."""
    return bool(getattr(config.option, "loadgroup", False)
                or config.getoption("dist", "no") == "loadgroup")


def pytest_configure(config):
    config.addinivalue_line("markers", f"{HEAD_START}: a long unit that sets the suite's length: "
                                       "its worker keeps the CPU first (tests/infra/workers.py)")
    if _shared(config) and os.environ.get("PYTEST_XDIST_WORKER"):
        config.stash[_NICE] = (os.getpriority(os.PRIO_PROCESS, 0), nice_steps())


@pytest.hookimpl(tryfirst=True)  # before the test's fixtures start their processes
def pytest_runtest_setup(item):
    base_steps = item.config.stash.get(_NICE, None)
    if base_steps is None:
        return  # one process, or the controller: nothing to share
    base, steps = base_steps
    want = niceness(unit_of(item.nodeid, getattr(item, "fixturenames", ())),
                    item.get_closest_marker(HEAD_START) is not None, base, steps)
    if want != os.getpriority(os.PRIO_PROCESS, 0):
        try:  # back to a lower value needs root (CAP_SYS_NICE): else this unit stays lower
            os.setpriority(os.PRIO_PROCESS, 0, want)
        except PermissionError:
            pass


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups into the node ids
def pytest_collection_modifyitems(config, items):
    if not _shared(config):
        return  # not shared between workers: keep the files' order
    by_id = {}
    tests = []
    for item in items:
        unit = unit_of(item.nodeid, getattr(item, "fixturenames", ()))
        item.add_marker(pytest.mark.xdist_group(unit))
        by_id[item.nodeid] = item
        tests.append((item.nodeid, unit))
    items[:] = [by_id[nodeid] for nodeid in plan(tests, read_weights())]
