"""membench on a machine we do not have: copy bandwidth is the target's host link.

A prediction model (``hopperlab.workloads.prediction``), named by this family's
``FamilyInfo.predict``; its formulas: docs/benchmarks/machines.md ("Predictions"). Cheap to
import (no torch): ``hopperlab predict`` runs on the login node.
"""

from __future__ import annotations

from hopperlab.workloads.prediction import PredictionInputs, PredictModel, Unpredictable


def _predict(ctx: PredictionInputs, metric: str) -> tuple[float, str, str]:
    if ctx.params.get("test", "copy") == "collective":
        raise Unpredictable("the GPU-GPU link (NVLink, network) is in no machine description yet")
    if ctx.params.get("test", "copy") != "copy":
        raise Unpredictable("allocation cost and first touch depend on the driver and the OS, "
                            "which no machine description holds")
    memory = ctx.params.get("host_memory", "pinned")
    direction = ctx.params.get("direction", "h2d")
    path = f"host_link.{memory}.{direction}"
    value = ctx.fig(ctx.tgt, path, f"{path} T")
    return value, "copy", f"{metric}' = d(T, {path})"


MODEL = PredictModel(metrics=("gbps_at_largest",), predict=_predict)
