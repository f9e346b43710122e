"""``configs/references/<machine>.yaml``: known-good figures per machine, and judging runs by them.

The way ReFrame pins performance references per system: per run (``family/experiment/variant``,
shell globs allowed) and metric, a value and tolerances as fractions of it. A run is judged on
the machine it landed on: ``pass`` (every referenced metric inside its band), ``regression``
(one is outside on the worse side, is missing, or the run did not end ok), ``improvement``
(outside on the better side, none worse), ``no-reference``. A metric without a declared
direction that leaves its band either way is a regression: a check must not guess which way is
good. ``hopperlab check`` prints every regression and exits 1 if there is one.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from hopperlab.config.cost import cost_direction
from hopperlab.config.energy import energy_direction
from hopperlab.core.errors import SpecError
from hopperlab.core.schema import load_yaml, typed_from_mapping
from hopperlab.workloads import family_info
from hopperlab.workloads.base import HIGHER, LOWER

REFERENCES_DIR = Path("configs") / "references"
PASS, REGRESSION, IMPROVEMENT, NO_REFERENCE = "pass", "regression", "improvement", "no-reference"


@dataclass(frozen=True)
class Reference:
    value: float
    lower: float
    upper: float
    source: str

    def __post_init__(self) -> None:
        if self.lower > 0 or self.upper < 0:
            raise ValueError("lower must be <= 0 <= upper (fractions of value, e.g. -0.05 and "
                             "0.05)")

    @property
    def bounds(self) -> tuple[float, float]:
        a, b = self.value * (1 + self.lower), self.value * (1 + self.upper)
        return (min(a, b), max(a, b))


@dataclass(frozen=True)
class References:
    machine: str
    #: run pattern -> metric -> Reference, in file order
    entries: dict[str, dict[str, Reference]]
    source_file: str = ""

    def for_run(self, key: str) -> dict[str, Reference]:
        """Every reference whose pattern matches ``key`` (an exact pattern wins over a glob)."""
        out: dict[str, Reference] = {}
        for pattern, metrics in self.entries.items():
            if pattern != key and fnmatch.fnmatchcase(key, pattern):
                out.update(metrics)
        out.update(self.entries.get(key, {}))
        return out


def load_references(path: Path) -> References:
    """One references file, strictly (unknown or missing keys name the file and key path)."""
    data = load_yaml(path, "references")
    where = str(path)
    if not isinstance(data, Mapping):
        raise SpecError(f"{where}: expected a mapping with machine and references")
    for key in data:
        if key not in ("machine", "references"):
            raise SpecError(f"{where}: {key}: unknown key; expected one of: machine, references")
    for key in ("machine", "references"):
        if key not in data:
            raise SpecError(f"{where}: missing required key: {key}")
    if data["machine"] != path.stem:
        raise SpecError(f"{where}: machine: is {data['machine']!r}, expected {path.stem!r} "
                        f"(the file name)")
    if not isinstance(data["references"], Mapping):
        raise SpecError(f"{where}: references: expected a mapping of family/experiment/variant")
    entries: dict[str, dict[str, Reference]] = {}
    for run, metrics in data["references"].items():
        if str(run).count("/") != 2:
            raise SpecError(f"{where}: references.{run}: a run is named family/experiment/variant")
        if not isinstance(metrics, Mapping) or not metrics:
            raise SpecError(f"{where}: references.{run}: expected metric: {{value, lower, upper, "
                            f"source}}")
        entries[str(run)] = {
            str(m): typed_from_mapping(Reference, ref if isinstance(ref, Mapping) else {"value": ref},
                                       f"{where}: references.{run}.{m}", "key of a reference")
            for m, ref in metrics.items()}
    return References(machine=str(data["machine"]), entries=entries, source_file=where)


def references_for(folder: Path, machine: str | None) -> References | None:
    """The machine's references (None: no file for it)."""
    if not machine:
        return None
    path = Path(folder) / f"{machine}.yaml"
    return load_references(path) if path.is_file() else None


def direction(family: str, metric: str) -> str | None:
    """``higher`` or ``lower`` as the family (or pricing) declares it; None: not declared."""
    declared = cost_direction(metric) or energy_direction(metric)
    if declared:
        return declared
    try:
        return family_info(family).directions.get(metric)
    except (KeyError, ImportError, AttributeError):
        return None


def judge_value(value: float, ref: Reference, way: str | None) -> str:
    low, high = ref.bounds
    if low <= value <= high:
        return PASS
    better = (value > high) if way == HIGHER else (value < low) if way == LOWER else False
    return IMPROVEMENT if better else REGRESSION


@dataclass
class Finding:
    """One referenced metric of one run, judged."""

    key: str
    metric: str
    verdict: str
    value: float | None
    reference: Reference
    detail: str


@dataclass
class Judgement:
    verdict: str
    findings: list[Finding] = field(default_factory=list)


def judge_run(family: str, key: str, status: str, metrics: Mapping[str, float],
              refs: References | None, run_file: str = "") -> Judgement:
    """The run's verdict against its machine's references."""
    wanted = refs.for_run(key) if refs else {}
    if not wanted:
        return Judgement(NO_REFERENCE)
    findings = []
    for metric, ref in wanted.items():
        value = metrics.get(metric)
        low, high = ref.bounds
        band = f"reference {ref.value:g} [{low:.4g}, {high:.4g}] ({refs.source_file})"
        if status != "ok":
            findings.append(Finding(key, metric, REGRESSION, None, ref,
                                    f"run ended {status}, no {metric}; {band}"))
            continue
        if value is None:
            findings.append(Finding(key, metric, REGRESSION, None, ref,
                                    f"{metric} missing in {run_file or key}; {band}"))
            continue
        verdict = judge_value(value, ref, direction(family, metric))
        findings.append(Finding(key, metric, verdict, value, ref,
                                f"{metric} = {value:.4g}; {band}"))
    verdicts = {f.verdict for f in findings}
    verdict = REGRESSION if REGRESSION in verdicts else (
        IMPROVEMENT if IMPROVEMENT in verdicts else PASS)
    return Judgement(verdict, findings)


def judge_rows(rows: Iterable[Any], references_dir: Path) -> dict[str, Judgement]:
    """Judge report rows (``RunRow``: family, key, status, metrics, machine, run_dir); sets each
    row's ``reference_check`` and returns the judgements by run directory."""
    cache: dict[str, References | None] = {}
    out: dict[str, Judgement] = {}
    for row in rows:
        machine = row.machine
        if machine not in cache:
            cache[machine] = references_for(references_dir, machine)
        j = judge_run(row.family, row.key, row.status, row.metrics, cache[machine],
                      str(Path(row.run_dir) / "metrics.json"))
        row.reference_check = j.verdict
        out[str(row.run_dir)] = j
    return out


def regressions(judgements: Mapping[str, Judgement]) -> list[Finding]:
    return [f for j in judgements.values() for f in j.findings if f.verdict == REGRESSION]


def check_lines(rows: Sequence[Any], judgements: Mapping[str, Judgement]) -> list[str]:
    """One line per regression, naming the machine, run and metric."""
    by_dir = {str(r.run_dir): r for r in rows}
    lines = []
    for run_dir, j in judgements.items():
        for f in j.findings:
            if f.verdict == REGRESSION:
                lines.append(f"REGRESSION {by_dir[run_dir].machine} {f.key} {f.metric}: "
                             f"{f.detail}")
    return lines
