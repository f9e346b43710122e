"""Predictions across GPU counts: a run on N GPUs of a machine from its one-GPU run there plus
the collectives measured on the machine.

The pairs: a run ``<stem>-<N>gpu`` (or ``<stem>`` itself) on N > 1 GPUs and the one-GPU run
``<stem>-1gpu`` of the same experiment (the matrix's naming: inference/tp-long-context,
finetune/full-llama2-13b-sharded). Each family's ``PredictModel.across_gpus`` holds the model;
this module finds the pairs and the membench/collective runs, labels the prediction and sets
the N-GPU run's measurement beside it (issue 50's "across GPU counts").
"""

from __future__ import annotations

import re
from typing import Sequence

from hopperlab.results import correctness
from hopperlab.results.machines import prediction_error
from hopperlab.results.machines.descriptions import MachineDescription
from hopperlab.results.machines.predict import Prediction, _Ctx, _model, input_spread
from hopperlab.results.machines.runs import MachineRuns
from hopperlab.workloads.prediction import Collective, MissingInput, Unpredictable

_COUNT = re.compile(r"-(\d+)gpu$")


def gpus_of(group: MachineRuns, key: str) -> int:
    """The run's GPU count: its world size where it recorded one, else its spec's GPUs."""
    world = group.runs[key].metrics.get("world_size")
    if world:
        return int(world)
    resources = group.spec(key).get("resources") or {}
    return int(resources.get("gpus") or 1) * int(resources.get("nodes") or 1)


def stem(variant: str) -> str:
    return _COUNT.sub("", variant)


def collectives(groups: Sequence[MachineRuns]) -> tuple[Collective, ...]:
    """The ok membench/collective runs of ``groups`` (the eager ones and graph-replayed)."""
    out = []
    for g in groups:
        for key, row in sorted(g.runs.items()):
            if row.family != "membench" or row.status != "ok":
                continue
            params = g.params(key)
            if params.get("test") != "collective":
                continue
            out.append(Collective(str(params.get("op", "all_reduce")), bool(params.get("graph")),
                                  gpus_of(g, key), row))
    return tuple(out)


def predict_counts(source: MachineRuns, desc: MachineDescription,
                   measured: Sequence[MachineRuns],
                   links: Sequence[MachineRuns] = ()) -> list[Prediction]:
    """Every run on N > 1 GPUs in ``measured`` predicted from its one-GPU run in ``source``
    (``desc``: the machine's per-GPU description) and the collectives of ``links`` (default:
    the source's and the measured folders')."""
    colls = collectives(list(links) or [source, *measured])
    out: list[Prediction] = []
    for group in measured:
        for key in sorted(group.runs):
            row = group.runs[key]
            n = gpus_of(group, key)
            model = _model(row.family)
            if n < 2 or model is None or row.status != "ok" or row.family == "membench":
                continue
            one = f"{row.family}/{row.experiment}/{stem(row.variant)}-1gpu"
            for metric in model.metrics:
                if metric not in row.metrics:
                    continue
                pred = Prediction(key, row.family, row.experiment, row.variant, metric,
                                  f"{source.machine} (1 GPU)", f"{group.machine} ({n} GPUs)",
                                  None, measured=row.metrics.get(metric))
                out.append(pred)
                if model.across_gpus is None:
                    pred.unpredictable = f"the {row.family} family has no model across GPU counts"
                    continue
                if one not in source.runs or source.runs[one].status != "ok":
                    pred.unpredictable = (f"no ok one-GPU run {one} in {source.source} to "
                                          "predict it from")
                    continue
                wrong = next((correctness.not_a_finding(r) for r in (row, source.runs[one])
                              if not correctness.offered(r)), None)
                if wrong:  # a run that computed something else predicts nothing, nor is judged
                    pred.unpredictable, pred.measured = wrong, None
                    continue
                pred.source_value = source.runs[one].metrics.get(metric)
                ctx = _Ctx(source, one, desc, desc)
                try:
                    value, pred.model, pred.formula = model.across_gpus(ctx, metric, n, colls)
                    pred.predicted = value
                    pred.spread = input_spread(source.runs[one].metrics, metric)
                except (Unpredictable, MissingInput) as exc:
                    pred.unpredictable = str(exc)
                pred.inputs = {"one-GPU run": f"{one} ({source.source})", **ctx.inputs}
    prediction_error.attach(out, prediction_error.beside(desc.source_file))
    return out
