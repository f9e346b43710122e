"""The runs of several machines from one MLflow server (``hopperlab machines --mlflow URI``).

Sites that share a tracking server need not copy results folders: each uploaded child run
carries the tag ``machine``, its final metrics and its resolved spec as params
(``params.direction``, ``knobs.offload``, ...), which is all the comparison and the predictions
read. The latest attempt of each run key per machine is kept.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

from hopperlab.core.errors import SpecError
from hopperlab.results import tracking
from hopperlab.results.machines.runs import MachineRuns
from hopperlab.results.tracking.client import reading, retry
from hopperlab.results.tracking.verdicts import from_tags
from hopperlab.results.rows import RunRow


def unflatten(params: Mapping[str, str]) -> dict[str, Any]:
    """MLflow's flattened params back into a spec mapping (JSON values decoded)."""
    spec: dict[str, Any] = {}
    for name, raw in params.items():
        try:
            value: Any = json.loads(raw)
        except (TypeError, ValueError):
            value = raw
        node = spec
        parts = name.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                break
        else:
            node[parts[-1]] = value
    return spec


def _row(run: Any, spec: Mapping[str, Any]) -> RunRow:
    tags = dict(run.data.tags)
    headline = spec.get("headline_metrics") or ()
    return RunRow(
        family=tags[tracking.TAG_FAMILY], experiment=tags[tracking.TAG_EXPERIMENT],
        variant=tags[tracking.TAG_VARIANT], status=tags.get(tracking.TAG_STATUS, "failed"),
        reason=tags.get(tracking.TAG_REASON), attempt=int(tags.get(tracking.TAG_ATTEMPT, 1)),
        scale=spec.get("scale"), hostname=tags.get("hostname"), cpu_model=None,
        cpu_arch=tags.get("cpu_arch"), gpu_model=tags.get("gpu_model"), host_link=None,
        duration_s=None, metrics={k: float(v) for k, v in run.data.metrics.items()},
        run_dir=Path(f"mlflow-run-{run.info.run_id}"), baseline=spec.get("baseline"),
        headline_metrics=tuple(headline) if isinstance(headline, list) else (),
        knobs=dict(spec.get("knobs") or {}), machine=tags.get("machine"), tags=tags,
        correctness=from_tags(tags, run.data.metrics))


def load(tracking_uri: str, machines: Sequence[str] = ()) -> list[MachineRuns]:
    """Every machine's latest runs on the server (only ``machines`` when given)."""
    # the other verbs' short retries, one-line errors and scrubbed URI: a server that is down
    # is TrackingUnavailable at once, never minutes of MLflow's own retries and a traceback
    with reading(tracking_uri) as client:
        runs = [run for exp in retry(client.search_experiments)
                for run in retry(client.search_runs, [exp.experiment_id], max_results=50000)]
    groups: dict[str, MachineRuns] = {}
    attempts: dict[tuple[str, str], int] = {}
    for run in runs:
        tags = run.data.tags
        machine = tags.get("machine")
        if not machine or tags.get(tracking.TAG_ROLE) == "parent" or \
                tracking.TAG_VARIANT not in tags or (machines and machine not in machines):
            continue
        spec = unflatten(run.data.params)
        row = _row(run, spec)
        slot = (machine, row.key)
        if slot in attempts and attempts[slot] >= (row.attempt or 0):
            continue
        attempts[slot] = row.attempt or 0
        group = groups.setdefault(machine, MachineRuns(machine, tracking.redact_uri(
            tracking_uri)))
        group.runs[row.key] = row
        group.specs[row.key] = spec
    if not groups:
        wanted = f" of machine(s) {', '.join(machines)}" if machines else ""
        raise SpecError(f"--mlflow {tracking.redact_uri(tracking_uri)}: no runs{wanted} with a "
                        f"machine tag")
    return list(groups.values())


#: ``compare --mlflow`` targets that name a commit: a bare hash or ``tags.git_commit = 'hash'``,
#: either of which may be a prefix (as git accepts one)
_HASH = re.compile(r"[0-9a-fA-F]{4,40}")
_COMMIT_EQUALS = re.compile(r"\s*tags\.`?git_commit`?\s*=\s*(['\"])([0-9a-fA-F]{4,40})\1\s*")


def commit_prefix(target: str) -> str | None:
    """The commit hash (or prefix) ``target`` names, lower case; None: another filter."""
    if _HASH.fullmatch(target.strip()):
        return target.strip().lower()
    m = _COMMIT_EQUALS.fullmatch(target)
    return m.group(2).lower() if m else None


def load_query(tracking_uri: str, filter_string: str) -> dict[str, RunRow]:
    """The child runs an MLflow filter string selects (e.g. ``tags.git_commit = 'abc'``), on
    every experiment of the server: the latest attempt of each run key (``compare --mlflow``).
    A commit may be given by a prefix of its hash, bare or in ``tags.git_commit = '...'``; a
    prefix that matches two commits is refused."""
    from mlflow.exceptions import MlflowException

    prefix = commit_prefix(filter_string)
    query = f"tags.git_commit LIKE '{prefix}%'" if prefix else filter_string
    rows: dict[str, RunRow] = {}
    commits: set[str] = set()
    where = f"--mlflow {tracking.redact_uri(tracking_uri)}"
    with reading(tracking_uri) as client:
        for exp in retry(client.search_experiments):
            try:
                found = retry(client.search_runs, [exp.experiment_id], filter_string=query,
                              max_results=50000)
            except MlflowException as exc:
                raise SpecError(f"{where}: the filter {filter_string!r} is not valid: "
                                f"{str(exc).splitlines()[0]}") from None
            for run in found:
                tags = run.data.tags
                if tags.get(tracking.TAG_ROLE) == "parent" or tracking.TAG_VARIANT not in tags:
                    continue
                commits.add(tags.get("git_commit", ""))
                row = _row(run, unflatten(run.data.params))
                old = rows.get(row.key)
                if old is None or (row.attempt or 0) > (old.attempt or 0):
                    rows[row.key] = row
    if not rows:
        raise SpecError(f"{where}: no run matches {filter_string!r}"
                        + (f" (runs whose git_commit starts with {prefix})" if prefix else ""))
    if prefix and len(commits) > 1:
        raise SpecError(f"{where}: {filter_string!r}: the commit prefix {prefix} matches "
                        f"{len(commits)} commits ({', '.join(sorted(c[:12] for c in commits))}"
                        f"): give more of the hash")
    return rows
