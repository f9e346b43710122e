"""finetune on a machine we do not have: the step's compute scales with the GPU's peak, its
offload traffic with the host link (the overlap model).

A prediction model (``hopperlab.workloads.prediction``), named by this family's
``FamilyInfo.predict``; its formulas: docs/benchmarks/machines.md ("Predictions"). Cheap to
import (no torch): ``hopperlab predict`` runs on the login node.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, Mapping

from hopperlab.workloads.finetune import FinetuneParams
from hopperlab.workloads.prediction import (MissingInput, PredictionInputs, PredictModel,
                                           Unpredictable)


#: params that only say how an offload offloads (every param naming an offload): a run without
#: offload is the sibling of every offload variant whatever they say (moe-sft's 64 MiB threshold
#: against its no-offload step)
_OFFLOAD_KEYS = tuple(f.name for f in fields(FinetuneParams) if "offload" in f.name)


def _without(params: Mapping[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    return {k: v for k, v in params.items() if k not in keys}


def _predict(ctx: PredictionInputs, metric: str) -> tuple[float, str, str]:
    if ctx.knobs.get("memory", "device") != "device":
        raise Unpredictable("managed memory's page migration is not modelled")
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


def _through_time(ctx: PredictionInputs, metric: str, t: float, t_new: float,
                  time_metric: str) -> float:
    """The metric asked for, from the predicted time (a rate scales as t / t')."""
    if t_new <= 0:
        raise MissingInput(f"the model gives a time <= 0 ({t_new:.3g} s)")
    if metric == time_metric:
        return t_new
    return ctx.metric(metric) * t / t_new


MODEL = PredictModel(metrics=("tokens_per_s",), predict=_predict)
