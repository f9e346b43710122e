"""Correct beside fast (issue 47): each variant's verdict against the run it is compared with.

``verdicts(runs)`` gives every run of one experiment its ``Verdict`` (None for the reference
itself and for a run that did not end ok); ``results.rows`` attaches it to each row as
``correctness``, so that every page reads the same verdict. A ``DIFFERENT`` run's figures are
never offered as a ratio or a finding (``offered``).
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any, Mapping, Sequence

from hopperlab.core.rundir import load_record
from hopperlab.results.correctness.verdict import (
    DIFFERENT,
    NOT_COMPARED,
    SAME,
    VERDICTS,
    WITHIN,
    Side,
    Verdict,
    judge,
    not_compared,
)
from hopperlab.workloads import family_info

__all__ = ["DIFFERENT", "NOT_COMPARED", "SAME", "VERDICTS", "WITHIN", "Verdict", "offered",
           "findings", "not_a_finding", "left_out", "NOT_A_FINDING", "verdicts",
           "different_lines", "MLFLOW_TAG", "MLFLOW_METRIC"]

log = logging.getLogger(__name__)

#: the MLflow tag carrying the verdict, and the metric carrying its deviation
MLFLOW_TAG = "correctness"
MLFLOW_METRIC = "correctness_deviation"


def _spec(run_dir: Path) -> Mapping[str, Any]:
    try:
        data = json.loads((Path(run_dir) / "spec.json").read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, Mapping) else {}


def _rule(family: str) -> Any:
    try:
        return family_info(family).load_sameness()
    except (KeyError, ImportError, AttributeError) as exc:
        log.warning("%s: no sameness rule: %s", family, exc)
        return None


def verdict_of(run: Any, ref: Any | None, reference_name: str | None) -> Verdict | None:
    """One run's verdict against ``ref`` (the run of ``reference_name``; None: it has no run)."""
    if run.status != "ok" or reference_name is None or run.variant == reference_name:
        return None
    if ref is None:
        return not_compared(reference_name, f"{reference_name} has no run")
    rule = _rule(run.family)
    if rule is None:
        return not_compared(ref.variant, f"the {run.family} family declares no sameness")
    spec, ref_spec = _spec(run.run_dir), _spec(ref.run_dir)
    if not spec or not ref_spec:
        return not_compared(ref.variant, "no spec.json to read the declaration from")
    try:
        declared = rule(spec, ref_spec)
    except (KeyError, TypeError, ValueError) as exc:
        return not_compared(ref.variant, f"the declaration cannot be read: {exc}")
    try:
        return judge(declared, Side(run.variant, run.status, Path(run.run_dir), run.metrics),
                     Side(ref.variant, ref.status, Path(ref.run_dir), ref.metrics))
    except (OSError, KeyError, TypeError, ValueError) as exc:  # a hand-edited or torn record
        return not_compared(ref.variant, f"the records cannot be compared: "
                            f"{type(exc).__name__}: {exc}")


def verdicts(runs: Sequence[Any]) -> dict[str, Verdict | None]:
    """variant -> verdict, for the runs of one experiment (rows with ``variant``, ``status``,
    ``run_dir``, ``metrics``, ``baseline``, ``compare_to``)."""
    by_name = {r.variant: r for r in runs}
    baseline = next((r.baseline for r in runs if r.baseline), None)
    out = {}
    for r in runs:
        name = r.compare_to or baseline
        out[r.variant] = verdict_of(r, by_name.get(name) if name else None, name)
    return _through_wrong_references(runs, out, baseline)


