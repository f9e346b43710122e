"""inference on a machine we do not have: the kv-cache, weight-streaming and tensor-parallel
studies (prefill computes, decode reads weights, reloads and streams cross the host link).

A prediction model (``hopperlab.workloads.prediction``), named by this family's
``FamilyInfo.predict``; its formulas: docs/benchmarks/machines.md ("Predictions"). Cheap to
import (no torch): ``hopperlab predict`` runs on the login node.
"""

from __future__ import annotations

from hopperlab.workloads.inference import TP_SHAPES
from hopperlab.workloads.prediction import (PredictionInputs, PredictModel, Unpredictable,
                                           overlap)


def _predict(ctx: PredictionInputs, metric: str) -> tuple[float, str, str]:
    if ctx.knobs.get("memory", "device") != "device":
        raise Unpredictable("managed memory's page migration is not modelled")
    study = ctx.params.get("study", "kv-cache")
    if study == "tensor-parallel":
        return _tensor_parallel(ctx, metric)
    if study == "weight-streaming":
        if ctx.params.get("streamer") == "accelerate":
            raise Unpredictable("accelerate's offload copies synchronously in its own hooks; "
                                "its overlap is not modelled")
        tps = ctx.metric("decode_tokens_per_s")
        t = 1.0 / tps
        k = ctx.compute_scale("hbm")
        fractions = ctx.params.get("resident_fractions") or [1.0]
        if min(fractions) >= 1.0:
            t_new = t * k
            formula = "t' = t * k; t = 1/decode_tokens_per_s; k = hbm_tbps S/T (decode reads weights)"
            model = "compute"
        else:
            floor = ctx.metric("floor_fraction") * t
            r_s = ctx.metric("pinned_h2d_gbps", label="r_S (pinned_h2d_gbps)")
            r_t = ctx.fig(ctx.tgt, "host_link.pinned.h2d", "r_T")
            resident = ctx.sibling(lambda p, kn: p.get("streamer") == ctx.params.get("streamer")
                                   and min(p.get("resident_fractions") or [1.0]) >= 1.0,
                                   "the resident model")
            c = 1.0 / ctx.metric("decode_tokens_per_s", resident, "C (1/resident decode_tokens_per_s)")
            t_new = overlap(t, c, floor, k, r_s / r_t)
            formula = ("t' = max(C*k, L*r_S/r_T) + (t - max(C, L)); t = 1/decode_tokens_per_s; "
                       "L = floor_fraction*t (streamed bytes at r_S); k = hbm_tbps S/T")
            model = "overlap"
        if metric != "decode_tokens_per_s":
            raise Unpredictable(f"{metric} is not modelled for the weight-streaming study")
        return 1.0 / t_new, model, formula
    policy = ctx.params.get("policy", "resident")
    ttft = ctx.metric("ttft_ms_p50", label="ttft (ttft_ms_p50)")
    k = ctx.compute_scale("bf16")
    if policy == "offload":
        reloads = ctx.metric("reloads")
        per = ctx.metric("reload_bytes") / reloads if reloads else 0.0
        gbps = ctx.metric("reload_gbps", label="reload GB/s S") if reloads else 0.0
        reload_ms = per / (gbps * 1e9) * 1e3 if gbps else 0.0
        r_s = ctx.fig(ctx.src, "host_link.pinned.h2d", "r_S")
        r_t = ctx.fig(ctx.tgt, "host_link.pinned.h2d", "r_T")
        ttft_t = (ttft - reload_ms) * k + reload_ms * r_s / r_t
        formula = ("ttft' = (ttft - R) * k + R * r_S/r_T; R = reload_bytes/reloads/reload_gbps; "
                   "k = bf16_tflops S/T")
        model = "kv reload"
    elif policy in ("resident", "recompute"):
        ttft_t = ttft * k
        formula = "ttft' = ttft * k; k = bf16_tflops S/T (prefill)"
        model = "compute"
    else:
        raise Unpredictable(f"policy {policy} is not modelled")
    if metric.startswith("ttft_ms"):
        return (ttft_t if metric == "ttft_ms_p50" else ctx.metric(metric) * ttft_t / ttft), \
            model, formula
    raise Unpredictable(f"{metric} is not modelled for the kv-cache study")


def _tensor_parallel(ctx: PredictionInputs, metric: str) -> tuple[float, str, str]:
    """Serving split over the node's GPUs: decode reads weights (HBM), prefill computes
    (bf16); the all-reduces' measured cost is kept as it is (an assumption: the target's GPUs
    joined by NVLink like the source's; no machine description holds a GPU-GPU link yet)."""
    layers = ctx.metric("tp_layers")
    whole = TP_SHAPES[ctx.params.get("model_shape", "tiny")][-1]
    if not ctx.params.get("num_layers") and layers < whole:
        raise Unpredictable(f"the run held {layers:.0f} of the {whole} layers (what fit the "
                            f"source's GPU); what fits the target's differs")
    ttft = ctx.metric("ttft_ms_p50", label="ttft (ttft_ms_p50)")
    dec = ctx.metric("decode_ms_per_token", label="d (decode_ms_per_token)")
    ar = ctx.row.metrics.get("allreduce_cost_ms_per_token", 0.0)
    ctx.inputs["a (allreduce_cost_ms_per_token)"] = f"{ar:.6g} (measured: {ctx.row.key}; 0 on one GPU)"
    batch = ctx.metric("concurrency", label="b (concurrency)")
    steps = ctx.params.get("decode_tokens", 1) - 1
    ttft_t = ttft * ctx.compute_scale("bf16")
    dec_t = (dec - ar) * ctx.compute_scale("hbm") + ar
    formula = ("ttft' = ttft * k_bf16; d' = (d - a) * k_hbm + a (all-reduces as measured: "
               "NVLink assumed alike); k = peak S/T")
    if metric == "ttft_ms_p50":
        return ttft_t, "compute", formula
    if metric == "decode_tokens_per_s":
        return batch / dec_t * 1e3, "compute", formula + "; tokens/s' = b / d'"
    if metric == "request_latency_ms_p50":
        return ttft_t + steps * dec_t, "compute", formula + "; latency' = ttft' + (new - 1) * d'"
    raise Unpredictable(f"{metric} is not modelled for the tensor-parallel study")


#: a run measures the figures of its own study only: the others are left out
MODEL = PredictModel(metrics=("ttft_ms_p50", "decode_tokens_per_s", "request_latency_ms_p50"),
                     predict=_predict, only_measured=True)
