"""The tensor-parallel study: long-context requests through a decoder split over the run's ranks
(``tensor_parallel.py``), as the source's 70B rows (31,242-token prompt + 100 at concurrency 1;
3,349 + 100 at concurrency 8). Every rank runs every request; rank 0's figures are the run's.

Figures: request latency, time to first token (the prefill), decode tokens/s (all requests of
the batch), each beside its floor on this node (``tp_floor.py``: HBM, matmul and all-reduce
rates measured at the start of the run) as ``decode_over_floor`` and ``prefill_over_floor``;
the all-reduce share of a request from the collective's own time x calls, and apart from it
what the all-reduces cost a decode step beyond that (the step's graph replayed with and
without them: the wait for the slowest peer and lost overlap); each GPU's peak memory while
serving, and what it holds.
"""

from __future__ import annotations

import math
from typing import Any

from hopperlab.core.rundir import SkipRun
from hopperlab.core.stats import GB, percentile
from hopperlab.cuda.collectives import collective_latency
from hopperlab.cuda.device_rates import hbm_gbps, matmul_tflops
from hopperlab.cuda.nvtx import measured_region
from hopperlab.workloads.base import Recording, RunView, no_cuda_reason
from hopperlab.workloads.inference import TP_SHAPES, InferenceParams
from hopperlab.workloads.sameness import SERVED, add_evidence
from hopperlab.workloads.inference import tensor_parallel as tp
from hopperlab.workloads.inference.tp_floor import (
    NodeRates,
    TPShape,
    decode_floor_s,
    layers_that_fit,
    prefill_allreduce_floor_s,
    prefill_floor_s,
)

#: decode steps replayed with and without their all-reduces, for what the collectives cost
_COLLECTIVE_PROBE_STEPS = 20
#: one window's requests: latencies, times to first token, seconds per decode step
Timings = tuple[list[float], list[float], list[float]]


def _rates(torch: Any, device: Any, floor: TPShape, batch: int, tokens: int) -> NodeRates:
    """The node's rates, measured now on every rank (the collectives are run by all)."""
    decode_msg = batch * floor.hidden * floor.dtype_bytes
    prefill_msg = batch * tokens * floor.hidden * floor.dtype_bytes
    multi = floor.world > 1
    return NodeRates(hbm_gbps=hbm_gbps(device), matmul_tflops=matmul_tflops(device),
                     allreduce_decode_s=collective_latency(decode_msg, 50, graph=True) if multi else 0.0,
                     allreduce_prefill_s=collective_latency(prefill_msg, 3) if multi else 0.0)


def _layers(torch: Any, dist: Any, device: Any, floor: TPShape, requested: int, batch: int,
            max_len: int) -> int:
    """``requested`` layers, or (0) as many as every rank's GPU holds."""
    if requested:
        return requested
    free = torch.cuda.mem_get_info(device)[0]
    fit = torch.tensor([layers_that_fit(floor, free, batch, max_len)], device=device)
    if dist.is_initialized():
        dist.all_reduce(fit, op=dist.ReduceOp.MIN)
    return int(fit.item())


