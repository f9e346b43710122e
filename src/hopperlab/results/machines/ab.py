"""``hopperlab compare A B``: two sets of runs (results folders, or two MLflow queries), per run
and metric the ratio B/A with its 95 % interval and a verdict by the test of
``hopperlab.core.effects``: faster (better), slower (worse), same within noise, or
inconclusive. What changed comes first; the exit status says whether anything got worse, or
failed or went missing in B (a CI gate lets no broken run through). A run that is not ok on
both sides (a GPU run skipped on every CPU folder), or a metric that is not a number on both,
is shown but is no change: a folder compared with itself is "no change", exit 0.

Each side's noise comes from its own repeats (``samples.jsonl``; from MLflow: the recorded
``<metric>_cv`` and ``<metric>_n``). Runs measured once on both sides have no noise estimate:
their ratio is shown and the verdict is ``inconclusive`` (unless the change is below the
minimum effect: then ``same``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from hopperlab.core import effects
from hopperlab.core.errors import SpecError
from hopperlab.core.rundir import finite_samples, read_samples
from hopperlab.results import correctness
from hopperlab.results.machines.references import direction
from hopperlab.results.rows import RunRow, collect_runs

SLOWER, FASTER, SAME, INCONCLUSIVE = "slower", "faster", "same within noise", "inconclusive"
WORSE_WORD, BETTER_WORD = "worse", "better"
ONLY_A, ONLY_B, NOT_OK = "only in A", "only in B", "not ok"
#: B's run did not end ok where A's did (or A had none)
FAILED_B = "failed in B"
#: neither side's run ended ok (skipped, failed...): shown, not a change
NOT_OK_BOTH = "not ok on both"
#: a metric recorded as NaN or inf: in B (broken, like a failed run), in A, on both (no change)
NAN_B, NAN_A, NAN_BOTH = "not a number in B", "not a number in A", "not a number on both"
#: shown, but no change between A and B
UNCHANGED = (SAME, NOT_OK_BOTH, NAN_BOTH)
#: a real change of a metric without a declared direction (neither better nor worse)
CHANGED = "changed"
#: the run reads DIFFERENT (``results.correctness``) in B (broken: exit 1) or in A (then B's
#: figures are compared with no wrong run): its figures give no faster or slower
DIFFERENT_B, DIFFERENT_A = "DIFFERENT in B", "DIFFERENT in A"
#: order on the page and in the text: what changed first
ORDER = (FAILED_B, DIFFERENT_B, NAN_B, SLOWER, WORSE_WORD, CHANGED, INCONCLUSIVE, FASTER,
         BETTER_WORD, NOT_OK, DIFFERENT_A, NAN_A, ONLY_A, ONLY_B, NOT_OK_BOTH, NAN_BOTH, SAME)
_SPEED = re.compile(r"(_ms|_s|time|per_s|gbps|qps|tflops|latency|lat_|ttft)", re.I)


@dataclass
class Change:
    key: str
    metric: str
    verdict: str
    a: float | None
    b: float | None
    n_a: int = 0
    n_b: int = 0
    effect: effects.Effect | None = None
    detail: str = ""

    @property
    def changed(self) -> bool:
        return self.verdict not in UNCHANGED


def _words(metric: str) -> tuple[str, str]:
    """(better, worse) for ``metric``: faster/slower for times and rates, else better/worse."""
    return (FASTER, SLOWER) if _SPEED.search(metric) else (BETTER_WORD, WORSE_WORD)


def measure_of(row: RunRow, metric: str, samples: Sequence[Mapping[str, float]]
               ) -> effects.Measure | None:
    """A run's measure of ``metric`` (``core.effects.measure_from``)."""
    return effects.measure_from(row.metrics, samples, metric)


def _samples(row: RunRow, metrics: Sequence[str]) -> list[dict[str, float]]:
    """The run's samples, each compared metric a finite number (else one clear error)."""
    folder = Path(row.run_dir)
    samples = read_samples(folder) if folder.is_dir() else []
    for metric in metrics:
        finite_samples(folder, samples, metric)
    return samples


def _recorded(row: RunRow) -> set[str]:
    """The metrics a run recorded, a value that is not a number included."""
    return set(row.metrics) | set(row.nonfinite)


def _not_a_number(row: RunRow, metric: str, samples: Sequence[Mapping[str, float]]) -> bool:
    """Whether ``metric`` is recorded, without a sample, as NaN or inf (a folder's record keeps
    it in ``nonfinite``; MLflow's metric is the NaN itself)."""
    if any(metric in s for s in samples):
        return False
    value = row.metrics.get(metric)
    return metric in row.nonfinite or (value is not None and not math.isfinite(value))


def _metrics(a: RunRow, b: RunRow) -> list[str]:
    wanted = list(dict.fromkeys([*a.headline_metrics, *b.headline_metrics]))
    wanted = [m for m in wanted if m in _recorded(a) or m in _recorded(b)]
    return wanted or sorted(_recorded(a) & _recorded(b))


def _status(a: RunRow | None, b: RunRow) -> Change:
    """The change of a run that B has and that did not end ok on one side at least."""
    why = f": {b.reason}" if b.reason else ""
    if b.status == "ok":
        return Change(b.key, "status", NOT_OK, None, None, detail=f"A {a.status}, B ok")
    if a is not None and a.status != "ok":
        return Change(b.key, "status", NOT_OK_BOTH, None, None,
                      detail=f"A {a.status}, B {b.status}{why}")
    was = f"A {a.status}" if a else "not in A"
    return Change(b.key, "status", FAILED_B, None, None, detail=f"{was}, B {b.status}{why}")


