"""``configs/references/<machine>.yaml``: known-good figures per machine, and judging runs by them.

The way ReFrame pins performance references per system: per run (``family/experiment/variant``,
shell globs allowed) and metric, a reference. A reference that knows its noise (written by
``hopperlab references update`` from repeated runs) holds the value (a median), the relative
``spread`` of one sample, the sample count ``n`` and the ``min_effect`` worth reporting; a run is
judged against it by the test of ``hopperlab.core.effects``: ``pass``, ``regression`` (worse
beyond the noise and by at least the minimum effect), ``improvement``, ``inconclusive`` (a change
that big but within the noise at this many samples: repeat) or, without one, ``no-reference``.
An older reference with only a tolerance band (``lower``/``upper``, fractions of the value) is
still judged by its band. A metric without a declared direction that changes either way is a
regression: a check must not guess which way is good. A figure the host's CPU drives
(``FamilyInfo.host_cpu_metrics``) is judged only against a reference of the same host CPU
(``host_cpu``; ``hopperlab.node.hardware.host_cpu``). ``hopperlab check`` prints every
regression and exits 1 if there is one.

A sample that is not a finite number (NaN) is never a pass (issue 46, D26): a metric NaN in
every sample is a regression, as a missing one is; a run with some NaN samples is judged by
the others, its NaN ones dropped and said, and its verdict is at best ``inconclusive`` (a
measurement that broke in a window is repeated before it passes). ``missing_runs`` names the
referenced runs a results folder lacks (``check --strict`` fails on them).
"""

from __future__ import annotations

import fnmatch
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from hopperlab.config.cost import cost_direction
from hopperlab.config.energy import energy_direction
from hopperlab.core import effects
from hopperlab.core.errors import SpecError
from hopperlab.core.rundir import STOPPED_BY_SUBMITTER, read_samples
from hopperlab.core.schema import load_yaml, typed_from_mapping
from hopperlab.node.hardware import host_cpu
from hopperlab.workloads import family_info
from hopperlab.workloads.base import HIGHER, LOWER

REFERENCES_DIR = Path("configs") / "references"
PASS, REGRESSION, IMPROVEMENT, NO_REFERENCE = "pass", "regression", "improvement", "no-reference"
INCONCLUSIVE = "inconclusive"
#: a run's verdict is its worst finding's, in this order
VERDICT_ORDER = (REGRESSION, INCONCLUSIVE, IMPROVEMENT, PASS, NO_REFERENCE)
_FROM_EFFECT = {effects.WORSE: REGRESSION, effects.BETTER: IMPROVEMENT, effects.SAME: PASS,
                effects.UNCLEAR: INCONCLUSIVE}


@dataclass(frozen=True)
class Reference:
    """One metric's reference: measured (``spread`` and ``n``) or a tolerance band."""

    value: float
    lower: float | None = None
    upper: float | None = None
    source: str = ""
    #: the relative spread of one sample (robust standard deviation over the median)
    spread: float | None = None
    #: how many samples the value and spread come from
    n: int | None = None
    #: the smallest change worth reporting, a fraction (default effects.DEFAULT_MIN_EFFECT)
    min_effect: float | None = None
    #: the host CPU it was measured on (``node.hardware.host_cpu``); None: any
    host_cpu: str | None = None

    def __post_init__(self) -> None:
        if not math.isfinite(self.value):
            raise ValueError(f"value is {self.value!r}, not a finite number")
        if self.value <= 0:  # a band around it would fail every run, forever
            raise ValueError(f"value is {self.value!r}: a reference is a positive figure (a "
                             f"time, a rate, a size)")
        for name in ("lower", "upper"):
            bound = getattr(self, name)
            if bound is not None and not math.isfinite(bound):
                raise ValueError(f"{name} is {bound!r}, not a finite fraction of the value")
        if (self.lower is None) != (self.upper is None):
            raise ValueError("lower and upper go together (a tolerance band: fractions of the "
                             "value, e.g. -0.05 and 0.05); give both or neither")
        if self.lower is not None and (self.lower > 0 or self.upper < 0):  # type: ignore[operator]
            raise ValueError("lower must be <= 0 <= upper (fractions of value, e.g. -0.05 and "
                             "0.05)")
        if self.n is not None and self.spread is None:
            raise ValueError(f"n: {self.n} without spread: a measured reference gives both")
        if self.spread is not None:
            if not math.isfinite(self.spread) or self.spread < 0:
                raise ValueError(f"spread is {self.spread!r}: a relative spread is a finite "
                                 f"fraction >= 0")
            if self.n is None or self.n < 2:
                raise ValueError(f"spread without a sample count n of 2 or more (n: {self.n}): "
                                 f"one sample has no spread; `hopperlab references update` "
                                 f"writes both from repeated runs")
            if self.value <= 0:
                raise ValueError("a measured reference's value must be positive (a ratio)")
        if self.lower is None and self.spread is None:
            raise ValueError("a reference without spread: give spread and n (measured: "
                             "`hopperlab references update RESULTS_DIR` from runs with "
                             "repeats) or a tolerance band lower and upper")
        if self.min_effect is not None and not 0 <= self.min_effect < 1:
            raise ValueError(f"min_effect is {self.min_effect!r}; a fraction in [0, 1)")

    @property
    def measured(self) -> bool:
        return self.spread is not None

    @property
    def effect_floor(self) -> float:
        return effects.DEFAULT_MIN_EFFECT if self.min_effect is None else self.min_effect

    @property
    def bounds(self) -> tuple[float, float]:
        if self.lower is None or self.upper is None:
            raise ValueError("a measured reference has no band")
        a, b = self.value * (1 + self.lower), self.value * (1 + self.upper)
        return (min(a, b), max(a, b))


