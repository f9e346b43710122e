"""database on a machine we do not have: scans of GPU memory scale with HBM, host placements
with their link (the overlap model).

A prediction model (``hopperlab.workloads.prediction``), named by this family's
``FamilyInfo.predict``; its formulas: docs/benchmarks/machines.md ("Predictions"). Cheap to
import (no torch): ``hopperlab predict`` runs on the login node.
"""

from __future__ import annotations

from hopperlab.workloads.prediction import (PredictionInputs, PredictModel, Unpredictable,
                                           overlap)


_PLACEMENT_LINK = {"host-pinned": "host_link.pinned.h2d", "pageable": "host_link.pageable.h2d",
                   "zero-copy": "host_link.direct_h2d"}


def _predict(ctx: PredictionInputs, metric: str) -> tuple[float, str, str]:
    if not metric.endswith("_time_ms"):
        raise Unpredictable(f"{metric} is not modelled (the query times are)")
    query = metric[: -len("_time_ms")]
    placement = ctx.params.get("placement", "device")
    t = ctx.metric(metric, label=f"t ({metric})")
    k = ctx.compute_scale("hbm")
    if placement == "device":
        return t * k, "compute", "t' = t * k; k = hbm_tbps S/T (scans read GPU memory)"
    if placement not in _PLACEMENT_LINK:
        raise Unpredictable(f"placement {placement} is not modelled")
    path = _PLACEMENT_LINK[placement]
    bytes_read = ctx.metric(f"{query}_bytes_read")
    r_s = ctx.fig(ctx.src, path, "r_S")
    r_t = ctx.fig(ctx.tgt, path, "r_T")
    encoding = ctx.params.get("encoding", "plain")
    device = ctx.sibling(lambda p, kn: p.get("placement", "device") == "device"
                         and p.get("encoding", "plain") == encoding, "the device placement")
    c = ctx.metric(metric, device, f"C ({metric} of the device placement)")
    floor = bytes_read / (r_s * 1e9) * 1e3
    value = overlap(t, c, floor, k, r_s / r_t)
    return value, "overlap", (f"t' = max(C*k, L*r_S/r_T) + (t - max(C, L)); L = bytes_read/r_S; "
                              f"r = {path}; k = hbm_tbps S/T")


#: a run measures the queries it runs only: the others are left out
MODEL = PredictModel(metrics=("q1_time_ms", "q3_time_ms", "q5_time_ms", "q6_time_ms",
                              "q12_time_ms", "q14_time_ms"),
                     predict=_predict, only_measured=True)