def compare_runs(a_rows: Mapping[str, RunRow], b_rows: Mapping[str, RunRow],
                 min_effect: float = effects.DEFAULT_MIN_EFFECT) -> list[Change]:
    """Every run key of either side, every headline metric of the run: its change A -> B."""
    out: list[Change] = []
    for key in sorted(set(a_rows) | set(b_rows)):
        a, b = a_rows.get(key), b_rows.get(key)
        if b is not None and (b.status != "ok" or (a is not None and a.status != "ok")):
            out.append(_status(a, b))
            continue
        if a is None or b is None:
            out.append(Change(key, "", ONLY_B if a is None else ONLY_A, None, None))
            continue
        wrong = _different(a, b)
        if wrong is not None:  # another computation on one side: no faster, no slower
            out.append(wrong)
            continue
        metrics = _metrics(a, b)
        sa, sb = _samples(a, metrics), _samples(b, metrics)
        for metric in metrics:
            out.append(_change(a, b, metric, sa, sb, min_effect))
    out.sort(key=lambda c: (ORDER.index(c.verdict), -(c.effect.worse_by if c.effect else 0)))
    return out


def _different(a: RunRow, b: RunRow) -> Change | None:
    """The run's change when either side reads DIFFERENT (``correctness.offered``), B first."""
    for side, row, verdict in (("B", b, DIFFERENT_B), ("A", a, DIFFERENT_A)):
        if not correctness.offered(row):
            return Change(row.key, "correctness", verdict, None, None,
                          detail=f"{side}: {correctness.not_a_finding(row)}")
    return None


def _change(a: RunRow, b: RunRow, metric: str, sa: Sequence[Mapping[str, float]],
            sb: Sequence[Mapping[str, float]], min_effect: float) -> Change:
    ma, mb = measure_of(a, metric, sa), measure_of(b, metric, sb)
    nan_a, nan_b = _not_a_number(a, metric, sa), _not_a_number(b, metric, sb)
    if nan_a or nan_b:
        verdict = NAN_BOTH if nan_a and nan_b else NAN_B if nan_b else NAN_A
        return Change(a.key, metric, verdict, ma.median if ma else None,
                      mb.median if mb else None, detail="recorded as NaN or inf, no sample")
    if ma is None or mb is None:
        return Change(a.key, metric, ONLY_B if ma is None else ONLY_A,
                      ma.median if ma else None, mb.median if mb else None)
    better, worse = _words(metric)
    way = direction(a.family, metric)
    try:
        eff = effects.compare(mb, ma, direction=way, min_effect=min_effect)
    except ValueError as exc:
        ratio = mb.median / ma.median if ma.median else math.nan
        small = math.isfinite(ratio) and ratio > 0 and abs(math.log(ratio)) < math.log1p(
            min_effect)
        return Change(a.key, metric, SAME if small else INCONCLUSIVE, ma.median, mb.median,
                      ma.n, mb.n, detail=f"x{ratio:.3f}; {exc}")
    verdict = {effects.WORSE: worse, effects.BETTER: better, effects.SAME: SAME,
               effects.UNCLEAR: INCONCLUSIVE}[eff.verdict]
    if way is None and eff.verdict == effects.WORSE:
        verdict = CHANGED  # no declared direction: a real change, neither better nor worse
    return Change(a.key, metric, verdict, ma.median, mb.median, ma.n, mb.n, eff, eff.detail)


def load_folder(folder: Path) -> dict[str, RunRow]:
    """A results folder's runs by key (refusing a folder without any)."""
    rows = collect_runs(Path(folder))
    if not rows:
        raise SpecError(f"{folder}: not a results folder (no run with a record)")
    return {r.key: r for r in rows}


def worse(changes: Sequence[Change]) -> list[Change]:
    """A metric slower or worse beyond the noise."""
    return [c for c in changes if c.verdict in (SLOWER, WORSE_WORD)]


def broken(changes: Sequence[Change]) -> list[Change]:
    """A run of B that did not end ok where A's did, or reads DIFFERENT, a metric of B that is
    not a number where A's is, or a run or metric of A that B lacks."""
    return [c for c in changes if c.verdict in (FAILED_B, DIFFERENT_B, NAN_B, ONLY_A)]


def unchanged_not_ok(changes: Sequence[Change]) -> list[Change]:
    """What is broken on both sides alike: shown, not a change."""
    return [c for c in changes if c.verdict in (NOT_OK_BOTH, NAN_BOTH)]


def failing(changes: Sequence[Change]) -> list[Change]:
    """What makes ``compare`` exit 1: B worse beyond the noise, or broken (``broken``); 0 only
    when nothing is."""
    return worse(changes) + broken(changes)


def text_lines(changes: Sequence[Change], a_name: str, b_name: str) -> list[str]:
    changed = [c for c in changes if c.changed]
    both = unchanged_not_ok(changes)
    same = len(changes) - len(changed) - len(both)
    count = f"{len(changed)} change(s)" if changed else "no change"
    lines = [f"[hopperlab] compare {a_name} (A) -> {b_name} (B): {count}, "
             f"{same} metric(s) the same within noise"
             + (f", {len(both)} not ok on both sides alike (not a change)" if both else "")]
    for c in [*changed, *both]:
        lines.append(f"{c.verdict.upper():<14} {c.key} {c.metric} {c.detail}".rstrip())
    return lines

