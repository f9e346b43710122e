"""Predictions of a machine nobody here has, from runs measured on one we have.

Every prediction is labelled a prediction and carries its formula and inputs (each input with
where it comes from: the run's metric, a sibling run, or a machine description's figure and that
figure's source). A variant the models do not cover says why instead of guessing. The models
(copy, overlap, compute, cpu, kv reload, recommender components) and their formulas are in
docs/benchmarks/machines.md ("Predictions"); each function below names the one it computes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from hopperlab.results.machines.descriptions import MachineDescription
from hopperlab.results.machines.energy import PredictedEnergy, predict_energy
from hopperlab.results.machines.runs import MachineRuns
from hopperlab.results.report.collect import RunRow
from hopperlab.workloads.inference import TP_SHAPES

PREDICTION = "prediction"


class _Missing(Exception):
    """An input the model needs is not there (the message says which and where)."""


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

    @property
    def error(self) -> float | None:
        """(predicted - measured) / measured."""
        if self.predicted is None or not self.measured:
            return None
        return (self.predicted - self.measured) / self.measured


class _Ctx:
    """One source run, its siblings, and both machines' descriptions; collects the inputs."""

    def __init__(self, group: MachineRuns, key: str, src: MachineDescription,
                 tgt: MachineDescription) -> None:
        self.group, self.key, self.src, self.tgt = group, key, src, tgt
        self.row: RunRow = group.runs[key]
        spec = group.spec(key)
        self.params: dict[str, Any] = dict(spec.get("params") or {})
        self.knobs: dict[str, Any] = dict(spec.get("knobs") or {})
        self.inputs: dict[str, str] = {}

    def metric(self, name: str, row: RunRow | None = None, label: str | None = None) -> float:
        row = row or self.row
        value = row.metrics.get(name)
        if value is None:
            raise _Missing(f"{row.key} on {self.group.machine} has no metric {name} "
                           f"({row.run_dir}/metrics.json)")
        self.inputs[label or name] = f"{value:.6g} (measured: {row.key} on {self.group.machine})"
        return value

    def fig(self, desc: MachineDescription, path: str, label: str) -> float:
        figure = desc.figure(path)
        if figure.value is None:
            raise _Missing(f"{desc.name} has no figure {path} ({figure.source})")
        self.inputs[label] = f"{figure.value:g} ({desc.name} {path}: {figure.source})"
        return float(figure.value)

    def sibling(self, match: Callable[[dict[str, Any], dict[str, Any]], bool],
                what: str) -> RunRow:
        """The first ok run of the same experiment whose params and knobs ``match``."""
        for key, row in self.group.runs.items():
            if key == self.key or row.family != self.row.family or \
                    row.experiment != self.row.experiment or row.status != "ok":
                continue
            spec = self.group.spec(key)
            if match(dict(spec.get("params") or {}), dict(spec.get("knobs") or {})):
                self.inputs[f"sibling ({what})"] = key
                return row
        raise _Missing(f"no ok run of {self.row.family}/{self.row.experiment} on "
                       f"{self.group.machine} measured {what}")

    def compute_scale(self, kind: str) -> float:
        """k = peak_S / peak_T for ``bf16``, ``fp8`` or ``hbm``."""
        path = {"bf16": "bf16_tflops", "fp8": "fp8_tflops", "hbm": "hbm_tbps"}[kind]
        return self.fig(self.src, path, f"{path} S") / self.fig(self.tgt, path, f"{path} T")


def _overlap(t: float, c: float, link: float, k: float, r_ratio: float) -> float:
    return max(c * k, link * r_ratio) + (t - max(c, link))


# ----------------------------------------------------------------------------- families
def _membench(ctx: _Ctx, metric: str) -> tuple[float, str, str]:
    if ctx.params.get("test", "copy") == "collective":
        raise _Unsupported("the GPU-GPU link (NVLink, network) is in no machine description yet")
    if ctx.params.get("test", "copy") != "copy":
        raise _Unsupported("allocation cost and first touch depend on the driver and the OS, "
                           "which no machine description holds")
    memory = ctx.params.get("host_memory", "pinned")
    direction = ctx.params.get("direction", "h2d")
    path = f"host_link.{memory}.{direction}"
    value = ctx.fig(ctx.tgt, path, f"{path} T")
    return value, "copy", f"{metric}' = d(T, {path})"


#: params that only say how an offload offloads: a run without offload is the sibling of every
#: offload variant whatever they say (moe-sft's 64 MiB threshold against its no-offload step)
_OFFLOAD_KEYS = ("activation_offload", "offload_budget_gib", "offload_staging", "offload_keep_head",
                 "offload_max_inflight_mib", "offload_budget_caps_allocator", "offload_min_bytes",
                 "offload_keep_last_layers")