def run(spec: RunView, recorder: Recording, params: InferenceParams) -> None:
    import torch
    import torch.distributed as dist

    why = no_cuda_reason(torch, spec.resources.gpus)
    cuda = why is None
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    world = dist.get_world_size() if dist.is_initialized() else 1
    hidden, heads, kv_heads, ffn, vocab, layers = TP_SHAPES[params.model_shape]
    dtype = getattr(torch, params.dtype)
    batch, max_len = params.concurrency, params.prompt_tokens + params.decode_tokens
    floor = TPShape(hidden, heads, kv_heads, ffn, vocab, layers, world,
                    torch.empty(0, dtype=dtype).element_size())
    rates = _rates(torch, device, floor, batch, params.prompt_tokens) if cuda else None
    n_layers = _layers(torch, dist, device, floor, params.num_layers, batch, max_len) if cuda \
        else params.num_layers or layers
    if n_layers < 1:
        raise SkipRun(f"not one layer of {params.model_shape} fits beside the KV cache of "
                      f"{batch} x {max_len} tokens on this GPU")
    floor = TPShape(hidden, heads, kv_heads, ffn, vocab, n_layers, world, floor.dtype_bytes)
    shape = tp.Shape(hidden, heads, kv_heads, ffn, vocab, n_layers)
    recorder.set_tag("inference.study", params.study)
    recorder.set_tag("inference.target", "cuda" if cuda else "host")
    fitted = " (what fits)" if cuda and not params.num_layers and n_layers < layers else ""
    recorder.set_tag("inference.tp_layers", f"{n_layers} of {layers}{fitted}")
    recorder.set_tag("inference.decode_path", "cuda-graph" if cuda else "eager")
    if not cuda:
        recorder.set_tag("inference.no_cuda_reason", why)
        recorder.set_tag("inference.floors", "not measured: no GPU (the floors need HBM and "
                         "matmul rates)")
    compiled = cuda and params.compile_kernels
    recorder.set_tag("inference.kernels", "torch.compile" if compiled else "eager")
    model = tp.build(shape, params.seed, dtype, device, cuda, compile_kernels=compiled)
    server = tp.Server(model, batch, max_len, graphs=cuda)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    if cuda:  # what serving holds, measured from here: no leftovers of building the weights
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    g = torch.Generator().manual_seed(params.seed + 7)

    replies: list[Any] = []  # each request's greedy ids after its first, compared (issue 47)

    def request() -> dict[str, float]:
        prompts = torch.randint(0, vocab, (batch, params.prompt_tokens), generator=g).to(device)
        served = tp.serve(server, prompts, params.decode_tokens, sync)
        replies.append(server.generated(params.decode_tokens - 1).tolist())  # after the timing
        return served

    for _ in range(params.warmup):
        request()
    windows = spec.repeats  # repeat_unit "windows": the model is built (and its floors measured) once
    lat, ttft, dec = [], [], []  # every window's requests: what the floors are set against
    for w in range(windows):
        recorder.repeat = w if windows > 1 else None
        got, work = _timed_requests(request, recorder, params, batch,
                                    first_step=w * params.requests)
        for pooled, mine in zip((lat, ttft, dec), got):
            pooled.extend(mine)
        recorder.log_metrics({**_request_figures(*got, batch), **work})
        if windows > 1:
            recorder.add_sample(dict(recorder.metrics))
    recorder.repeat = None
    collectives: dict[str, float] = {}
    if server.graph_alone is not None and rates is not None:  # after the timed requests
        steps = min(_COLLECTIVE_PROBE_STEPS, params.decode_tokens)
        with_s = server.step_seconds(params.prompt_tokens, steps)
        alone_s = server.step_seconds(params.prompt_tokens, steps, alone=True)
        pure_s = 2 * n_layers * rates.allreduce_decode_s
        collectives = {"decode_alone_ms_per_token": alone_s * 1e3,
                       "allreduce_cost_ms_per_token": (with_s - alone_s) * 1e3,
                       "allreduce_wait_ms_per_token": max(0.0, with_s - alone_s - pure_s) * 1e3}
    figures = {**_request_figures(lat, ttft, dec, batch), "tp_world_size": float(world),
               "tp_layers": float(n_layers), "prompt_tokens": float(params.prompt_tokens),
               "concurrency": float(batch),
               "weights_gb_per_gpu": model.weight_bytes() / GB,
               "kv_cache_gb_per_gpu": server.cache.nbytes() / GB}
    figures.update(collectives)
    if rates is not None:
        figures.update(_floor_figures(floor, rates, params, figures))
    if cuda:
        figures["peak_gpu_mem_gb"] = torch.cuda.max_memory_allocated(device) / GB
    recorder.log_metrics(figures)
    add_evidence(recorder, "tokens", replies)  # every rank, in its own ranks/<r>/
    # the layers served are sized to the GPUs at run time (num_layers 0): another count is
    # another model, whose tokens are not compared (issue 47)
    add_evidence(recorder, SERVED, {"layers": n_layers})