@dataclass(frozen=True)
class References:
    machine: str
    #: run pattern -> metric -> its references (several: one per host CPU), in file order
    entries: dict[str, dict[str, list[Reference]]]
    source_file: str = ""

    def candidates(self, key: str) -> dict[str, list[Reference]]:
        """Every reference whose pattern matches ``key`` (an exact pattern wins over a glob)."""
        out: dict[str, list[Reference]] = {}
        for pattern, metrics in self.entries.items():
            if pattern != key and fnmatch.fnmatchcase(key, pattern):
                out.update(metrics)
        out.update(self.entries.get(key, {}))
        return out

    def for_run(self, key: str) -> dict[str, Reference]:
        """One reference per metric: the first of each (the one without a host CPU first)."""
        return {m: sorted(refs, key=lambda r: r.host_cpu is not None)[0]
                for m, refs in self.candidates(key).items()}


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
        entries[str(run)] = {str(m): _metric_refs(ref, f"{where}: references.{run}.{m}")
                             for m, ref in metrics.items()}
    return References(machine=str(data["machine"]), entries=entries, source_file=where)


def _metric_refs(data: Any, where: str) -> list[Reference]:
    """A metric's reference, or a list of them (one per host CPU)."""
    items = data if isinstance(data, list) else [data]
    if not items:
        raise SpecError(f"{where}: an empty list of references")
    out = []
    for i, ref in enumerate(items):
        at = f"{where}[{i}]" if isinstance(data, list) else where
        out.append(typed_from_mapping(Reference, ref if isinstance(ref, Mapping) else
                                      {"value": ref}, at, "key of a reference"))
    cpus = [r.host_cpu for r in out]
    if len(set(cpus)) != len(cpus):
        raise SpecError(f"{where}: two references for the same host CPU ({cpus})")
    return out


#: what a machine name may be (configs/machines, configs/references and records agree)
MACHINE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")


def references_for(folder: Path, machine: str | None) -> References | None:
    """The machine's references (None: no file for it)."""
    if not machine or not MACHINE_NAME.fullmatch(machine):
        return None  # a record's machine is a name, never a path (``../`` would leave folder)
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


def judged(family: str, metric: str) -> bool:
    """Whether the family's references judge ``metric`` (``FamilyInfo.judged``); a family that
    declares none judges every metric its references name. Other metrics are diagnostics."""
    try:
        patterns = family_info(family).judged
    except (KeyError, ImportError, AttributeError):
        return True
    return not patterns or any(fnmatch.fnmatchcase(metric, p) for p in patterns)


def judge_value(value: float, ref: Reference, way: str | None) -> str:
    """A value against a reference's tolerance band (a reference without measured spread)."""
    low, high = ref.bounds
    if low <= value <= high:
        return PASS
    better = (value > high) if way == HIGHER else (value < low) if way == LOWER else False
    return IMPROVEMENT if better else REGRESSION


def cpu_driven(family: str, metric: str) -> bool:
    """Whether the family declares ``metric`` a figure its host's CPU drives."""
    try:
        patterns = family_info(family).host_cpu_metrics
    except (KeyError, ImportError, AttributeError):
        return False
    return any(fnmatch.fnmatchcase(metric, p) for p in patterns)


