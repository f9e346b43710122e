"""inference on a machine we do not have: the kv-cache, weight-streaming and tensor-parallel
studies (prefill computes, reloads and streams cross the host link; batch-1 decode and the
resident first token are launch-bound: their weight and KV reads at HBM, the rest kept), and
tensor-parallel rows on N GPUs from their one-GPU run (``across_gpus``).

A prediction model (``hopperlab.workloads.prediction``), named by this family's
``FamilyInfo.predict``; its formulas: docs/benchmarks/machines.md ("Predictions"). Cheap to
import (no torch): ``hopperlab predict`` runs on the login node.
"""

from __future__ import annotations

from typing import Callable

from hopperlab.workloads.inference import TP_SHAPES
from hopperlab.workloads.prediction import (Collective, MissingInput, PredictionInputs,
                                           PredictModel, Unpredictable, overlap, same_host,
                                           same_host_kind)


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
            t_new, model, formula = _resident_decode(ctx, t)
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
    if not metric.startswith("ttft_ms"):
        raise Unpredictable(f"{metric} is not modelled for the kv-cache study")
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
    elif policy == "resident":
        ttft_t, model, formula = _resident_ttft(ctx, ttft, k)
    elif policy == "recompute":
        ttft_t = ttft * k
        formula = "ttft' = ttft * k; k = bf16_tflops S/T (prefill)"
        model = "compute"
    else:
        raise Unpredictable(f"policy {policy} is not modelled")
    return (ttft_t if metric == "ttft_ms_p50" else ctx.metric(metric) * ttft_t / ttft), \
        model, formula


def _launch_rest(ctx: PredictionInputs, t: float, device: float, what: str,
                 host: Callable[[PredictionInputs, str], None] = same_host_kind) -> float:
    """What the device terms do not explain (kernel launches and the host's dispatch), as
    measured, where ``host`` lets it be carried (``same_host_kind``, or ``same_host`` for a
    figure bound by the host's dispatch); MissingInput when the device terms alone exceed the
    time."""
    host(ctx, what)
    rest = t - device
    if rest < 0:
        raise MissingInput(f"the device terms ({device:.4g}) exceed the measured time "
                           f"({t:.4g}): the bytes counted are not what crossed HBM")
    ctx.inputs["launch term S (t - device terms)"] = f"{rest:.6g} (derived from the above)"
    return rest


def _resident_decode(ctx: PredictionInputs, t: float) -> tuple[float, str, str]:
    """A decode step at batch 1 reads every weight once (W/hbm, 2.8 ms of 51 ms for 7B on an
    H200); the rest is launches and the host's dispatch, kept as measured (scaled by the SMs'
    rate): scaling the whole step by HBM erred -23.5 % H200 -> H100."""
    w = ctx.metric("model_bytes", label="W (model_bytes)")
    hbm_s = ctx.fig(ctx.src, "hbm_tbps", "hbm_tbps S")
    hbm_t = ctx.fig(ctx.tgt, "hbm_tbps", "hbm_tbps T")
    rest = _launch_rest(ctx, t, w / (hbm_s * 1e12), "decode at batch 1")
    t_new = w / (hbm_t * 1e12) + rest * ctx.compute_scale("bf16")
    return t_new, "launch-bound", ("t' = W/hbm_T + (t - W/hbm_S) * k; t = 1/decode_tokens_per_s; "
                                   "W = model_bytes (each weight read once a token); "
                                   "k = bf16_tflops S/T (launches run on the SMs)")


def _resident_ttft(ctx: PredictionInputs, ttft: float, k: float) -> tuple[float, str, str]:
    """A later round's first token with the KV cache resident: attention reads the cached
    context (kv_bytes_per_token x context_tokens at HBM), the turn's prefill computes, and the
    rest is launches and dispatch (kept, scaled by the SMs' rate with the compute)."""
    kv = ctx.metric("kv_bytes_per_token", label="kv (kv_bytes_per_token)")
    context = float(ctx.params.get("context_tokens", 0))
    ctx.inputs["n (context_tokens)"] = f"{context:g} (the run's params)"
    hbm_s = ctx.fig(ctx.src, "hbm_tbps", "hbm_tbps S")
    hbm_t = ctx.fig(ctx.tgt, "hbm_tbps", "hbm_tbps T")
    attn = kv * context / 1e9  # ms per TB/s: GB / (TB/s) = ms
    # most of this first token is the host's dispatch of the turn's prefill (its attention
    # read is a few percent of it): kept only on the source's own machine kind
    rest = _launch_rest(ctx, ttft, attn / hbm_s, "the first token with the KV cache resident",
                        host=same_host)
    return (attn / hbm_t + rest * k, "launch-bound",
            "ttft' = A/hbm_T + (ttft - A/hbm_S) * k; A = kv_bytes_per_token * context_tokens "
            "(attention reads the resident context); k = bf16_tflops S/T (prefill and launches)")


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