def _timed_requests(request: Any, recorder: Recording, params: InferenceParams, batch: int,
                    first_step: int) -> tuple[Timings, dict[str, float]]:
    """One window: the timed requests inside the measured region (the profiler's capture, the
    energy window); per request its latency, time to first token and seconds per decode step,
    and the work the window holds (``window_work``)."""
    lat, ttft, dec = [], [], []
    served: list[dict[str, float]] = []
    with measured_region():
        for i in range(params.requests):
            t = request()
            served.append(t)
            decode_tps = batch * max(params.decode_tokens - 1, 1) / max(t["decode_s"], 1e-9)
            recorder.log_step(first_step + i, latency_ms=t["latency_s"] * 1e3,
                              ttft_ms=t["ttft_s"] * 1e3, decode_tokens_per_s=decode_tps,
                              step_s=t["latency_s"])
            lat.append(t["latency_s"])
            ttft.append(t["ttft_s"])
            dec.append(t["decode_s"] / max(params.decode_tokens - 1, 1))
    return (lat, ttft, dec), window_work(served)


def _request_figures(lat: list[float], ttft: list[float], dec: list[float],
                     batch: int) -> dict[str, float]:
    return {"request_latency_ms_p50": percentile(lat, 50) * 1e3,
            "ttft_ms_p50": percentile(ttft, 50) * 1e3, "ttft_ms_p99": percentile(ttft, 99) * 1e3,
            "decode_tokens_per_s": batch / percentile(dec, 50),
            "decode_ms_per_token": percentile(dec, 50) * 1e3, "step_s": percentile(lat, 50)}


def window_work(served: list[dict[str, float]]) -> dict[str, float]:
    """The work inside the measured window, counted from the requests it served (``tp.serve``;
    the warm-up ran before it): every token they generated (per sequence the prefill's first
    token and the decode steps after it) and their first tokens. What the window's joules,
    summed over the ranks' GPUs, are divided by (issue 36); repeated windows add up."""
    return {"measured_generated_tokens": float(sum(t["generated_tokens"] for t in served)),
            "measured_first_tokens": float(sum(t["first_tokens"] for t in served))}


def _floor_figures(floor: TPShape, rates: NodeRates, params: InferenceParams,
                   measured: dict[str, float]) -> dict[str, float]:
    batch, prompt, new = params.concurrency, params.prompt_tokens, params.decode_tokens
    context = prompt + new / 2  # the mean position of the timed decode steps
    dec_floor = decode_floor_s(floor, rates, batch, context)
    pre_floor = prefill_floor_s(floor, rates, batch, prompt)
    decode_calls = 2 * floor.layers * max(new - 1, 0)
    allreduce_s = 2 * floor.layers * rates.allreduce_prefill_s + decode_calls * rates.allreduce_decode_s
    latency_s = measured["request_latency_ms_p50"] / 1e3
    return {"hbm_gbps": rates.hbm_gbps, "matmul_tflops": rates.matmul_tflops,
            "allreduce_decode_us": rates.allreduce_decode_s * 1e6,
            "allreduce_prefill_ms": rates.allreduce_prefill_s * 1e3,
            "decode_floor_ms_per_token": dec_floor * 1e3,
            "decode_over_floor": measured["decode_ms_per_token"] / 1e3 / dec_floor,
            "prefill_floor_ms": pre_floor * 1e3,
            "prefill_allreduce_floor_ms": prefill_allreduce_floor_s(floor, rates) * 1e3,
            "prefill_over_floor": measured["ttft_ms_p50"] / 1e3 / pre_floor,
            "allreduce_share": allreduce_s / latency_s if latency_s > 0 else math.nan}
