"""The tensor-parallel study: long-context requests through a decoder split over the run's ranks
(``tensor_parallel.py``), as the source's 70B rows (31,242-token prompt + 100 at concurrency 1;
3,349 + 100 at concurrency 8). Every rank runs every request; rank 0's figures are the run's.

Figures: request latency, time to first token (the prefill), decode tokens/s (all requests of
the batch), the share of the request spent in all-reduces (timed), and each GPU's peak memory
(the run's record adds max and min over ranks).
"""

from __future__ import annotations

from typing import Any

from hopperlab.core.stats import percentile
from hopperlab.workloads.base import no_cuda_reason
from hopperlab.workloads.inference import TP_SHAPES, InferenceParams
from hopperlab.workloads.inference import tensor_parallel as tp


def run(spec: Any, recorder: Any, params: InferenceParams) -> None:
    import torch
    import torch.distributed as dist

    gpus = getattr(getattr(spec, "resources", None), "gpus", None)
    why = no_cuda_reason(torch, 1 if gpus is None else gpus)
    cuda = why is None
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    world = dist.get_world_size() if dist.is_initialized() else 1
    hidden, heads, kv_heads, ffn, vocab, layers = TP_SHAPES[params.model_shape]
    shape = tp.Shape(hidden, heads, kv_heads, ffn, vocab, params.num_layers or layers)
    recorder.set_tag("inference.study", params.study)
    recorder.set_tag("inference.target", "cuda" if cuda else "host")
    recorder.set_tag("inference.tp_layers", f"{shape.layers} of {layers}")
    if not cuda:
        recorder.set_tag("inference.no_cuda_reason", why)
    dtype = getattr(torch, params.dtype)
    model = tp.build(shape, params.seed, dtype, device, cuda)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    g = torch.Generator().manual_seed(params.seed + 7)
    lat, ttft, dec, share = [], [], [], []
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    for i in range(params.warmup + params.requests):
        prompts = torch.randint(0, vocab, (params.concurrency, params.prompt_tokens),
                                generator=g).to(device)
        t = tp.serve(model, prompts, params.decode_tokens, sync)
        if i < params.warmup:
            continue
        decode_tps = params.concurrency * max(params.decode_tokens - 1, 1) / max(t["decode_s"], 1e-9)
        recorder.log_step(i - params.warmup, latency_ms=t["latency_s"] * 1e3,
                          ttft_ms=t["ttft_s"] * 1e3, decode_tokens_per_s=decode_tps,
                          allreduce_s=t["allreduce_s"], step_s=t["latency_s"])
        lat.append(t["latency_s"] * 1e3)
        ttft.append(t["ttft_s"] * 1e3)
        dec.append(decode_tps)
        share.append(t["allreduce_s"] / t["latency_s"])
    figures = {"request_latency_ms_p50": percentile(lat, 50), "ttft_ms_p50": percentile(ttft, 50),
               "ttft_ms_p99": percentile(ttft, 99), "decode_tokens_per_s": percentile(dec, 50),
               "allreduce_share": percentile(share, 50), "step_s": percentile(lat, 50) / 1e3,
               "tp_world_size": float(world), "tp_layers": float(shape.layers),
               "prompt_tokens": float(params.prompt_tokens),
               "concurrency": float(params.concurrency)}
    if cuda:
        figures["peak_gpu_mem_gb"] = torch.cuda.max_memory_allocated(device) / 1e9
    recorder.log_metrics(figures)
