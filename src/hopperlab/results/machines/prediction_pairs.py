"""The predictions of each pair of configs/prediction_errors.yaml: a results folder predicted
on another machine against that machine's runs, or one-GPU runs on N GPUs (gpu_count.py)
against the N-GPU runs; ``hopperlab prediction-errors`` measures the class errors from them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from hopperlab.core.errors import SpecError
from hopperlab.results.machines import descriptions, gpu_count, runs
from hopperlab.results.machines.predict import Prediction, predict
from hopperlab.results.machines.prediction_error import ERRORS_FILE, Pair


def predictions(root: Path, pairs: Sequence[Pair]) -> list[tuple[Pair, list[Prediction]]]:
    """Each pair's predictions (the source folder on the target, against its measurements)."""
    folder = root / descriptions.MACHINES_DIR
    descs = descriptions.load_descriptions(folder)
    out: list[tuple[Pair, list[Prediction]]] = []
    for pair in pairs:
        target = descriptions.find_description(folder, pair.target)
        if pair.gpus:
            source = runs.load_folder(root / pair.source)[0]  # its one-GPU runs
            links = runs.load_folder(root / pair.links) if pair.links else []
            out.append((pair, gpu_count.predict_counts(
                source, target, runs.load_folder(root / pair.measured), links)))
            continue
        measured = next((g for g in runs.load_folder(root / pair.measured)
                         if g.machine == target.name), None)
        if measured is None:
            raise SpecError(f"{root / ERRORS_FILE}: pair {pair.name}: "
                            f"{pair.measured} has no runs of {target.name}")
        preds: list[Prediction] = []
        for g in runs.load_folder(root / pair.source):
            if g.machine not in descs:
                raise SpecError(f"{root / ERRORS_FILE}: pair {pair.name}: "
                                f"{g.machine} has no description in {folder}")
            preds.extend(predict(g, descs[g.machine], target, measured))
        out.append((pair, preds))
    return out
