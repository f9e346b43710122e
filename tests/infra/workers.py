"""pytest plugin: how the suite is shared between xdist workers (scripts/test.sh runs ``-n``).

Each test file is one unit of work (``xdist_group`` = its path; run with ``--dist loadgroup``),
so a module's expensive fixture (a workflow, an image build) is made once, on one worker. Every
test that uses the Slurm cluster joins one group, ``slurm``: one cluster fits on a machine (fixed
ports, the /etc/slurm link, a machine-wide lock), so one worker owns it for the whole run.

Units start longest first (longest-processing-time order), from the per-unit seconds of a
measured run in ``unit_seconds.json`` (``scripts/test_times.py --write`` renews it); a unit not
in it counts as the median, so a new test file needs no bookkeeping to be scheduled sensibly.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

SLURM_GROUP = "slurm"
WEIGHTS = Path(__file__).with_name("unit_seconds.json")


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


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups into the node ids
def pytest_collection_modifyitems(config, items):
    # a worker runs with dist "no" and xdist's own ``loadgroup`` flag; the controller with dist
    if not (getattr(config.option, "loadgroup", False)
            or config.getoption("dist", "no") == "loadgroup"):
        return  # not shared between workers: keep the files' order
    by_id = {}
    tests = []
    for item in items:
        unit = unit_of(item.nodeid, getattr(item, "fixturenames", ()))
        item.add_marker(pytest.mark.xdist_group(unit))
        by_id[item.nodeid] = item
        tests.append((item.nodeid, unit))
    items[:] = [by_id[nodeid] for nodeid in plan(tests, read_weights())]