def _collective(collectives: tuple[Collective, ...], op: str, graph: bool) -> Collective:
    for c in collectives:
        if c.op == op and c.graph == graph:
            return c
    kind = f"{'graph-replayed ' if graph else ''}{op}"
    raise Unpredictable(f"needs the {kind} measured on this machine (membench/collective/"
                        f"{op.replace('_', '-')}{'-graph' if graph else ''}), which the "
                        "source's folders do not hold")


def _at_size(ctx: PredictionInputs, c: Collective, name: str, nbytes: float) -> float:
    """The collective run's ``name`` (time_us or busbw_gbps) at the smallest measured message
    of at least ``nbytes`` (its largest when none is)."""
    sizes = sorted(int(k[len(name) + 1:-1]) for k in c.row.metrics
                   if k.startswith(name + "_") and k.endswith("b") and k[len(name) + 1:-1].isdigit())
    if not sizes:
        raise MissingInput(f"{c.row.key} has no {name}_<bytes>b figures")
    size = next((b for b in sizes if b >= nbytes), sizes[-1])
    return ctx.metric(f"{name}_{size}b", c.row,
                      f"{name} at {size} B ({c.op}{', graph' if c.graph else ''}, {c.world} GPUs)")


def allreduce_s(ctx: PredictionInputs, c: Collective, nbytes: float, n: int) -> float:
    """One all-reduce of ``nbytes`` over ``n`` GPUs: ``nbytes * 2(n-1)/n / busbw`` (nccl-tests'
    bus bandwidth, which is meant to hold across GPU counts), no less than the latency the
    run measured at that size."""
    busbw = _at_size(ctx, c, "busbw_gbps", nbytes)
    latency = _at_size(ctx, c, "time_us", nbytes) * 1e-6 if nbytes < 1 << 20 else 0.0
    return max(nbytes * 2 * (n - 1) / n / (busbw * 1e9), latency)


def _tp_across_gpus(ctx: PredictionInputs, metric: str, n: int,
                    collectives: tuple[Collective, ...]) -> tuple[float, str, str]:
    """A tensor-parallel row on ``n`` GPUs from its one-GPU run: the run's layers scaled to
    the whole model, prefill's compute and decode's weight reads split ``n`` ways, decode's
    launch term (what its HBM floor leaves) kept, and 2 all-reduces per layer (prefill: the
    batch's hidden states at the measured bus bandwidth; decode: the graph-replayed one's
    latency at one token's message)."""
    if ctx.params.get("study") != "tensor-parallel":
        raise Unpredictable("only the tensor-parallel study is modelled across GPU counts")
    hidden, *_, whole = TP_SHAPES[ctx.params.get("model_shape", "tiny")]
    layers = ctx.metric("tp_layers", label="L_1 (tp_layers of the one-GPU run)")
    s = whole / layers
    ctx.inputs["L (the model's layers)"] = f"{whole} (TP_SHAPES)"
    batch = ctx.metric("concurrency", label="b (concurrency)")
    prompt = ctx.metric("prompt_tokens", label="p (prompt_tokens)")
    elt = 2  # bf16 activations
    calls = 2 * whole
    ar_pre = allreduce_s(ctx, _collective(collectives, "all_reduce", False),
                         batch * prompt * hidden * elt, n) * 1e3
    ttft = ctx.metric("ttft_ms_p50", label="ttft_1 (ttft_ms_p50)") * s / n + calls * ar_pre
    formula = (f"ttft' = ttft_1 * L/L_1 / n + 2L * AR(b*p*hidden*2 B, n); AR = bytes*2(n-1)/n/"
               f"busbw (membench all-reduce, eager); n = {n}")
    if metric == "ttft_ms_p50":
        return ttft, "collective", formula
    if metric not in ("decode_tokens_per_s", "request_latency_ms_p50"):
        raise Unpredictable(f"{metric} is not modelled across GPU counts")
    graph = _collective(collectives, "all_reduce", True)
    d1 = ctx.metric("decode_ms_per_token", label="d_1 (decode_ms_per_token)")
    floor = ctx.metric("decode_floor_ms_per_token", label="F_1 (decode_floor_ms_per_token)")
    ar_dec = allreduce_s(ctx, graph, batch * hidden * elt, n) * 1e3
    dec = floor * s / n + (d1 - floor) * s + calls * ar_dec
    formula += ("; d' = F_1 * L/L_1 / n + (d_1 - F_1) * L/L_1 + 2L * AR_graph(b*hidden*2 B) "
                "(HBM floor split n ways, launch term kept)")
    if metric == "decode_tokens_per_s":
        return batch / dec * 1e3, "collective", formula + "; tokens/s' = b / d'"
    steps = ctx.params.get("decode_tokens", 1) - 1
    return ttft + steps * dec, "collective", formula + "; latency' = ttft' + (new - 1) * d'"


#: a run measures the figures of its own study only: the others are left out
MODEL = PredictModel(metrics=("ttft_ms_p50", "decode_tokens_per_s", "request_latency_ms_p50"),
                     predict=_predict, only_measured=True, across_gpus=_tp_across_gpus)
