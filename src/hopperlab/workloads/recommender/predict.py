"""recommender on a machine we do not have: the GPU components are launch-bound (they scale
with the SMs' rate), the host's parts stay as measured, the CPU peer scales with the cores.

A prediction model (``hopperlab.workloads.prediction``), named by this family's
``FamilyInfo.predict``; its formulas: docs/benchmarks/machines.md ("Predictions"). Cheap to
import (no torch): ``hopperlab predict`` runs on the login node.
"""

from __future__ import annotations

from hopperlab.workloads.prediction import (PredictionInputs, PredictModel, Unpredictable,
                                           same_host)


def _predict(ctx: PredictionInputs, metric: str) -> tuple[float, str, str]:
    e2e = ctx.metric("lat_e2e_p50_ms", label="t (lat_e2e_p50_ms)")
    if ctx.params.get("pipeline") == "cpu":
        cores_s = ctx.fig(ctx.src, "cpu_cores", "cores S")
        cores_t = ctx.fig(ctx.tgt, "cpu_cores", "cores T")
        e2e_t = e2e * cores_s / cores_t
        formula, model = "t' = t * cores_S / cores_T (every component on all cores)", "host CPU"
    else:
        if ctx.knobs.get("memory", "device") != "device":
            raise Unpredictable("managed memory's page migration is not modelled")
        # a query's GPU components are a few dozen small kernels each (retrieval over the
        # item table, ranking, top-n: 0.1-0.3 ms, far under what their bytes take at HBM):
        # launch-bound, so they scale with the SMs' rate, not HBM (HBM-scaled: +48 % H200 ->
        # H100); the host's features and transfer stay as measured
        same_host(ctx, "the GPU pipeline's latency")
        k = ctx.compute_scale("bf16")
        gpu = sum(ctx.metric(f"lat_{c}_p50_ms") for c in ("retrieval", "ranking", "topn"))
        kept = sum(ctx.metric(f"lat_{c}_p50_ms") for c in ("features", "transfer"))
        e2e_t = gpu * k + kept + (e2e - gpu - kept)
        formula = ("t' = (retrieval + ranking + topn) * k + features + transfer + rest; "
                   "k = bf16_tflops S/T (launch-bound kernels run on the SMs); p50 components; "
                   "the host's parts as measured")
        model = "launch-bound"
    if metric == "lat_e2e_p50_ms":
        return e2e_t, model, formula
    if metric == "qps":
        return ctx.metric("qps") * e2e / e2e_t, model, formula
    raise Unpredictable(f"{metric} is not modelled")


MODEL = PredictModel(metrics=("lat_e2e_p50_ms",), predict=_predict)
