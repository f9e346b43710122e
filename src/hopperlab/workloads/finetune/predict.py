"""finetune on a machine we do not have: the step's compute scales with the GPU's peak, its
offload traffic with the host link (the overlap model); an FSDP2 step on N GPUs from its
one-GPU run and the measured all-gather (``across_gpus``).

A prediction model (``hopperlab.workloads.prediction``), named by this family's
``FamilyInfo.predict``; its formulas: docs/benchmarks/machines.md ("Predictions"). Cheap to
import (no torch): ``hopperlab predict`` runs on the login node.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, Mapping

from hopperlab.workloads.finetune import FinetuneParams
from hopperlab.workloads.prediction import (Collective, MissingInput, PredictionInputs,
                                           PredictModel, Unpredictable)


#: params that only say how an offload offloads (every param naming an offload): a run without
#: offload is the sibling of every offload variant whatever they say (moe-sft's 64 MiB threshold
#: against its no-offload step)
_OFFLOAD_KEYS = tuple(f.name for f in fields(FinetuneParams) if "offload" in f.name)


def _without(params: Mapping[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    return {k: v for k, v in params.items() if k not in keys}


def _predict(ctx: PredictionInputs, metric: str) -> tuple[float, str, str]:
    if ctx.knobs.get("memory", "device") != "device":
        raise Unpredictable("managed memory's page migration is not modelled")
    if ctx.params.get("backend") == "sharded":
        return _sharded(ctx, metric)
    precision = "fp8" if ctx.knobs.get("precision") == "fp8" else "bf16"
    offload = ctx.knobs.get("offload", "none")
    step = ctx.metric("step_time_p50_s", label="t (step_time_p50_s)")
    if offload != "none" and ctx.params.get("activation_offload") == "save_on_cpu" \
            and offload == "activations":
        raise Unpredictable("save_on_cpu does not count its bytes over the host link, so its "
                            "link time cannot be rescaled")
    if offload != "none" and ctx.params.get("offload_staging") != "device":
        to_host = ctx.metric("bytes_to_host_per_step")
        from_host = ctx.metric("bytes_from_host_per_step")
        r_d2h = ctx.metric("link_d2h_gbps", label="r_S d2h (link_d2h_gbps)")
        r_h2d = ctx.metric("link_h2d_gbps", label="r_S h2d (link_h2d_gbps)")
        two_phase = "link_two_phase_s" in ctx.row.metrics
        mine = _without(ctx.params, _OFFLOAD_KEYS)
        try:
            base = ctx.sibling(lambda p, k: p.get("offload_staging") == "device"
                               and _without(p, _OFFLOAD_KEYS) == mine,
                               "the step with offload_staging: device")
        except MissingInput:
            base = ctx.sibling(lambda p, k: k.get("offload", "none") == "none"
                               and k.get("precision", "bf16") == ctx.knobs.get("precision", "bf16")
                               and _without(p, _OFFLOAD_KEYS) == mine,
                               "the step without offload")
        c = ctx.metric("step_time_p50_s", base, "C (sibling step_time_p50_s)")
        k = ctx.compute_scale(precision)
        t_d2h = ctx.fig(ctx.tgt, "host_link.pinned.d2h", "r_T d2h")
        t_h2d = ctx.fig(ctx.tgt, "host_link.pinned.h2d", "r_T h2d")
        out_s, in_s = to_host / (r_d2h * 1e9), from_host / (r_h2d * 1e9)
        out_t, in_t = to_host / (t_d2h * 1e9), from_host / (t_h2d * 1e9)
        link_s = out_s + in_s if two_phase else max(out_s, in_s)
        link_t = out_t + in_t if two_phase else max(out_t, in_t)
        step_t = max(c * k, link_t) + (step - max(c, link_s))
        combine = "+" if two_phase else "max"
        formula = (f"t' = max(C*k, L_T) + (t - max(C, L_S)); L = {combine}(bytes_to_host/d2h, "
                   f"bytes_from_host/h2d) at r_S (the run's) and r_T; k = {precision}_tflops S/T")
        model = "overlap"
    else:
        wait = ctx.metric("data_wait_fraction") * step
        k = ctx.compute_scale(precision)
        step_t = (step - wait) * k + wait
        formula = f"t' = (t - w) * k + w; w = data_wait_fraction * t; k = {precision}_tflops S/T"
        model = "compute"
    return _through_time(ctx, metric, step, step_t, "step_time_p50_s"), model, formula


def _sharded(ctx: PredictionInputs, metric: str) -> tuple[float, str, str]:
    """A sharded step (FSDP2 or torchao, offloaded or not) from its floor's parts: GPU compute
    scales with the GPU's peak, the offload bytes cross the target's host link, the optimizer
    step scales with the memory it streams (the host's on the CPU, HBM on the GPU), and what
    the floor does not hold (collectives between GPUs, Python) stays as measured."""
    t = ctx.metric("step_time_p50_s", label="t (step_time_p50_s)")
    floor = ctx.metric("step_floor_s", label="F (step_floor_s)")
    c = ctx.metric("floor_compute_s", label="C (floor_compute_s)")
    o = ctx.metric("floor_optimizer_s", label="O (floor_optimizer_s)")
    k = ctx.compute_scale("bf16")
    link = 0.0
    if "h2d_gb_per_step" in ctx.row.metrics:  # offloaded: parameters and gradients cross the link
        t_h2d = ctx.fig(ctx.tgt, "host_link.pinned.h2d", "r_T h2d")
        t_d2h = ctx.fig(ctx.tgt, "host_link.pinned.d2h", "r_T d2h")
        link = max(ctx.metric("h2d_gb_per_step") / t_h2d, ctx.metric("d2h_gb_per_step") / t_d2h)
        r_s = ctx.metric("host_triad_gbps", label="m_S (host_triad_gbps: the job's CPUs)")
        r_t = ctx.fig(ctx.tgt, "host_memory_gbps", "m_T (host_memory_gbps)")
        o_t = o * r_s / r_t
        where = "O' = O * m_S/m_T (AdamW on the CPU streams host memory)"
    else:
        o_t = o * ctx.compute_scale("hbm")
        where = "O' = O * hbm_tbps S/T (AdamW on the GPU streams HBM)"
    overlapped = bool(ctx.row.metrics.get("floor_overlapped"))  # the CPU step hides by design
    parts = max(c * k, link, o_t) if overlapped else max(c * k, link) + o_t
    step_t = parts + max(0.0, t - floor)
    head = "max(C*k, L_T, O')" if overlapped else "max(C*k, L_T) + O'"
    formula = (f"t' = {head} + (t - F); L_T = max(h2d_gb/r_T h2d, d2h_gb/r_T d2h) "
               f"(0 without offload); {where}; k = bf16_tflops S/T; t - F as measured "
               "(collectives, Python)")
    return _through_time(ctx, metric, t, step_t, "step_time_p50_s"), "sharded floor", formula


def _through_time(ctx: PredictionInputs, metric: str, t: float, t_new: float,
                  time_metric: str) -> float:
    """The metric asked for, from the predicted time (a rate scales as t / t')."""
    if t_new <= 0:
        raise MissingInput(f"the model gives a time <= 0 ({t_new:.3g} s)")
    if metric == time_metric:
        return t_new
    return ctx.metric(metric) * t / t_new


def _sharded_across_gpus(ctx: PredictionInputs, metric: str, n: int,
                         collectives: tuple[Collective, ...]) -> tuple[float, str, str]:
    """An FSDP2 step on ``n`` GPUs from its one-GPU run (the same global batch): the GPU's
    compute (the diagnosed step's compute kernels) splits ``n`` ways; the parameter
    all-gathers (forward, and backward again when resharded) and the gradients'
    reduce-scatter run beside it at the measured all-gather bus bandwidth; the offload link
    (each GPU its own) and the CPU optimizer (the same host bytes over the same host memory)
    as measured, overlapped as the run was; what is not GPU compute stays as measured."""
    if ctx.params.get("backend") != "sharded" or \
            not str(ctx.params.get("sharding", "")).startswith("fsdp2"):
        raise Unpredictable("only FSDP2 is modelled across GPU counts")
    gather = next((c for c in collectives if c.op == "all_gather" and not c.graph), None)
    if gather is None:
        raise Unpredictable("needs the all-gather measured on this machine "
                            "(membench/collective/all-gather), which the source's folders "
                            "do not hold")
    t = ctx.metric("step_time_p50_s", label="t_1 (step_time_p50_s)")
    c = ctx.metric("diag_compute_s", label="C_1 (diag_compute_s: the step's compute kernels)")
    params_b = ctx.metric("params_b", label="P (params_b)")
    link = ctx.metric("link_floor_s", label="L_1 (link_floor_s)")
    o = ctx.metric("floor_optimizer_s", label="O_1 (floor_optimizer_s)")
    overlapped = bool(ctx.row.metrics.get("floor_overlapped"))
    shard = params_b * 1e9 * 2  # bf16 parameters and gradients
    gathers = 2 if ctx.params.get("reshard_after_forward", True) else 1
    busbw = ctx.metric("busbw_gbps_at_largest", gather.row,
                       f"all-gather busbw ({gather.world} GPUs, largest message)")
    coll = (gathers + 1) * shard * (n - 1) / n / (busbw * 1e9)
    ctx.inputs["X (all-gathers + reduce-scatter at busbw)"] = f"{coll:.4g} s (derived)"
    head = max(c / n, coll, link, o) if overlapped else max(c / n, coll, link) + o
    step = head + (t - c)
    formula = (f"t' = {'max(C_1/n, X, L_1, O_1)' if overlapped else 'max(C_1/n, X, L_1) + O_1'}"
               f" + (t_1 - C_1); X = ({gathers} all-gathers + 1 reduce-scatter) * P*2 B * "
               f"(n-1)/n / busbw (membench all-gather); n = {n}")
    return _through_time(ctx, metric, t, step, "step_time_p50_s"), "collective", formula


MODEL = PredictModel(metrics=("tokens_per_s",), predict=_predict, across_gpus=_sharded_across_gpus)
