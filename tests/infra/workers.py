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
from pathlib import Path

import pytest

SLURM_GROUP = "slurm"
WEIGHTS = Path(__file__).with_name("unit_seconds.json")


def unit_of(item) -> str:
    """The work unit a test belongs to: the Slurm group, or its file."""
    if "slurm_cluster" in getattr(item, "fixturenames", ()):
        return SLURM_GROUP
    return item.nodeid.split("::", 1)[0]


def _weights() -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in json.loads(WEIGHTS.read_text()).items()}
    except (OSError, ValueError):
        return {}


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups into the node ids
def pytest_collection_modifyitems(config, items):
    if not config.getvalue("loadgroup"):
        return  # not shared between workers: keep the files' order
    weights = _weights()
    default = statistics.median(weights.values()) if weights else 1.0
    units: dict[str, list] = {}
    for item in items:
        unit = unit_of(item)
        item.add_marker(pytest.mark.xdist_group(unit))
        units.setdefault(unit, []).append(item)
    # a Slurm test whose file also runs elsewhere comes last in its group: a fixture the two
    # share (tests/infra/shared.py) is made by the file's own worker by then, not waited for
    split = {path for path in units if path != SLURM_GROUP}
    units.get(SLURM_GROUP, []).sort(key=lambda item: item.nodeid.split("::", 1)[0] in split)
    order = sorted(units, key=lambda u: (-weights.get(u, default), u))
    items[:] = [item for unit in order for item in units[unit]]
