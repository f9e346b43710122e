"""database on a machine we do not have: a device plan is its HBM term plus its launch term,
host placements are their link (the overlap model).

A device-resident plan runs at a fraction of HBM (q1 reads 2.6 GB in 3.4 ms on an H200: 0.78 of
4.8 TB/s): scaling the whole time by HBM erred +16 to +39 % H200 -> H100. Its time is
``B/hbm`` (the bytes it reads at the peak) plus the rest (kernel launches, reductions, the
group-by), measured per plan as ``t - B/hbm_S`` and scaled by the SMs' rate (bf16 peak S/T).
That holds for the fused plans (q1, q6: one kernel reads each stored byte once, fused.py); the
unfused ones materialise intermediates the records do not count: their time lies between that
bound and all of it at HBM, and they are predicted as the middle with the bracket as interval.

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
        return _device(ctx, metric, query, t)
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


#: the plans that run as one Triton kernel per chunk over the stored columns (plans.py's
#: ``fused.q1_chunk`` and ``fused.q6_chunk``): their bytes through HBM are ``<q>_bytes_read``
FUSED_QUERIES = ("q1", "q6")


def _device(ctx: PredictionInputs, metric: str, query: str, t: float) -> tuple[float, str, str]:
    """t' = B/hbm_T + (t - B/hbm_S) * k_sm: the HBM term at the target's peak, the launch term
    (what the HBM term does not explain) scaled by the SMs' rate."""
    b = ctx.metric(f"{query}_bytes_read", label=f"B ({query}_bytes_read)")
    hbm_s = ctx.fig(ctx.src, "hbm_tbps", "hbm_tbps S")
    hbm_t = ctx.fig(ctx.tgt, "hbm_tbps", "hbm_tbps T")
    k_sm = ctx.compute_scale("bf16")
    hbm_ms_s, hbm_ms_t = b / (hbm_s * 1e12) * 1e3, b / (hbm_t * 1e12) * 1e3
    launch = t - hbm_ms_s
    if launch < 0:
        raise Unpredictable(f"{query} read faster than the source's HBM peak "
                            f"({b / t / 1e9:.0f} GB/s): its bytes are not what crossed HBM")
    ctx.inputs["launch term S (t - B/hbm_S)"] = f"{launch:.6g} ms (derived from the above)"
    stored = hbm_ms_t + launch * k_sm
    formula = ("t' = B/hbm_T + (t - B/hbm_S) * k; B = bytes_read; k = bf16_tflops S/T (the "
               "launch term runs on the SMs)")
    if query in FUSED_QUERIES and ctx.params.get("fused_kernels", True):
        return stored, "hbm + launch", formula + " (the fused plan reads each stored byte once)"
    # PyTorch operators write and reread intermediates that bytes_read does not count: the
    # plan's HBM traffic lies between the stored bytes (the bound above) and all of its time
    every = t * hbm_s / hbm_t
    lo, hi = sorted((stored, every))
    ctx.spread = (hi - lo) / (hi + lo)
    return ((lo + hi) / 2, "hbm bracket",
            "t' = the middle of [B/hbm_T + (t - B/hbm_S) * k, t * hbm_S/hbm_T]; B = bytes_read; "
            "k = bf16_tflops S/T: the unfused plan's intermediates (joins, masks) cross HBM "
            "too, uncounted, so its traffic lies between its stored bytes and all of its "
            "time; the bracket is its spread")


#: a run measures the queries it runs only: the others are left out
MODEL = PredictModel(metrics=("q1_time_ms", "q3_time_ms", "q5_time_ms", "q6_time_ms",
                              "q12_time_ms", "q14_time_ms"),
                     predict=_predict, only_measured=True)