def _through_wrong_references(runs: Sequence[Any], found: dict[str, Verdict | None],
                              baseline: str | None) -> dict[str, Verdict | None]:
    """A run compared with a run that reads DIFFERENT (its ``compare_to`` computed something
    else than the baseline) reads DIFFERENT too, saying why: what agrees with a wrong result,
    or is timed against one, is no finding (fp8 within bound of a broken bf16-compile)."""
    for _ in runs:  # chains: as many passes as runs, at most
        changed = False
        for r in runs:
            ref = r.compare_to or baseline
            v, rv = found.get(r.variant), found.get(ref) if ref else None
            if rv is None or not rv.different or v is None or v.different:
                continue
            found[r.variant] = Verdict(DIFFERENT, ref, f"compared with {ref}, which reads "
                                       f"DIFFERENT against {rv.against}: {rv.detail}",
                                       math.inf, None)
            changed = True
        if not changed:
            break
    return found


class _Dir:
    """A run directory read as a row (for the uploader, which sees one run at a time)."""

    def __init__(self, run_dir: Path) -> None:
        record = load_record(run_dir) or {}
        spec = _spec(run_dir)
        self.run_dir, self.family = run_dir, str(spec.get("family") or "")
        self.variant = run_dir.name
        self.status = str(record.get("status") or "failed")
        metrics = record.get("metrics")
        self.metrics = dict(metrics) if isinstance(metrics, Mapping) else {}
        self.baseline, self.compare_to = spec.get("baseline"), spec.get("compare_to")


def of_run_dir(run_dir: Path) -> Verdict | None:
    """The verdict of the run in ``run_dir`` against its reference in the same experiment
    folder, as it stands now (a reference still running reads ``not compared``)."""
    try:
        run = _Dir(Path(run_dir))
        name = run.compare_to or run.baseline
        ref_dir = Path(run_dir).parent / str(name) if name else None
        ref = _Dir(ref_dir) if ref_dir is not None and load_record(ref_dir) else None
    except (OSError, ValueError):
        return None
    return verdict_of(run, ref, name)


def mlflow_fields(run_dir: Path) -> tuple[dict[str, str], dict[str, float]]:
    """The tag (``correctness``: the verdict, and its detail) and the metric (its deviation)
    a run is uploaded with; empty where there is no verdict (the reference itself)."""
    v = of_run_dir(run_dir)
    if v is None:
        return {}, {}
    tags = {MLFLOW_TAG: v.state, f"{MLFLOW_TAG}.detail": v.detail,
            f"{MLFLOW_TAG}.against": v.against or ""}
    dev = v.deviation
    return tags, ({MLFLOW_METRIC: dev} if dev is not None and math.isfinite(dev) else {})


def offered(run: Any) -> bool:
    """Whether a run's speed, memory and energy may be offered as a ratio or a finding: not
    when it computed something else than what it is compared with."""
    v = getattr(run, "correctness", None)
    return not (v is not None and v.different)


#: the mark every page draws on a DIFFERENT run's figure (a bar, a point, a cell)
NOT_A_FINDING = f"{DIFFERENT}: not a finding"


def findings(runs: Sequence[Any]) -> list[Any]:
    """The runs a page may rank, pick as best, fastest or cheapest, or draw as a result: those
    ``offered`` (every page that ranks or charts runs filters through this one helper)."""
    return [r for r in runs if offered(r)]


def not_a_finding(run: Any) -> str | None:
    """The mark and why (``DIFFERENT: not a finding (against X: detail)``) for a run whose
    figures are no finding, for a label or a tooltip; None for a run that is ``offered``."""
    if offered(run):
        return None
    v = run.correctness
    return f"{NOT_A_FINDING} (against {v.against}: {v.detail})"


def left_out(runs: Sequence[Any]) -> str:
    """``DIFFERENT: not a finding: a, b`` naming (by variant) the runs a ranking or chart left
    out or marked ('' when none)."""
    wrong = [str(r.variant) for r in runs if not offered(r)]
    return f"{NOT_A_FINDING}: {', '.join(wrong)}" if wrong else ""


def different_lines(runs: Sequence[Any]) -> list[str]:
    """``DIFFERENT key against X: detail``, one per run that reads DIFFERENT."""
    return [f"DIFFERENT {r.key} against {r.correctness.against}: {r.correctness.detail}"
            for r in runs if getattr(r, "correctness", None) is not None
            and r.correctness.different]
