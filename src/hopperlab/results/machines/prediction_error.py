"""How far each prediction model has been off where we could check it, and the interval that
follows.

A prediction is worth acting on only with its error: ``configs/prediction_errors.yaml`` lists
the pairs (a results folder predicted on a machine whose own runs we have, or a GPU count from
another) and, per model class (the ``model`` a family's predict.py names: copy, compute,
overlap, hbm + launch, launch-bound, host CPU, kv reload, collective, ...), the rows, the median
and the worst |error| measured on them. Every prediction then carries ``likely lo-hi``: where the
measurement falls if the prediction errs no more than its class's worst ``e``:
``P/(1+e) .. P/(1-e)``, widened to the figure's own spread ``s`` where a model brackets it or
the run repeated it (``P(1-s) .. P(1+s)``).
``hopperlab prediction-errors --write`` remeasures the table from the pairs, and a test checks
the committed one against them, so it cannot drift from the models.
"""

from __future__ import annotations

import html
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Protocol, Sequence

import yaml

from hopperlab.core.errors import SpecError
from hopperlab.core.schema import load_yaml



class Prediction(Protocol):
    """What this module reads and sets of a prediction (``predict.Prediction`` has it; a
    protocol, since predict.py imports this module to attach the intervals)."""

    key: str
    metric: str
    model: str
    source_value: float | None
    predicted: float | None
    measured: float | None
    unpredictable: str | None
    class_error: Any
    interval: tuple[float, float] | None
    spread: float | None
    circular: bool

    @property
    def error(self) -> float | None: ...

ERRORS_FILE = Path("configs") / "prediction_errors.yaml"
#: a figure off by more than this is not good enough for a decision (issue 50)
DECISION_ERROR = 0.10


@dataclass(frozen=True)
class Pair:
    """One check: ``source`` (a results folder) predicted on ``target`` (a machine description),
    against ``measured`` (the target's own results folder); paths relative to the project."""

    source: str
    target: str
    measured: str
    #: across GPU counts: the one-GPU runs of ``source`` predict the N-GPU runs of
    #: ``measured`` on the same machine, with the collectives of ``links`` (gpu_count.py)
    gpus: bool = False
    links: str = ""

    @property
    def name(self) -> str:
        if self.gpus:
            return f"{Path(self.source).name} 1 GPU -> {Path(self.measured).name} N GPUs"
        return f"{Path(self.source).name} -> {Path(self.measured).name}"


@dataclass(frozen=True)
class ClassError:
    """A model class's measured error: over ``rows`` predictions with a measurement, on
    ``pairs`` (the pairs' names)."""

    model: str
    rows: int
    median: float
    worst: float
    pairs: tuple[str, ...]

    @property
    def pairs_text(self) -> str:
        """"2 machine pairs" or "3 GPU-count pairs" (what the error was measured on)."""
        kind = "GPU-count" if all(" GPU" in p for p in self.pairs) else "machine"
        return f"{len(self.pairs)} {kind} pair{'s' if len(self.pairs) != 1 else ''}"

    def text(self) -> str:
        return (f"model class {self.model}: error {self.worst:.0%} at worst (median "
                f"{self.median:.1%}, {self.rows} rows) on {self.pairs_text}")


def measured_rows(preds: Iterable[Prediction]) -> list[Prediction]:
    """The predictions the target measured too (those with an error), but for the circular ones
    (the copy model on a description that took its figure from this very run)."""
    return [p for p in preds
            if p.error is not None and math.isfinite(p.error) and not p.circular]


def summary_line(preds: Sequence[Prediction]) -> str:
    """rows, median |error|, within 10 %, worst, and how many were not predicted: the line
    ``predict --measured`` and machines.html open with."""
    rows = measured_rows(preds)
    refused = sum(1 for p in preds if p.unpredictable)
    if not rows:
        return (f"no prediction has a measurement on its target ({len(preds)} predictions, "
                f"{refused} not predicted)")
    errors = [abs(p.error or 0.0) for p in rows]
    worst = max(rows, key=lambda p: abs(p.error or 0.0))
    within = sum(1 for e in errors if e <= DECISION_ERROR)
    return (f"{len(rows)} row{'s' if len(rows) != 1 else ''} measured on their target: "
            f"median |error| "
            f"{statistics.median(errors):.1%}, {within} within {DECISION_ERROR:.0%}, worst "
            f"{worst.error:+.1%} ({worst.key} {worst.metric}, model {worst.model}); "
            f"{refused} not predicted (each says why)")


def measure(by_pair: Sequence[tuple[Pair, Sequence[Prediction]]]) -> dict[str, ClassError]:
    """Per model class, the |error| of every measured row over the pairs."""
    errors: dict[str, list[float]] = {}
    pairs: dict[str, list[str]] = {}
    for pair, preds in by_pair:
        for p in measured_rows(preds):
            errors.setdefault(p.model, []).append(abs(p.error or 0.0))
            if pair.name not in pairs.setdefault(p.model, []):
                pairs[p.model].append(pair.name)
    # the worst rounded up: the interval it makes must hold the rows it was measured on
    return {m: ClassError(m, len(e), round(statistics.median(e), 4),
                          math.ceil(max(e) * 1e4) / 1e4, tuple(pairs[m]))
            for m, e in sorted(errors.items())}


