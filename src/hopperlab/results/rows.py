"""The rows of a results folder: one ``RunRow`` per run directory, and which run each row is
compared with (the experiment's baseline, or the variant's ``compare_to``). Here, beside
report/ and machines/, because both read them (neither imports the other's rows).

The report reads the run directories themselves (docs/run-directory.md), never MLflow: it works
offline, on a half-finished matrix, and after MLflow is gone. Archived attempts
(``attempts/{n}/``) and folders without a record are not runs.

A run is the one its directory names: a record (or spec) that names another run, or whose
family, experiment or variant is not a name (a newline, a ``/``, a ``*``), is refused, one line
naming the file and key, and the folder's other runs are read as ever (issue 46, D18: such a
record wrote references of its choosing).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from hopperlab.core import rundir as rec
from hopperlab.core.errors import SpecError
from hopperlab.core.run_key import PARTS, part_problem
from hopperlab.results import correctness
from hopperlab.node.naming import machine_name

log = logging.getLogger(__name__)


@dataclass
class RunRow:
    """One run directory, as the report sees it."""

    family: str
    experiment: str
    variant: str
    status: str
    reason: str | None
    attempt: int | None
    scale: str | None
    hostname: str | None
    cpu_model: str | None
    cpu_arch: str | None
    gpu_model: str | None
    host_link: str | None
    duration_s: float | None
    metrics: dict[str, float]
    run_dir: Path
    #: the experiment's baseline variant (from spec.json), None when not declared
    baseline: str | None = None
    #: the variant this run's ratios are taken against (spec.json ``compare_to``); None: baseline
    compare_to: str | None = None
    headline_metrics: tuple[str, ...] = ()
    knobs: dict[str, Any] = field(default_factory=dict)
    #: the record's full hardware dict (hardware.json when the record has none)
    hardware: dict[str, Any] = field(default_factory=dict)
    #: the machine the run ran on (the record's, else named from its fingerprint)
    machine: str | None = None
    #: the run's tags (the record's), e.g. cost.currency
    tags: dict[str, str] = field(default_factory=dict)
    #: pass | regression | improvement | no-reference (configs/references/<machine>.yaml)
    reference_check: str | None = None
    #: seconds from job start to the first step (the record's ``setup_s``, every family's):
    #: a column of its own, not a metric compared with the baseline
    setup_s: float | None = None
    #: metrics the record holds with a value that is not a finite number (NaN, inf): kept
    #: out of ``metrics``, named here so that a comparison says "not a number", not "missing"
    nonfinite: tuple[str, ...] = ()
    #: the attempt's id (the record's ``run_uid``, else its spec's): a copy of a folder has the
    #: same, an independent run another
    run_uid: str | None = None
    #: when the attempt started (the record's ``started_at``)
    started_at: str | None = None
    #: same | within bound | DIFFERENT | not compared against the run it is compared with
    #: (``results.correctness``); None: the reference itself, or a run that did not end ok
    correctness: Any = None
    #: the GPUs and nodes the run held (spec.json ``resources``; None: not said)
    gpus: int | None = None
    nodes: int | None = None

    @property
    def key(self) -> str:
        return f"{self.family}/{self.experiment}/{self.variant}"

    @property
    def is_baseline(self) -> bool:
        return self.baseline is not None and self.variant == self.baseline


def _str_or_none(value: Any) -> str | None:
    if value is None or value == "":
        return None
    return str(value)


def _float_or_none(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _clean_metrics(metrics: Any) -> dict[str, float]:
    if not isinstance(metrics, Mapping):
        return {}
    out = {}
    for name, value in metrics.items():
        number = _float_or_none(value)
        if number is not None and math.isfinite(number):
            out[str(name)] = number
    return out


def _nonfinite(metrics: Any) -> tuple[str, ...]:
    if not isinstance(metrics, Mapping):
        return ()
    return tuple(sorted(str(name) for name, value in metrics.items()
                        if (number := _float_or_none(value)) is not None
                        and not math.isfinite(number)))


def _read_json_or_none(path: Path) -> Any:
    try:
        return rec.read_json(path)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("cannot read %s: %s", path, exc)
        return None


class RefusedRecord(SpecError):
    """A record (or spec) whose identity is not a name, or not its run directory's."""


