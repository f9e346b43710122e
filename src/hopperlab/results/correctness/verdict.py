"""The correctness verdict of one run against the run it is compared with (issue 47).

Pure (no torch, no MLflow): it reads the two run directories' records and the family's
declaration (``workloads.sameness``) and says ``same``, ``within bound`` (with the deviation),
``DIFFERENT`` (with the first step, reply or query that differs, and by how much) or ``not
compared`` (with why: no declaration, a reference that did not end ok, records of an older run
without the figures). The report, ``check``, ``compare`` and MLflow read this one verdict.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from hopperlab.core.rundir import read_steps
from hopperlab.workloads.sameness import (
    BOUNDED,
    EVIDENCE_FILE,
    EXACT,
    NOT_COMPARABLE,
    SERVED,
    Sameness,
    read_evidence_file,
)

SAME, WITHIN, DIFFERENT, NOT_COMPARED = "same", "within bound", "DIFFERENT", "not compared"
VERDICTS = (SAME, WITHIN, DIFFERENT, NOT_COMPARED)


@dataclass(frozen=True)
class Verdict:
    state: str
    #: the variant it was compared with
    against: str | None
    #: a short sentence: what was compared, or what differs first, or why not compared
    detail: str
    #: the largest deviation found (the measure's unit, 0 for identical), None: not compared
    deviation: float | None = None
    bound: float | None = None

    @property
    def different(self) -> bool:
        return self.state == DIFFERENT

    def cell(self) -> str:
        """The verdict as a table cell: ``within bound (3.2e-08 <= 1e-05)``."""
        if self.state == WITHIN and self.deviation is not None:
            return f"{WITHIN} ({self.deviation:.2g} <= {self.bound:.2g})"
        return self.state


def not_compared(against: str | None, why: str) -> Verdict:
    return Verdict(NOT_COMPARED, against, why)


@dataclass(frozen=True)
class Side:
    """One run as the verdict reads it."""

    variant: str
    status: str
    run_dir: Path
    metrics: Mapping[str, float]


def judge(rule: Sameness, run: Side, ref: Side) -> Verdict:
    """``run`` against ``ref`` under ``rule``."""
    if ref.status != "ok" and rule.kind != NOT_COMPARABLE:
        return not_compared(ref.variant, f"{ref.variant} ended {ref.status}")
    if rule.kind == NOT_COMPARABLE:
        dead = _backward_missing(run, ref) if rule.measure == "losses" else None
        return dead or not_compared(ref.variant, f"not comparable: {rule.reason}")
    served = _served_differs(run, ref)
    if served:
        return not_compared(ref.variant, served)
    reader = _MEASURES[rule.measure]
    return reader(rule, run, ref)


def _served_differs(run: Side, ref: Side) -> str:
    """Why the two runs computed with other models sized at run time ('' when they did not,
    or either recorded nothing): ``served`` evidence (``workloads.sameness.SERVED``)."""
    mine, theirs = _evidence(run, SERVED), _evidence(ref, SERVED)
    if not isinstance(mine, Mapping) or not isinstance(theirs, Mapping) or mine == theirs:
        return ""
    what = ", ".join(f"{k} {mine.get(k)} against {theirs.get(k)}"
                     for k in sorted(set(mine) | set(theirs)) if mine.get(k) != theirs.get(k))
    return f"another model served ({what}): not comparable"


# -- per measure --------------------------------------------------------------------------------

def _rel(a: float, b: float) -> float:
    if a == b:
        return 0.0
    if not (math.isfinite(a) and math.isfinite(b)):
        return math.inf
    return abs(a - b) / max(abs(b), 1e-12)


def _series(run_dir: Path, name: str) -> dict[int, float]:
    """step -> ``name`` from steps.jsonl (a distributed run's: rank 0's), last value per step."""
    folder = Path(run_dir)
    steps = read_steps(folder) or read_steps(folder / "ranks" / "0")
    out: dict[int, float] = {}
    for line in steps:
        metrics = line.get("metrics") if isinstance(line, Mapping) else None
        value = metrics.get(name) if isinstance(metrics, Mapping) else None
        if isinstance(value, (int, float)) and not isinstance(value, bool) \
                and line.get("repeat") in (None, 0):
            out[int(line.get("step", 0))] = float(value)
    return out


def _backward_missing(run: Side, ref: Side) -> Verdict | None:
    """DIFFERENT where the reference's gradients were non-zero at a step and the variant's were
    zero at every step it recorded (its backward never ran: megatron-core's full recompute with
    a frozen base, issue 47), whatever else the two runs compute differently."""
    if ref.status != "ok":
        return None
    mine, theirs = _series(run.run_dir, "grad_norm"), _series(ref.run_dir, "grad_norm")
    if not mine or not any(v > 0 for v in theirs.values()) or any(v != 0 for v in mine.values()):
        return None
    return Verdict(DIFFERENT, ref.variant, f"gradient norm 0 at every one of {len(mine)} steps "
                   f"where {ref.variant}'s is not: backward did not run", math.inf, None)


def _losses(rule: Sameness, run: Side, ref: Side) -> Verdict:
    mine, theirs = _series(run.run_dir, "loss"), _series(ref.run_dir, "loss")
    if not mine or not theirs:
        who = run.variant if not mine else ref.variant
        return not_compared(ref.variant, f"{who} recorded no per-step losses (steps.jsonl)")
    steps = sorted(set(mine) & set(theirs))
    if not steps:
        return not_compared(ref.variant, "no step in common with the reference")
    series = [("loss", mine, theirs)]
    g_mine, g_theirs = _series(run.run_dir, "grad_norm"), _series(ref.run_dir, "grad_norm")
    if g_mine and g_theirs:
        series.append(("gradient norm", g_mine, g_theirs))
    elif g_theirs and not g_mine:
        return Verdict(DIFFERENT, ref.variant, f"no gradient norm recorded where "
                       f"{ref.variant} has one at step {min(g_theirs)}: backward did not run",
                       math.inf, rule.bound)
    worst = 0.0
    for step in steps:
        for name, a, b in series:
            if step not in a or step not in b:
                continue
            x, y = a[step], b[step]
            if name == "gradient norm" and rule.kind == BOUNDED:
                # a bounded technique's gradients differ within rounding; what must hold is
                # that backward ran (a skipped backward leaves a zero norm)
                if (y > 0) != (x > 0) or not math.isfinite(x):
                    return Verdict(DIFFERENT, ref.variant, f"step {step}: gradient norm {x:.6g} "
                                   f"against {y:.6g}: backward did not run alike",
                                   math.inf, rule.bound)
                continue
            dev = _rel(x, y)
            if (rule.kind == EXACT and x != y) or dev > rule.bound:
                return Verdict(DIFFERENT, ref.variant, f"step {step}: {name} {x:.9g} against "
                               f"{y:.9g} (relative {dev:.3g})", dev, rule.bound)
            worst = max(worst, dev)
    if rule.kind == BOUNDED and len(series) > 1:
        what = "loss (gradient norms non-zero alike)"
    else:
        what = " and ".join(n for n, _, _ in series)
    return _agree(rule, ref.variant, f"{what} of {len(steps)} steps", worst)


def _agree(rule: Sameness, against: str, what: str, deviation: float) -> Verdict:
    if rule.kind == EXACT:
        return Verdict(SAME, against, f"{what} identical", 0.0, 0.0)
    return Verdict(WITHIN, against, f"{what}: largest deviation {deviation:.3g}, bound "
                   f"{rule.bound:.3g} ({rule.reason})", deviation, rule.bound)


def _evidence(run: Side, name: str) -> Any:
    folder = Path(run.run_dir)
    for path in (folder / "artifacts" / EVIDENCE_FILE,
                 folder / "ranks" / "0" / "artifacts" / EVIDENCE_FILE):
        data = read_evidence_file(path)
        if data is not None and name in data:
            return data[name]
    return None


def _items(value: Any) -> list[tuple[str, Any]]:
    """A mapping or list of recorded items as (label, item) pairs, in order."""
    if isinstance(value, Mapping):
        return [(str(k), value[k]) for k in value]
    if isinstance(value, Sequence) and not isinstance(value, str):
        return [(str(i), v) for i, v in enumerate(value)]
    return []


def _first_difference(a: Any, b: Any, at: str = "") -> str:
    """Where two nested lists first differ: ``at [1][1]: 9 against 5``."""
    if isinstance(a, list) and isinstance(b, list):
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return _first_difference(x, y, f"{at}[{i}]")
        return f"at {at or '[]'}: length {len(a)} against {len(b)}"
    return f"at {at or '[]'}: {a!r} against {b!r}"


def _lists(name: str, unit: str, units: str) -> Any:
    def read(rule: Sameness, run: Side, ref: Side) -> Verdict:
        mine, theirs = _evidence(run, name), _evidence(ref, name)
        if mine is None or theirs is None:
            who = run.variant if mine is None else ref.variant
            return not_compared(ref.variant, f"{who} recorded no {name} ({EVIDENCE_FILE})")
        a = dict(_items(mine))
        b = [(k, v) for k, v in _items(theirs) if k in a]  # what both recorded
        if not b:
            return not_compared(ref.variant, f"no {unit} of {name} in common")
        differ = [(k, v) for k, v in b if a[k] != v]
        share = len(differ) / len(b)
        what = f"{name} of {len(b)} {unit if len(b) == 1 else units}"
        firsts = _first_logits(run, ref, [k for k, _ in b]) if rule.kind == EXACT else None
        if firsts is not None and firsts[0]:
            k, x, y = firsts[0][0]
            return Verdict(DIFFERENT, ref.variant, f"the first token's logits of {unit} {k} "
                           f"differ (digest {x} against {y})", 1.0, 0.0)
        if differ and firsts is not None and rule.kind == EXACT:
            # the first tokens' logits are the reference's bit for bit: the cache or weights
            # came back as they were; later greedy tokens can differ between two runs of the
            # same cache on a GPU (a decode kernel that is not repeatable; docs/correctness.md)
            return Verdict(SAME, ref.variant, f"first-token logits of {firsts[1]} {units} "
                           f"identical; the later tokens of {len(differ)} differ, as two runs "
                           "of one cache can on a GPU", 0.0, 0.0)
        if firsts is not None:
            what = f"first-token logits and {what}"
        if differ and (rule.kind == EXACT or share > rule.bound):
            k, v = differ[0]
            return Verdict(DIFFERENT, ref.variant, f"{len(differ)} of {len(b)} {units} differ; "
                           f"first {unit} {k}: {_first_difference(a[k], v)}", share, rule.bound)
        return _agree(rule, ref.variant, what, share)
    return read


def _first_logits(run: Side, ref: Side, keys: list[str]
                  ) -> tuple[list[tuple[str, Any, Any]], int] | None:
    """The replies whose first-token logit digests differ, and how many were compared; None
    where either run recorded none (older records: the tokens alone decide)."""
    mine, theirs = _evidence(run, "first_logits"), _evidence(ref, "first_logits")
    if not isinstance(mine, Mapping) or not isinstance(theirs, Mapping):
        return None
    both = [k for k in keys if k in mine and k in theirs]
    if not both:
        return None
    return [(k, mine[k], theirs[k]) for k in both if mine[k] != theirs[k]], len(both)


def _checksum(rule: Sameness, run: Side, ref: Side) -> Verdict:
    mine, theirs = _evidence(run, "checksum"), _evidence(ref, "checksum")
    if mine is None or theirs is None:
        who = run.variant if mine is None else ref.variant
        return not_compared(ref.variant, f"{who} recorded no checksum ({EVIDENCE_FILE})")
    if mine != theirs:
        return Verdict(DIFFERENT, ref.variant, f"checksum {mine} against {theirs}", 1.0, 0.0)
    return _agree(rule, ref.variant, "checksum of the bytes moved", 0.0)


def _answers(rule: Sameness, run: Side, ref: Side) -> Verdict:
    """The run checked its own answers against a peer (the database's DuckDB)."""
    value = run.metrics.get("all_correct")
    if value is None:
        return not_compared(ref.variant, f"{run.variant} recorded no all_correct")
    if value != 1.0:
        return Verdict(DIFFERENT, ref.variant, "answers differ from DuckDB's "
                       "(artifacts/answers.json)", 1.0, 0.0)
    return Verdict(SAME, ref.variant, "every answer equals DuckDB's", 0.0, 0.0)


_MEASURES = {"losses": _losses, "tokens": _lists("tokens", "reply", "replies"),
             "topn": _lists("topn", "query", "queries"), "checksum": _checksum, "answers": _answers}