def load(path: Path) -> tuple[list[Pair], dict[str, ClassError]]:
    """The committed pairs and class errors; a bad entry is a one-line error naming it."""
    data = load_yaml(path, "prediction errors") or {}
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a mapping with pairs: and classes:")
    pairs = []
    for i, item in enumerate(data.get("pairs") or []):
        try:
            pairs.append(Pair(str(item["source"]), str(item["target"]), str(item["measured"]),
                              bool(item.get("gpus", False)), str(item.get("links", ""))))
        except (KeyError, TypeError) as exc:
            raise SpecError(f"{path}: pairs[{i}]: needs source, target and measured ({exc})") \
                from None
    classes = {}
    for model, item in (data.get("classes") or {}).items():
        try:
            classes[model] = ClassError(model, int(item["rows"]), float(item["median"]),
                                        float(item["worst"]), tuple(item["pairs"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise SpecError(f"{path}: classes.{model}: needs rows, median, worst and pairs "
                            f"({exc})") from None
    return pairs, classes


def dump(pairs: Sequence[Pair], classes: dict[str, ClassError], header: str) -> str:
    """The YAML text of the table (what ``--write`` commits)."""
    data = {"pairs": [{"source": p.source, "target": p.target, "measured": p.measured,
                       **({"gpus": True, "links": p.links} if p.gpus else {})} for p in pairs],
            "classes": {m: {"rows": c.rows, "median": c.median,
                            "worst": c.worst, "pairs": list(c.pairs)}
                        for m, c in classes.items()}}
    return header + yaml.safe_dump(data, sort_keys=False, width=100)


def beside(machine_file: str) -> dict[str, ClassError]:
    """The committed class errors of the project a machine description was read from
    (``configs/machines/<name>.yaml`` -> ``configs/prediction_errors.yaml``); none when the
    description was not read from a file or the project has no table."""
    if not machine_file:
        return {}
    path = Path(machine_file).parent.parent / ERRORS_FILE.name
    return load(path)[1] if path.exists() else {}


def attach(preds: Iterable[Prediction], classes: dict[str, ClassError]) -> None:
    """Give each prediction its class's measured error and its interval."""
    for p in preds:
        if p.predicted is None:
            continue
        c = classes.get(p.model)
        p.class_error = c
        if c is None and not p.spread:
            continue
        # the class: error = (P - M) / M within +-e  <=>  M within P/(1+e) .. P/(1-e);
        # the figure's own spread s (a bracket, repeats): P(1-s) .. P(1+s); the wider of both
        e, s = (c.worst if c else 0.0), p.spread or 0.0
        p.interval = (min(p.predicted / (1 + e), p.predicted * (1 - s)),
                      max(p.predicted / (1 - e) if e < 1 else math.inf, p.predicted * (1 + s)))


def interval_text(p: Prediction) -> str:
    """"0.94x the source's, likely 0.85-1.03x (model class compute error 6% on 2 machine
    pairs)", or why there is no interval; the ratio is to the source's own measurement."""
    if p.predicted is None:
        return f"not predicted: {p.unpredictable}"
    ratio = p.predicted / p.source_value if p.source_value else None
    head = f"{ratio:.2f}x the source's" if ratio is not None else f"{p.predicted:.4g}"
    c = p.class_error
    if p.interval is None:
        return head + f", no interval: model class {p.model} was never checked on a machine pair"
    lo, hi = p.interval
    if ratio is not None and p.source_value:
        band = f"likely {lo / p.source_value:.2f}-{hi / p.source_value:.2f}x"
    else:
        band = f"likely {lo:.4g}-{hi:.4g}"
    why = (f"model class {p.model} error {c.worst:.0%} on {c.pairs_text}"
           if c is not None else f"model class {p.model} never checked on a machine pair")
    if p.spread and (c is None or p.spread > c.worst):
        why += f"; its own spread {p.spread:.0%} (a bracket, or its run's repeats)"
    return f"{head}, {band} ({why})"


def csv_fields(p: Prediction) -> dict[str, Any]:
    """The interval, class and pairs as summary.csv / verdict columns (results/report calls
    this: ``prediction_error.csv_fields``)."""
    c = p.class_error
    return {"prediction_model": p.model, "prediction_low": p.interval[0] if p.interval else "",
            "prediction_high": p.interval[1] if p.interval else "",
            "prediction_class_error": c.worst if c else "",
            "prediction_pairs": "; ".join(c.pairs) if c else ""}


def summary_html(preds: Sequence[Prediction]) -> str:
    """machines.html's lead for the predictions: the summary line and the error table of the
    model classes these predictions use (results/machines/compare.py calls it)."""
    pairs: dict[tuple[str, str], list[Prediction]] = {}
    for p in preds:
        pairs.setdefault((p.source_machine, p.target_machine), []).append(p)
    out = [f'<p class="meta"><b>{html.escape(src)} -> {html.escape(tgt)}</b>: '
           f"{html.escape(summary_line(group))}</p>"
           for (src, tgt), group in pairs.items() if measured_rows(group)]
    classes = {p.class_error.model: p.class_error for p in preds if p.class_error is not None}
    if classes:
        out.append('<p class="meta">each prediction\'s interval ("likely"): where the '
                   "measurement falls if the prediction errs no more than its model class did "
                   "on the pairs below (or its own spread, where wider); "
                   "configs/prediction_errors.yaml</p>")
        out.append("<table><thead><tr><th>model class</th><th>rows</th><th>median |error|</th>"
                   "<th>worst |error|</th><th>measured on</th></tr></thead><tbody>")
        for c in sorted(classes.values(), key=lambda c: c.model):
            out.append(f"<tr><td>{html.escape(c.model)}</td><td class=\"num\">{c.rows}</td>"
                       f'<td class="num">{c.median:.1%}</td><td class="num">{c.worst:.1%}</td>'
                       f"<td>{html.escape('; '.join(c.pairs))}</td></tr>")
        out.append("</tbody></table>")
    return "".join(out)