def _identity(run_dir: Path, results_dir: Path, record: Mapping[str, Any],
              spec: Mapping[str, Any]) -> tuple[str, str, str]:
    """The run's family, experiment and variant: its directory's, each a name, and what its
    record says (its spec where the record does not say) where either says it
    (``RefusedRecord`` naming the file and key if not)."""
    parts = run_dir.relative_to(results_dir).parts
    for name, part in zip(PARTS, parts):
        if (why := part_problem(part)):
            raise RefusedRecord(f"{run_dir}: the run directory's {name} {why}: the run is "
                                f"refused")
    record_file = rec.RECORD_FILE if (run_dir / rec.RECORD_FILE).exists() else rec.METRICS_FILE
    key = "/".join(parts)
    for name, own in (*zip(PARTS, parts), ("key", key)):
        path, data = ((run_dir / record_file, record) if record.get(name) is not None
                      else (run_dir / rec.SPEC_FILE, spec))
        value = data.get(name)
        if value is not None and value != own:
            why = (part_problem(value) if name != "key" else None) \
                or f"is {value!r}, its run directory is {own!r}"
            raise RefusedRecord(f"{path}: {name}: {why}: the run is refused (a record names "
                                f"the run whose directory holds it)")
    return parts[0], parts[1], parts[2]


def _run_row(run_dir: Path, results_dir: Path) -> RunRow | None:
    try:
        record = rec.load_record(run_dir)
    except (OSError, ValueError) as exc:
        # A record that exists but cannot be read is a result too: show it, do not drop it.
        record = {"status": "failed", "reason": f"unreadable record: {exc}"}
    if record is None:
        return None
    spec = _read_json_or_none(run_dir / rec.SPEC_FILE)
    if not isinstance(spec, Mapping):
        spec = {}
    family, experiment, variant = _identity(run_dir, results_dir, record, spec)
    hardware = record.get("hardware")
    if not isinstance(hardware, Mapping) or not hardware:
        hardware = _read_json_or_none(run_dir / rec.HARDWARE_FILE)
    hardware = dict(hardware) if isinstance(hardware, Mapping) else {}
    headline = spec.get("headline_metrics") or ()
    knobs = spec.get("knobs")
    attempt = record.get("attempt")
    return RunRow(
        family=family,
        experiment=experiment,
        variant=variant,
        status=str(record.get("status") or "failed"),
        reason=_str_or_none(record.get("reason")),
        attempt=attempt if isinstance(attempt, int) and not isinstance(attempt, bool) else None,
        scale=_str_or_none(spec.get("scale")),
        hostname=_str_or_none(hardware.get("hostname")),
        cpu_model=_str_or_none(hardware.get("cpu_model")),
        cpu_arch=_str_or_none(hardware.get("cpu_arch")),
        gpu_model=_str_or_none(hardware.get("gpu_model")),
        host_link=_str_or_none(hardware.get("host_link")),
        duration_s=_float_or_none(record.get("duration_s")),
        metrics={k: v for k, v in _clean_metrics(record.get("metrics")).items()
                 if k != rec.SETUP_METRIC},
        setup_s=_clean_metrics(record.get("metrics")).get(rec.SETUP_METRIC),
        nonfinite=_nonfinite(record.get("metrics")),
        run_dir=run_dir,
        baseline=_str_or_none(spec.get("baseline")),
        compare_to=_str_or_none(spec.get("compare_to")),
        headline_metrics=tuple(str(m) for m in headline) if isinstance(headline, (list, tuple)) else (),
        knobs=dict(knobs) if isinstance(knobs, Mapping) else {},
        hardware=hardware,
        machine=_str_or_none(record.get("machine"))
        or (machine_name(hardware) if hardware else None),
        tags={str(k): str(v) for k, v in (record.get("tags") or {}).items()}
        if isinstance(record.get("tags"), Mapping) else {},
        run_uid=_str_or_none(record.get(rec.RUN_UID) or spec.get(rec.RUN_UID)),
        started_at=_str_or_none(record.get("started_at")),
        gpus=_count(spec.get("resources"), "gpus"),
        nodes=_count(spec.get("resources"), "nodes"),
    )


def _count(resources: Any, key: str) -> int | None:
    value = resources.get(key) if isinstance(resources, Mapping) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def sort_key(run: RunRow) -> tuple[str, str, str]:
    return (run.family, run.experiment, run.variant)


