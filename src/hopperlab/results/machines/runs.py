"""Results folders -> the runs of each machine, checked before anything is compared.

A folder that is not a results folder, or two folders of one machine, stop with an error that
names them: comparing a machine with itself by accident would print ratios of 1 that look like
findings. A folder may hold runs of several machines (runs copied together); each machine is
then its own column.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from hopperlab.core import rundir
from hopperlab.core.errors import SpecError
from hopperlab.results.rows import RunRow, read_runs

log = logging.getLogger(__name__)


@dataclass
class MachineRuns:
    """One machine's runs: ``family/experiment/variant`` -> the report's row of that run."""

    machine: str
    source: str
    runs: dict[str, RunRow] = field(default_factory=dict)
    #: specs known without a spec.json (runs read from MLflow: its params)
    specs: dict[str, dict[str, Any]] = field(default_factory=dict)

    def spec(self, key: str) -> dict[str, Any]:
        """The run's spec.json (``{}`` when missing or unreadable)."""
        if key in self.specs:
            return self.specs[key]
        row = self.runs.get(key)
        if row is None:
            return {}
        try:
            return rundir.read_json(Path(row.run_dir) / rundir.SPEC_FILE)
        except (OSError, ValueError):
            return {}

    def params(self, key: str) -> dict[str, Any]:
        params = self.spec(key).get("params")
        return dict(params) if isinstance(params, dict) else {}


def load_folder(folder: Path) -> list[MachineRuns]:
    """The runs of one results folder, grouped by machine."""
    folder = Path(folder)
    if not folder.is_dir():
        raise SpecError(f"{folder}: not a results folder (no such directory)")
    rows, refused = read_runs(folder)
    if not rows and refused:
        raise SpecError(f"{folder}: no run to compare: {refused[0]}"
                        + (f" (and {len(refused) - 1} more refused)" if len(refused) > 1 else ""))
    if not rows:
        raise SpecError(f"{folder}: not a results folder (no run directory "
                        f"family/experiment/variant/ with a {rundir.RECORD_FILE} or "
                        f"{rundir.METRICS_FILE})")
    for line in refused:
        log.warning("%s", line)
    groups: dict[str, MachineRuns] = {}
    for row in rows:
        name = row.machine or "unknown"
        group = groups.setdefault(name, MachineRuns(name, str(folder)))
        group.runs[row.key] = row
    return list(groups.values())


def load_folders(folders: Sequence[Path]) -> list[MachineRuns]:
    """Every folder's machines, in the order given; one machine in two folders is an error."""
    out: list[MachineRuns] = []
    seen: dict[str, str] = {}
    for folder in folders:
        for group in load_folder(Path(folder)):
            if group.machine in seen:
                raise SpecError(
                    f"{seen[group.machine]} and {folder} both hold runs of machine "
                    f"{group.machine}: give one folder per machine (or name one node's machine "
                    f"yourself with `machine:` in its site file)")
            seen[group.machine] = str(folder)
            out.append(group)
    return out


def dumps(groups: Sequence[MachineRuns]) -> str:
    """A short listing for logs: machine, folder, number of runs."""
    return json.dumps([{"machine": g.machine, "source": g.source, "runs": len(g.runs)}
                       for g in groups])
