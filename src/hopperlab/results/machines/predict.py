"""Predictions of a machine nobody here has, from runs measured on one we have: the machinery.

Every prediction is labelled a prediction and carries its formula and inputs (each input with
where it comes from: the run's metric, a sibling run, or a machine description's figure and that
figure's source). A variant the models do not cover says why instead of guessing. Each family
keeps its model in ``workloads/<family>/predict.py`` (``FamilyInfo.predict``); this module gives
it the run's inputs (``_Ctx``, a ``workloads.prediction.PredictionInputs``), labels what it
predicts and sets the target's measurement beside it. The models (copy, overlap, compute, cpu,
kv reload, recommender components) and their formulas: docs/benchmarks/machines.md
("Predictions").
"""

from __future__ import annotations

import math
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any, Callable

from hopperlab.results import correctness
from hopperlab.results.machines.descriptions import MachineDescription
from hopperlab.results.machines import prediction_error
from hopperlab.results.machines.energy import PredictedEnergy, predict_energy
from hopperlab.results.machines.runs import MachineRuns
from hopperlab.results.rows import RunRow
from hopperlab.workloads import FAMILY_MODULES, family_info
from hopperlab.workloads.prediction import MissingInput, PredictModel, Unpredictable

PREDICTION = "prediction"


@dataclass
class Prediction:
    key: str
    family: str
    experiment: str
    variant: str
    metric: str
    source_machine: str
    target_machine: str
    source_value: float | None
    predicted: float | None = None
    model: str = ""
    formula: str = ""
    inputs: dict[str, str] = field(default_factory=dict)
    #: why the models do not predict this one (None: predicted)
    unpredictable: str | None = None
    #: the target's own measurement, where the target was measured too
    measured: float | None = None
    label: str = PREDICTION
    #: energy per unit on the target: predicted time x its module power (None: not predicted)
    energy: PredictedEnergy | None = None
    #: the model class's measured error (prediction_error.ClassError; None: never checked)
    class_error: Any = None
    #: where the measurement falls if the prediction errs no more than the wider of its
    #: class's worst error and ``spread``: predicted/(1+w) .. predicted/(1-w)
    interval: tuple[float, float] | None = None
    #: the inputs' own spread as a fraction, where a model reports one
    spread: float | None = None
    #: the target's measurement is one of the prediction's inputs (its description took the
    #: figure from this very run): its error is no evidence, and measures no class
    circular: bool = False

    @property
    def error(self) -> float | None:
        """(predicted - measured) / measured."""
        if self.predicted is None or not self.measured:
            return None
        return (self.predicted - self.measured) / self.measured


class _Ctx:
    """One source run, its siblings, and both machines' descriptions; collects the inputs (the
    ``PredictionInputs`` a family's model reads)."""

    def __init__(self, group: MachineRuns, key: str, src: MachineDescription,
                 tgt: MachineDescription) -> None:
        self.group, self.key, self.src, self.tgt = group, key, src, tgt
        self.row: RunRow = group.runs[key]
        spec = group.spec(key)
        self.params: dict[str, Any] = dict(spec.get("params") or {})
        self.knobs: dict[str, Any] = dict(spec.get("knobs") or {})
        self.inputs: dict[str, str] = {}
        #: the model's own uncertainty as a fraction (a figure bracketed by two bounds)
        self.spread: float | None = None

    def metric(self, name: str, row: RunRow | None = None, label: str | None = None) -> float:
        row = row or self.row
        value = row.metrics.get(name)
        if value is None:
            raise MissingInput(f"{row.key} on {self.group.machine} has no metric {name} "
                           f"({row.run_dir}/metrics.json)")
        self.inputs[label or name] = f"{value:.6g} (measured: {row.key} on {self.group.machine})"
        return value

    def fig(self, desc: MachineDescription, path: str, label: str) -> float:
        figure = desc.figure(path)
        if figure.value is None:
            raise MissingInput(f"{desc.name} has no figure {path} ({figure.source})")
        self.inputs[label] = f"{figure.value:g} ({desc.name} {path}: {figure.source})"
        return float(figure.value)

    def sibling(self, match: Callable[[dict[str, Any], dict[str, Any]], bool],
                what: str) -> RunRow:
        """The first ok run of the same experiment whose params and knobs ``match``."""
        for key, row in self.group.runs.items():
            if key == self.key or row.family != self.row.family or \
                    row.experiment != self.row.experiment or row.status != "ok" \
                    or not correctness.offered(row):  # DIFFERENT: no input to a prediction
                continue
            spec = self.group.spec(key)
            if match(dict(spec.get("params") or {}), dict(spec.get("knobs") or {})):
                self.inputs[f"sibling ({what})"] = key
                return row
        raise MissingInput(f"no ok run of {self.row.family}/{self.row.experiment} on "
                       f"{self.group.machine} measured {what}")

    def compute_scale(self, kind: str) -> float:
        """k = peak_S / peak_T for ``bf16``, ``fp8`` or ``hbm``."""
        path = {"bf16": "bf16_tflops", "fp8": "fp8_tflops", "hbm": "hbm_tbps"}[kind]
        return self.fig(self.src, path, f"{path} S") / self.fig(self.tgt, path, f"{path} T")