def pick(refs: Sequence[Reference], cpu: str | None, driven: bool) -> Reference | None:
    """The reference for a run on host CPU ``cpu``: the one of that CPU, else one that names
    no CPU, else (for a figure the CPU does not drive) another CPU's; None: none applies."""
    same = [r for r in refs if r.host_cpu is not None and r.host_cpu == cpu]
    if same:
        return same[0]
    anyhost = [r for r in refs if r.host_cpu is None]
    if anyhost:
        return anyhost[0]
    return None if driven else refs[0] if refs else None


@dataclass
class Finding:
    """One referenced metric of one run, judged."""

    key: str
    metric: str
    verdict: str
    value: float | None
    reference: Reference | None
    detail: str
    effect: effects.Effect | None = None


@dataclass
class Judgement:
    verdict: str
    findings: list[Finding] = field(default_factory=list)


def overall(verdicts: Iterable[str]) -> str:
    """A run's (or a node's) verdict from its findings': the first of ``VERDICT_ORDER``."""
    seen = set(verdicts)
    return next((v for v in VERDICT_ORDER if v in seen), NO_REFERENCE)


def judge_metric(family: str, key: str, metric: str, samples: Sequence[float],
                 ref: Reference, where: str) -> Finding:
    """One metric's samples (one or more) against a reference."""
    way = direction(family, metric)
    value = sorted(samples)[len(samples) // 2] if len(samples) % 2 else \
        sum(sorted(samples)[len(samples) // 2 - 1:len(samples) // 2 + 1]) / 2
    if not ref.measured:
        low, high = ref.bounds
        verdict = judge_value(value, ref, way)
        return Finding(key, metric, verdict, value, ref,
                       f"{metric} = {value:.4g}; reference {ref.value:g} [{low:.4g}, {high:.4g}] "
                       f"(a tolerance band, no measured spread; {where})")
    try:
        eff = effects.change(samples, ref.value, direction=way, min_effect=ref.effect_floor,
                             old_spread=ref.spread, old_n=ref.n)
    except ValueError as exc:
        return Finding(key, metric, INCONCLUSIVE, value, ref, f"{metric}: {exc} ({where})")
    verdict = _FROM_EFFECT[eff.verdict]
    return Finding(key, metric, verdict, value, ref, f"{metric} {eff.detail}; reference "
                   f"{ref.value:.4g} ± {ref.spread:.2%} of {ref.n} samples ({where})", eff)


def judge_run(family: str, key: str, status: str, metrics: Mapping[str, float],
              refs: References | None, run_file: str = "",
              samples: Sequence[Mapping[str, float]] = (), cpu: str | None = None,
              reason: str | None = None) -> Judgement:
    """The run's verdict against its machine's references. ``samples``: each repeat's metrics
    (none: the run measured once, its metrics are the one sample); ``cpu``: its host CPU;
    ``reason``: the record's. A run its own submitter stopped (a deadline, Ctrl-C) measured
    nothing of the node: inconclusive, never a regression (one did read REGRESSION on
    2026-12-02); a job the node let fail or hang past its time limit still is one."""
    wanted = refs.candidates(key) if refs else {}
    if not wanted:
        return Judgement(NO_REFERENCE)
    assert refs is not None
    findings = []
    for metric, options in wanted.items():
        if not judged(family, metric):
            continue  # a diagnostic: recorded and charted, never judged
        ref = pick(options, cpu, cpu_driven(family, metric))
        if ref is None:
            known = ", ".join(sorted(str(r.host_cpu) for r in options))
            findings.append(Finding(key, metric, NO_REFERENCE, metrics.get(metric), None,
                                    f"{metric} follows the host CPU; references exist for "
                                    f"{known}, this host has {cpu}: run `hopperlab references "
                                    f"update` with repeats on this CPU ({refs.source_file})"))
            continue
        first = options[0]
        band = f"reference {first.value:g} ({refs.source_file})"
        if status != "ok":
            stopped = stopped_by_submitter(reason)
            findings.append(Finding(key, metric, INCONCLUSIVE if stopped else REGRESSION, None,
                                    ref, f"run ended {status}"
                                    + (f" ({reason}: not measured, run it again)" if stopped
                                       else "") + f", no {metric}; {band}"))
            continue
        values, broken = _finite_values(samples, metrics, metric)
        if not values:
            what = (f"not a finite number in any of its {broken} sample(s) (NaN is never a "
                    f"pass)" if broken else "missing")
            findings.append(Finding(key, metric, REGRESSION, None, ref,
                                    f"{metric} {what} in {run_file or key}; {band}"))
            continue
        found = judge_metric(family, key, metric, values, ref, refs.source_file)
        if broken:
            found.detail += (f"; {broken} of {broken + len(values)} sample(s) not a finite "
                             f"number (NaN), dropped: a run with a NaN sample never passes, "
                             f"repeat it")
            if found.verdict in (PASS, IMPROVEMENT):
                found.verdict = INCONCLUSIVE
        findings.append(found)
    return Judgement(overall(f.verdict for f in findings), findings)


def stopped_by_submitter(reason: str | None) -> bool:
    """The record says the submitting process was told to stop while its job ran."""
    return bool(reason) and STOPPED_BY_SUBMITTER in str(reason)


def _finite_values(samples: Sequence[Mapping[str, Any]], metrics: Mapping[str, Any],
                   metric: str) -> tuple[list[float], int]:
    """``metric``'s finite samples and how many samples broke: not a finite number (NaN, a
    string), or without it where other samples have it (the recorder leaves a NaN out). A
    run measured once gives its one value."""
    def finite(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

    if any(metric in s for s in samples):
        got = [s.get(metric) for s in samples]
    else:
        got = [metrics[metric]] if metric in metrics else []
    values = [float(v) for v in got if finite(v)]
    return values, len(got) - len(values)


def judge_rows(rows: Iterable[Any], references_dir: Path) -> dict[str, Judgement]:
    """Judge report rows (``RunRow``: family, key, status, metrics, machine, run_dir,
    hardware); sets each row's ``reference_check`` and returns the judgements by run
    directory. Each run's samples (``samples.jsonl``) are read from its directory."""
    cache: dict[str, References | None] = {}
    out: dict[str, Judgement] = {}
    for row in rows:
        machine = row.machine
        if machine not in cache:
            cache[machine] = references_for(references_dir, machine)
        run_dir = Path(row.run_dir)
        samples = read_samples(run_dir) if run_dir.is_dir() else []
        j = judge_run(row.family, row.key, row.status, row.metrics, cache[machine],
                      str(run_dir / "metrics.json"), samples,
                      host_cpu(getattr(row, "hardware", None) or {}), getattr(row, "reason", None))
        row.reference_check = j.verdict
        out[str(row.run_dir)] = j
    return out


@dataclass(frozen=True)
class MissingRun:
    """A run the machine's references name (a key, or a glob) that a results folder lacks."""

    machine: str
    pattern: str
    source_file: str


def missing_runs(rows: Sequence[Any], references_dir: Path, only: Sequence[str] = ()
                 ) -> list[MissingRun]:
    """Each referenced run of the rows' machines that no row of that machine is; ``only``
    (the matrix's ``only``: keys, ``family`` or ``family/experiment``): the runs the folder
    was meant to hold, a referenced run outside them is not missing."""
    keys: dict[str, set[str]] = {}
    for row in rows:
        if row.machine:
            keys.setdefault(row.machine, set()).add(row.key)
    out = []
    for machine, have in sorted(keys.items()):
        refs = references_for(references_dir, machine)
        if refs is None:
            continue
        out += [MissingRun(machine, pattern, refs.source_file) for pattern in refs.entries
                if not any(k == pattern or fnmatch.fnmatchcase(k, pattern) for k in have)
                and (not only or any(pattern == o or pattern.startswith(o.rstrip("/") + "/")
                                     for o in only))]
    return out


def regressions(judgements: Mapping[str, Judgement]) -> list[Finding]:
    return [f for j in judgements.values() for f in j.findings if f.verdict == REGRESSION]


def check_lines(rows: Sequence[Any], judgements: Mapping[str, Judgement],
                shown: Sequence[str] = (REGRESSION, INCONCLUSIVE)) -> list[str]:
    """One line per regression (and inconclusive finding), naming the machine, run and metric."""
    by_dir = {str(r.run_dir): r for r in rows}
    lines = []
    for run_dir, j in judgements.items():
        for f in j.findings:
            if f.verdict in shown:
                lines.append(f"{f.verdict.upper()} {by_dir[run_dir].machine} {f.key} "
                             f"{f.metric}: {f.detail}")
    return lines