def _without(params: Mapping[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    return {k: v for k, v in params.items() if k not in keys}


def _finetune(ctx: _Ctx, metric: str) -> tuple[float, str, str]:
    if ctx.knobs.get("memory", "device") != "device":
        raise _Unsupported("managed memory's page migration is not modelled")
    precision = "fp8" if ctx.knobs.get("precision") == "fp8" else "bf16"
    offload = ctx.knobs.get("offload", "none")
    step = ctx.metric("step_time_p50_s", label="t (step_time_p50_s)")
    if offload != "none" and ctx.params.get("activation_offload") == "save_on_cpu" \
            and offload == "activations":
        raise _Unsupported("save_on_cpu does not count its bytes over the host link, so its "
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
        except _Missing:
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


def _through_time(ctx: _Ctx, metric: str, t: float, t_new: float, time_metric: str) -> float:
    """The metric asked for, from the predicted time (a rate scales as t / t')."""
    if t_new <= 0:
        raise _Missing(f"the model gives a time <= 0 ({t_new:.3g} s)")
    if metric == time_metric:
        return t_new
    return ctx.metric(metric) * t / t_new


def _inference(ctx: _Ctx, metric: str) -> tuple[float, str, str]:
    if ctx.knobs.get("memory", "device") != "device":
        raise _Unsupported("managed memory's page migration is not modelled")
    study = ctx.params.get("study", "kv-cache")
    if study == "tensor-parallel":
        return _tensor_parallel(ctx, metric)
    if study == "weight-streaming":
        if ctx.params.get("streamer") == "accelerate":
            raise _Unsupported("accelerate's offload copies synchronously in its own hooks; "
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
            t_new = _overlap(t, c, floor, k, r_s / r_t)
            formula = ("t' = max(C*k, L*r_S/r_T) + (t - max(C, L)); t = 1/decode_tokens_per_s; "
                       "L = floor_fraction*t (streamed bytes at r_S); k = hbm_tbps S/T")
            model = "overlap"
        if metric != "decode_tokens_per_s":
            raise _Unsupported(f"{metric} is not modelled for the weight-streaming study")
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
        raise _Unsupported(f"policy {policy} is not modelled")
    if metric.startswith("ttft_ms"):
        return (ttft_t if metric == "ttft_ms_p50" else ctx.metric(metric) * ttft_t / ttft), \
            model, formula
    raise _Unsupported(f"{metric} is not modelled for the kv-cache study")


def _tensor_parallel(ctx: _Ctx, metric: str) -> tuple[float, str, str]:
    """Serving split over the node's GPUs: decode reads weights (HBM), prefill computes
    (bf16); the all-reduces' measured cost is kept as it is (an assumption: the target's GPUs
    joined by NVLink like the source's; no machine description holds a GPU-GPU link yet)."""
    layers = ctx.metric("tp_layers")
    whole = TP_SHAPES[ctx.params.get("model_shape", "tiny")][-1]
    if not ctx.params.get("num_layers") and layers < whole:
        raise _Unsupported(f"the run held {layers:.0f} of the {whole} layers (what fit the "
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
    raise _Unsupported(f"{metric} is not modelled for the tensor-parallel study")


def _recommender(ctx: _Ctx, metric: str) -> tuple[float, str, str]:
    e2e = ctx.metric("lat_e2e_p50_ms", label="t (lat_e2e_p50_ms)")
    if ctx.params.get("pipeline") == "cpu":
        cores_s = ctx.fig(ctx.src, "cpu_cores", "cores S")
        cores_t = ctx.fig(ctx.tgt, "cpu_cores", "cores T")
        e2e_t = e2e * cores_s / cores_t
        formula, model = "t' = t * cores_S / cores_T (every component on all cores)", "cpu"
    else:
        if ctx.knobs.get("memory", "device") != "device":
            raise _Unsupported("managed memory's page migration is not modelled")
        k = ctx.compute_scale("hbm")
        gpu = sum(ctx.metric(f"lat_{c}_p50_ms") for c in ("retrieval", "ranking", "topn"))
        kept = sum(ctx.metric(f"lat_{c}_p50_ms") for c in ("features", "transfer"))
        e2e_t = gpu * k + kept + (e2e - gpu - kept)
        formula = ("t' = (retrieval + ranking + topn) * k + features + transfer + rest; "
                   "k = hbm_tbps S/T; p50 components")
        model = "components"
    if metric == "lat_e2e_p50_ms":
        return e2e_t, model, formula
    if metric == "qps":
        return ctx.metric("qps") * e2e / e2e_t, model, formula
    raise _Unsupported(f"{metric} is not modelled")


_PLACEMENT_LINK = {"host-pinned": "host_link.pinned.h2d", "pageable": "host_link.pageable.h2d",
                   "zero-copy": "host_link.direct_h2d"}


def _database(ctx: _Ctx, metric: str) -> tuple[float, str, str]:
    if not metric.endswith("_time_ms"):
        raise _Unsupported(f"{metric} is not modelled (the query times are)")
    query = metric[: -len("_time_ms")]
    placement = ctx.params.get("placement", "device")
    t = ctx.metric(metric, label=f"t ({metric})")
    k = ctx.compute_scale("hbm")
    if placement == "device":
        return t * k, "compute", "t' = t * k; k = hbm_tbps S/T (scans read GPU memory)"
    if placement not in _PLACEMENT_LINK:
        raise _Unsupported(f"placement {placement} is not modelled")
    path = _PLACEMENT_LINK[placement]
    bytes_read = ctx.metric(f"{query}_bytes_read")
    r_s = ctx.fig(ctx.src, path, "r_S")
    r_t = ctx.fig(ctx.tgt, path, "r_T")
    encoding = ctx.params.get("encoding", "plain")
    device = ctx.sibling(lambda p, kn: p.get("placement", "device") == "device"
                         and p.get("encoding", "plain") == encoding, "the device placement")
    c = ctx.metric(metric, device, f"C ({metric} of the device placement)")
    floor = bytes_read / (r_s * 1e9) * 1e3
    value = _overlap(t, c, floor, k, r_s / r_t)
    return value, "overlap", (f"t' = max(C*k, L*r_S/r_T) + (t - max(C, L)); L = bytes_read/r_S; "
                              f"r = {path}; k = hbm_tbps S/T")


class _Unsupported(Exception):
    """The models do not cover this variant (the message says why)."""


MODELS: dict[str, Callable[[_Ctx, str], tuple[float, str, str]]] = {
    "membench": _membench, "finetune": _finetune, "inference": _inference,
    "recommender": _recommender, "database": _database,
}
#: the figures predicted per family (its headline throughput or time)
PREDICTED_METRICS: dict[str, tuple[str, ...]] = {
    "membench": ("gbps_at_largest",),
    "finetune": ("tokens_per_s",),
    "inference": ("ttft_ms_p50", "decode_tokens_per_s", "request_latency_ms_p50"),
    "recommender": ("lat_e2e_p50_ms",),
    "database": ("q1_time_ms", "q3_time_ms", "q5_time_ms", "q6_time_ms", "q12_time_ms",
                 "q14_time_ms"),
}


def predict_run(group: MachineRuns, key: str, src: MachineDescription,
                tgt: MachineDescription) -> list[Prediction]:
    """Predictions of one run's figures on ``tgt`` (an unpredictable one says why)."""
    row = group.runs[key]
    out = []
    for metric in PREDICTED_METRICS.get(row.family, ()):
        if metric not in row.metrics and row.status == "ok" and row.family in ("database",
                                                                               "inference"):
            continue  # the run does not measure this query / study's figure
        pred = Prediction(key, row.family, row.experiment, row.variant, metric, group.machine,
                          tgt.name, row.metrics.get(metric))
        ctx = _Ctx(group, key, src, tgt)
        try:
            if row.status != "ok":
                raise _Unsupported(f"the run ended {row.status}")
            model = MODELS.get(row.family)
            if model is None:
                raise _Unsupported(f"no model for the {row.family} family")
            value, pred.model, pred.formula = model(ctx, metric)
            if not math.isfinite(value):
                raise _Missing("the model gives no finite value")
            pred.predicted = value
        except (_Unsupported, _Missing) as exc:
            pred.unpredictable = str(exc)
        pred.inputs = ctx.inputs
        if pred.predicted is not None:
            pred.energy = predict_energy(row.family, metric, pred.predicted, tgt, ctx.params)
        out.append(pred)
    if not PREDICTED_METRICS.get(row.family):
        out.append(Prediction(key, row.family, row.experiment, row.variant, "-", group.machine,
                              tgt.name, None, unpredictable=f"no model for the {row.family} "
                                                            f"family"))
    return out


def predict(group: MachineRuns, src: MachineDescription, tgt: MachineDescription,
            measured: MachineRuns | None = None) -> list[Prediction]:
    """Every run of ``group`` predicted on ``tgt``; with ``measured`` (the target's own runs),
    each prediction carries the target's measurement for the error."""
    out = []
    for key in sorted(group.runs):
        for pred in predict_run(group, key, src, tgt):
            if measured is not None and key in measured.runs:
                other = measured.runs[key]
                pred.measured = other.metrics.get(pred.metric) if other.status == "ok" else None
                if pred.energy is not None and pred.energy.joules is not None:
                    pred.energy = predict_energy(pred.family, pred.metric, pred.predicted, tgt,
                                                 group.params(key), other)
            out.append(pred)
    return out