def input_spread(metrics: dict[str, float], metric: str) -> float | None:
    """The measured figure's own spread, where the run repeated it: half its confidence
    interval (``<metric>_ci_low`` .. ``_ci_high``) over the value (None: not repeated)."""
    value, lo, hi = (metrics.get(metric), metrics.get(f"{metric}_ci_low"),
                     metrics.get(f"{metric}_ci_high"))
    if not value or lo is None or hi is None or not all(map(math.isfinite, (value, lo, hi))):
        return None
    return abs(hi - lo) / 2 / abs(value)


def _model(family: str) -> PredictModel | None:
    """The family's prediction model (None: it declares none, or is not a family here)."""
    return family_info(family).load_predict() if family in FAMILY_MODULES else None


def predict_run(group: MachineRuns, key: str, src: MachineDescription,
                tgt: MachineDescription) -> list[Prediction]:
    """Predictions of one run's figures on ``tgt`` (an unpredictable one says why)."""
    row = group.runs[key]
    model = _model(row.family)
    out = []
    for metric in model.metrics if model is not None else ():
        if metric not in row.metrics and row.status == "ok" and model.only_measured:
            continue  # the run does not measure this query / study's figure
        pred = Prediction(key, row.family, row.experiment, row.variant, metric, group.machine,
                          tgt.name, row.metrics.get(metric))
        ctx = _Ctx(group, key, src, tgt)
        try:
            if row.status != "ok":
                raise Unpredictable(f"the run ended {row.status}")
            if not correctness.offered(row):  # a wrong run's speed scaled is no prediction
                raise Unpredictable(str(correctness.not_a_finding(row)))
            value, pred.model, pred.formula = model.predict(ctx, metric)
            if not math.isfinite(value):
                raise MissingInput("the model gives no finite value")
            pred.predicted = value
            spreads = [x for x in (input_spread(row.metrics, metric), ctx.spread) if x]
            pred.spread = max(spreads) if spreads else None
        except (Unpredictable, MissingInput) as exc:
            pred.unpredictable = str(exc)
        pred.inputs = ctx.inputs
        if pred.predicted is not None:
            pred.energy = predict_energy(row.family, metric, pred.predicted, tgt, ctx.params)
        out.append(pred)
    if model is None or not model.metrics:
        out.append(Prediction(key, row.family, row.experiment, row.variant, "-", group.machine,
                              tgt.name, None, unpredictable=f"no model for the {row.family} "
                                                            f"family"))
    return out


def _cites(inputs: dict[str, str], run_dir: Path, key: str) -> bool:
    """Whether an input's source names the run (``<results folder>/<key>``) itself."""
    tail = f"{run_dir.parents[2].name}/{key}" if len(run_dir.parents) > 2 else key
    return any(tail in v for v in inputs.values())


def predict(group: MachineRuns, src: MachineDescription, tgt: MachineDescription,
            measured: MachineRuns | None = None) -> list[Prediction]:
    """Every run of ``group`` predicted on ``tgt``; with ``measured`` (the target's own runs),
    each prediction carries the target's measurement for the error."""
    out = []
    for key in sorted(group.runs):
        for pred in predict_run(group, key, src, tgt):
            if measured is not None and key in measured.runs:
                other = measured.runs[key]
                pred.measured = other.metrics.get(pred.metric) \
                    if other.status == "ok" and correctness.offered(other) else None
                pred.circular = _cites(pred.inputs, Path(other.run_dir), key)
                if pred.energy is not None and pred.energy.joules is not None:
                    pred.energy = predict_energy(pred.family, pred.metric, pred.predicted, tgt,
                                                 group.params(key), other)
            out.append(pred)
    prediction_error.attach(out, prediction_error.beside(tgt.source_file))
    return out