def read_runs(results_dir: Path) -> tuple[list[RunRow], list[str]]:
    """Every run directory ``{family}/{experiment}/{variant}/`` under ``results_dir`` that holds
    a record, sorted by family, experiment, variant, and one line for each record refused
    (``RefusedRecord``). ``attempts/`` folders are not runs."""
    results_dir = Path(results_dir)
    if not results_dir.is_dir():
        return [], []
    runs, refused = [], []
    for run_dir in results_dir.glob("*/*/*"):
        parts = run_dir.relative_to(results_dir).parts
        if any(p.startswith(".") or p == "attempts" for p in parts) or not run_dir.is_dir():
            continue
        try:
            row = _run_row(run_dir, results_dir)
        except RefusedRecord as exc:
            refused.append(str(exc))
            continue
        if row is not None:
            runs.append(row)
    runs.sort(key=sort_key)
    for group in group_by_experiment(runs).values():
        found = correctness.verdicts(group)
        for r in group:
            r.correctness = found.get(r.variant)
    return runs, sorted(refused)


def collect_runs(results_dir: Path) -> list[RunRow]:
    """``read_runs``'s runs; each refused record is logged (a warning), never a run."""
    runs, refused = read_runs(results_dir)
    for line in refused:
        log.warning("%s", line)
    return runs


def group_by_experiment(runs: Iterable[RunRow]) -> dict[tuple[str, str], list[RunRow]]:
    groups: dict[tuple[str, str], list[RunRow]] = {}
    for run in sorted(runs, key=sort_key):
        groups.setdefault((run.family, run.experiment), []).append(run)
    return groups


def baseline_name(runs: Sequence[RunRow]) -> str | None:
    return next((r.baseline for r in runs if r.baseline), None)


def baseline_run(runs: Sequence[RunRow]) -> RunRow | None:
    name = baseline_name(runs)
    return next((r for r in runs if r.variant == name), None) if name else None


def declared_reference(run: RunRow, runs: Sequence[RunRow]) -> str | None:
    """The variant ``run`` names as its reference: its ``compare_to``, else the experiment's
    baseline (e.g. fp8 against bf16 compiled alike, not against eager bf16)."""
    return run.compare_to or baseline_name(runs)


def same_gpus_reference(run: RunRow, runs: Sequence[RunRow]) -> RunRow | None:
    """When the declared reference has no run in this folder (the 13B rows on 2 GPUs name the
    1-GPU run of another folder): the run of the same experiment on the same GPUs and nodes
    that ``run`` is a variant of by name (``fsdp2`` for ``fsdp2-offload``: the longest such
    prefix), so that a multi-GPU row is compared with its own baseline, never with a run on
    other resources. None: no such run."""
    if run.gpus is None:
        return None
    found = [r for r in runs if r is not run and r.gpus == run.gpus and r.nodes == run.nodes
             and run.variant.startswith(r.variant + "-")]
    return max(found, key=lambda r: len(r.variant)) if found else None


def reference_run(run: RunRow, runs: Sequence[RunRow]) -> RunRow | None:
    """The run of ``run``'s reference variant; where that has no run here, the run on the
    same GPUs it is a variant of (``same_gpus_reference``); None: neither (then no ratio:
    never a fallback to a run on other resources)."""
    name = declared_reference(run, runs)
    if name is None:
        return None
    found = next((r for r in runs if r.variant == name), None)
    return found or same_gpus_reference(run, runs)


def reference_name(run: RunRow, runs: Sequence[RunRow]) -> str | None:
    """The name of the variant ``run`` is compared with (``reference_run``'s), else the one it
    declares (which then has no run)."""
    found = reference_run(run, runs)
    return found.variant if found is not None else declared_reference(run, runs)


def ratio_to(value: float | None, base: RunRow | None, metric: str) -> float | None:
    """``value`` over the baseline's value of ``metric``; None when either is missing, the
    baseline is not ok, or its value is 0."""
    if value is None or base is None or base.status != "ok":
        return None
    base_value = base.metrics.get(metric)
    if base_value is None or base_value == 0:
        return None
    return value / base_value


def metric_names(runs: Iterable[RunRow]) -> list[str]:
    return sorted({m for r in runs for m in r.metrics})
