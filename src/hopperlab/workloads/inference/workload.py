"""inference's entry: ``run(spec, recorder)`` for both studies.

What runs where: on a node with a CUDA device (and a spec asking for a GPU) everything runs on
the GPU and is timed there (tag ``inference.target=cuda``). Without one the same code runs on the
CPU (``inference.target=host``): the policies, the layer-by-layer reload, the double buffer and
accelerate's hooks all run and their results are checked, but copies are synchronous host copies,
so no figure of such a run says anything about a link (``inference.no_cuda_reason`` says why).

Knobs: ``memory: managed`` (kv-cache study, ``policy: offload`` only) keeps evicted caches in
managed memory with prefetch on resume, under the free-memory rule of ARCHITECTURE.md;
``profiler: nsys`` relies on the NVTX ranges (``pipeline.prefill``, ``pipeline.decode``,
``offload.copy``, ``offload.prefetch``) and the ``measured_region`` capture window; ``profiler:
torch`` saves ``artifacts/profile/torch_trace.json`` of the measured part.
"""

from __future__ import annotations

import json
import math
import time
from contextlib import contextmanager
from typing import Any, Iterator

from hopperlab.core.stats import GB, GIB, MIB, gbps, percentile
from hopperlab.cuda.nvtx import measured_region
from hopperlab.workloads.base import Recording, RunView, spec_params
from hopperlab.workloads.inference import InferenceParams, tp_serving
from hopperlab.workloads.inference.accelerate_peer import dispatch_offloaded
from hopperlab.workloads.inference.dialogue import Dialogue, make_conversations
from hopperlab.workloads.sameness import add_evidence
from hopperlab.workloads.inference.generation import decode, logits_digest, prefill, prefill_logits
from hopperlab.memory.host_arena import HostArena
from hopperlab.workloads.inference.kv_cache import new_cache
from hopperlab.workloads.inference.kv_policies import KvCachePolicy
from hopperlab.workloads.inference.layered_reload import PinnedHostStore
from hopperlab.workloads.inference.managed_kv import ManagedStore
from hopperlab.workloads.inference.model import kv_bytes_per_token, load_run_model, vocab_size
from hopperlab.workloads.inference.runtime import Runtime, measure_pinned_h2d_gbps, probe
from hopperlab.workloads.inference.weight_streaming import (LayerStreamer, decoder_layers,
                                                            module_bytes, resident_layer_count)


def run(spec: RunView, recorder: Recording) -> None:
    import torch  # noqa: PLC0415

    params = spec_params(spec, InferenceParams)
    memory = spec.knobs.memory
    profiler = spec.knobs.profiler
    if params.study == "tensor-parallel":
        tp_serving.run(spec, recorder, params)
        return
    gpus = spec.resources.gpus
    rt = probe(torch, want_gpu=gpus is None or gpus >= 1)
    recorder.set_tag("inference.study", params.study)
    recorder.set_tag("inference.target", "cuda" if rt.is_cuda else "host")
    recorder.set_tag("inference.memory", memory)
    recorder.set_tag("inference.profiler", profiler)
    if rt.is_cuda:
        recorder.set_tag("inference.gpu", torch.cuda.get_device_name(rt.device))
    else:
        recorder.set_tag("inference.no_cuda_reason", rt.no_cuda_reason)
    threads = torch.get_num_threads()
    if not rt.is_cuda:  # as many compute threads as the run was given cores: on a shared node
        # more threads than cores wait on each other at every op (membench saw 100x slowdowns)
        cpus = spec.resources.cpus or 1
        torch.set_num_threads(max(1, int(cpus)))
    try:
        _run(spec, recorder, params, rt, memory, profiler)
    finally:
        torch.set_num_threads(threads)


def _run(spec: RunView, recorder: Recording, params: InferenceParams, rt: Runtime, memory: str,
         profiler: str) -> None:
    import torch  # noqa: PLC0415

    torch.manual_seed(params.seed)
    t0 = time.perf_counter()
    model, tags = load_run_model(spec.asset_path("model"), rt.device, params.dtype, params.seed)
    for k, v in tags.items():
        recorder.set_tag(k, v)
    recorder.log_metric("model_load_s", time.perf_counter() - t0)
    allow_over = spec.site.allow_oversubscription
    windows = spec.repeats  # repeat_unit "windows": the model loads once
    with torch.inference_mode():
        for w in range(windows):
            recorder.repeat = w if windows > 1 else None
            if params.study == "kv-cache":
                run_kv_cache(model, rt, params, recorder, memory=memory, profiler=profiler,
                             allow_oversubscription=allow_over)
            else:
                run_weight_streaming(model, rt, params, recorder, profiler=profiler)
            if windows > 1:
                recorder.add_sample({k: v for k, v in recorder.metrics.items()
                                     if k != "model_load_s"})
        recorder.repeat = None


@contextmanager
def profiling(rt: Runtime, profiler: str, recorder: Recording) -> Iterator[None]:
    """The measured part: inside the nsys capture window, and under torch.profiler if asked."""
    with measured_region():
        if profiler != "torch":
            yield
            return
        from torch.profiler import ProfilerActivity, profile  # noqa: PLC0415

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if rt.is_cuda else [])
        with profile(activities=activities) as prof:
            yield
        prof.export_chrome_trace(str(recorder.artifact_path("profile/torch_trace.json")))


def _finite(recorder: Recording, name: str, value: float) -> None:
    if value is not None and math.isfinite(value):
        recorder.log_metric(name, value)


# --------------------------------------------------------------------------- kv-cache
def _chunk_bytes(session_bytes: int) -> int:
    """Host chunks of about a quarter of a session's largest cache, 1 MiB to 1 GiB."""
    target = max(MIB, min(GIB, session_bytes // 4))
    return 1 << (target - 1).bit_length()


def run_kv_cache(model: Any, rt: Runtime, p: InferenceParams, recorder: Recording, *, memory: str,
                 profiler: str, allow_oversubscription: bool) -> None:
    torch = rt.torch
    elt = torch.empty((), dtype=getattr(torch, p.dtype)).element_size()
    per_token = kv_bytes_per_token(model.config, elt)
    max_tokens = p.context_tokens + p.rounds * (p.turn_tokens + p.reply_tokens)
    session_bytes = per_token * max_tokens
    store = None
    if p.policy == "offload":
        if memory == "managed":
            store = ManagedStore(rt, allow_oversubscription)
            store.check_budget(p.sessions * session_bytes)
            recorder.set_tag("inference.kv_store", "managed" + (
                " (emulated: no CUDA, prefetches do nothing)" if store.emulated else ""))
        else:
            arena = HostArena(pinned=rt.is_cuda, chunk_bytes=_chunk_bytes(session_bytes))
            store = PinnedHostStore(rt, arena)
            recorder.set_tag("inference.kv_store", "pinned" if rt.is_cuda else "host (no CUDA)")
    recorder.set_tag("inference.policy", p.policy)
    recorder.set_tag("inference.layered_reload", str(p.layered_reload).lower())
    recorder.log_metric("kv_bytes_per_token", per_token)
    policy = KvCachePolicy(p.policy, capacity=p.gpu_sessions, store=store,
                           layered=p.layered_reload)
    vocab = vocab_size(model)

    if p.warmup:  # two throwaway sessions: kernels, handles, host chunks, evictions, reloads
        warm = make_conversations(torch, 2, p.warmup + 1, p.context_tokens, p.turn_tokens, vocab,
                                  p.seed + 1, first_session=10**6)
        Dialogue(model, rt, policy, p.reply_tokens).run(warm, p.warmup + 1)
        policy.evictions = 0
    rt.synchronize()
    if rt.is_cuda:
        torch.cuda.reset_peak_memory_stats(rt.device)
    gpu_before = rt.allocated_bytes()

    convs = make_conversations(torch, p.sessions, p.rounds, p.context_tokens, p.turn_tokens,
                               vocab, p.seed)
    dialogue = Dialogue(model, rt, policy, p.reply_tokens)
    step = [0]

    def log_round(rec: Any) -> None:
        metrics = {"session": rec.session, "round": rec.round, "ttft_ms": rec.ttft_s * 1e3,
                   "cached_tokens": rec.cached_tokens, "prefill_tokens": rec.prefill_tokens,
                   "decode_tokens_per_s": rec.decode_tokens / rec.decode_s
                   if rec.decode_s > 0 else float("nan"),
                   "reload_bytes": rec.reload_bytes}
        if rec.reload_bytes:
            metrics["reload_ms"] = rec.reload_s * 1e3
        recorder.log_step(step[0], **{k: v for k, v in metrics.items()
                                      if isinstance(v, int) or math.isfinite(v)})
        step[0] += 1

    try:
        with profiling(rt, profiler, recorder):
            records = dialogue.run(convs, p.rounds, on_round=log_round)
        rt.synchronize()
    finally:
        if store is not None:
            store.close()

    resumed = [r for r in records if r.resumed]
    ttft = [r.ttft_s * 1e3 for r in resumed]
    reloads = [r for r in records if r.reload_bytes]
    decode_tokens = sum(r.decode_tokens for r in records)
    decode_s = sum(r.decode_s for r in records)
    reload_bytes = sum(r.reload_bytes for r in reloads)
    reload_s = sum(r.reload_s for r in reloads)
    first_round = [r.ttft_s * 1e3 for r in records if not r.resumed]
    if ttft:  # no resumed round (a single round): no figure, rather than a NaN
        _finite(recorder, "ttft_ms_p50", percentile(ttft, 50))
        _finite(recorder, "ttft_ms_p99", percentile(ttft, 99))
    if first_round:
        _finite(recorder, "ttft_ms_first_round_p50", percentile(first_round, 50))
    _finite(recorder, "decode_tokens_per_s", decode_tokens / decode_s if decode_s else math.nan)
    recorder.log_metric("reload_bytes", reload_bytes)
    recorder.log_metric("reloads", len(reloads))
    _finite(recorder, "reload_gbps", gbps(reload_bytes, reload_s))
    recorder.log_metric("recomputes", sum(r.how == "recompute" for r in records))
    recorder.log_metric("evictions", policy.evictions)
    recorder.log_metric("gpu_cache_bytes_peak", dialogue.gpu_cache_bytes_peak)
    recorder.log_metric("host_cache_bytes_peak", dialogue.host_bytes_peak)
    if store is not None and hasattr(store, "arena"):
        recorder.log_metric("host_pinned_bytes_reserved", store.arena.reserved_bytes)
    if rt.is_cuda:
        recorder.log_metric("gpu_allocated_peak_bytes",
                            torch.cuda.max_memory_allocated(rt.device) - gpu_before)
    recorder.log_metric("sessions_served", len({r.session for r in records
                                                if r.round == p.rounds - 1}))
    recorder.log_metric("rounds_served", len(records))
    recorder.log_metrics(kv_window_work(records))
    replies = {str(c.session): [r.reply for r in records if r.session == c.session]
               for c in convs}
    recorder.artifact_path("replies.json").write_text(json.dumps(replies) + "\n")
    # each reply (session/round) compared with the baseline's (issue 47)
    add_evidence(recorder, "tokens", {f"{s}/{i}": reply for s, rounds in replies.items()
                                      for i, reply in enumerate(rounds)})
    add_evidence(recorder, "first_logits", {f"{r.session}/{r.round}": r.first_logits
                                            for r in records})


def kv_window_work(records: list[Any]) -> dict[str, float]:
    """The work inside a kv-cache window's measured region (the warm-up sessions ran before
    it): every token its rounds generated, each reply whole (the prefill's first token and the
    decode steps after it, as the other studies count), and one first token a round. What the
    window's joules are divided by (issue 36); a repeated run's windows are summed."""
    return {"measured_generated_tokens": float(sum(len(r.reply) for r in records)),
            "measured_first_tokens": float(len(records))}


# --------------------------------------------------------------------------- weight streaming
def _point_name(fraction: float, batch: int) -> str:
    return f"r{int(round(fraction * 100))}_b{batch}"


def measure_point(model: Any, rt: Runtime, batch: int, prompt_tokens: int, decode_tokens: int,
                  warmup: int, vocab: int, seed: int,
                  tokens: list[Any] | None = None) -> dict[str, float]:
    """Prefill ``prompt_tokens`` for ``batch`` sequences, then ``decode_tokens`` greedy steps;
    host clock with the device synchronised at both ends of each part. The generated ids and
    the digest of the first token's logits are appended to ``tokens`` when given (compared with
    the baseline's, issue 47)."""
    torch = rt.torch
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, vocab, (batch, prompt_tokens), generator=g).to(rt.device)
    if warmup:
        cache = new_cache()
        decode(model, prefill(model, ids, cache), cache, warmup + 1)
    rt.synchronize()
    cache = new_cache()
    t0 = time.perf_counter()
    logits = prefill_logits(model, ids, cache)
    first = logits.argmax(dim=-1, keepdim=True)
    rt.synchronize()
    t1 = time.perf_counter()
    generated = decode(model, first, cache, decode_tokens + 1)
    rt.synchronize()
    t2 = time.perf_counter()
    if tokens is not None:
        tokens.append((generated.tolist(), logits_digest(logits)))
    return {"prefill_ms": (t1 - t0) * 1e3, "decode_ms_per_token": (t2 - t1) / decode_tokens * 1e3,
            "tokens_per_s": batch * decode_tokens / (t2 - t1)}


def run_weight_streaming(model: Any, rt: Runtime, p: InferenceParams, recorder: Recording, *,
                         profiler: str) -> None:
    link_gbps = p.pinned_gbps if p.pinned_gbps is not None else measure_pinned_h2d_gbps(rt)
    recorder.set_tag("inference.pinned_gbps_source",
                     "params.pinned_gbps" if p.pinned_gbps is not None else
                     ("measured in the run" if rt.is_cuda else "none (no CUDA)"))
    _finite(recorder, "pinned_h2d_gbps", link_gbps)
    recorder.set_tag("inference.streamer", p.streamer)
    n_layers = len(decoder_layers(model))
    total = module_bytes(model)
    recorder.log_metric("model_bytes", total)
    vocab = vocab_size(model)
    arena = HostArena(pinned=rt.is_cuda,
                      chunk_bytes=1 << max(20, (module_bytes(decoder_layers(model)[0]) * 2 - 1)
                                           .bit_length()))
    points = sorted(((f, b) for f in p.resident_fractions for b in p.batch_sizes),
                    key=lambda fb: (-fb[0], fb[1]))
    step = 0
    generated = firsts = 0  # inside the measured window, each point's warm-up included
    hardest = None  # the smallest share resident at the smallest batch: the headline point
    replies: dict[str, Any] = {}  # batch -> its greedy ids at the first share measured
    firsts_seen: dict[str, str] = {}  # batch -> the digest of its first token's logits
    with profiling(rt, profiler, recorder):
        for fraction in sorted(set(p.resident_fractions), reverse=True):
            resident = resident_layer_count(n_layers, fraction)
            streamer = None
            if p.streamer == "accelerate":
                model, streamed = dispatch_offloaded(model, rt, resident)
            else:
                streamer = LayerStreamer(model, rt, arena, resident).attach()
                streamed = streamer.bytes_per_forward()
            gpu_weights = total - streamed
            for f, batch in points:
                if f != fraction:
                    continue
                ids: list[Any] = []
                m = measure_point(model, rt, batch, p.prompt_tokens, p.decode_tokens, p.warmup,
                                  vocab, p.seed, ids)
                replies.setdefault(f"b{batch}", ids[0][0])
                firsts_seen.setdefault(f"b{batch}", ids[0][1])
                generated += batch * (p.decode_tokens + 1 + (p.warmup + 1 if p.warmup else 0))
                firsts += batch * (2 if p.warmup else 1)
                floor_s = (streamed / (link_gbps * GB) if streamed and math.isfinite(link_gbps)
                           else math.nan)
                m.update({"resident_fraction": fraction, "resident_layers": resident,
                          "batch_size": batch, "bytes_streamed_per_forward": streamed,
                          "gpu_weight_bytes": gpu_weights,
                          "floor_ms_per_token": floor_s * 1e3,
                          "floor_tokens_per_s": batch / floor_s if floor_s else math.nan})
                m["floor_fraction"] = m["tokens_per_s"] / m["floor_tokens_per_s"] \
                    if math.isfinite(m["floor_tokens_per_s"]) else math.nan
                recorder.log_step(step, **{k: float(v) for k, v in m.items()
                                           if math.isfinite(float(v))})
                step += 1
                name = _point_name(fraction, batch)
                for key in ("tokens_per_s", "decode_ms_per_token", "prefill_ms",
                            "floor_fraction"):
                    _finite(recorder, f"{key}_{name}", m[key])
                if batch == min(p.batch_sizes):
                    hardest = m
            if streamer is not None:
                streamer.detach()
    if hardest is not None:
        _finite(recorder, "decode_tokens_per_s", hardest["tokens_per_s"])
        _finite(recorder, "floor_fraction", hardest["floor_fraction"])
        _finite(recorder, "bytes_streamed_per_forward", hardest["bytes_streamed_per_forward"])
        _finite(recorder, "prefill_ms", hardest["prefill_ms"])
    recorder.log_metric("host_pinned_bytes_reserved", arena.reserved_bytes)
    add_evidence(recorder, "tokens", replies)
    add_evidence(recorder, "first_logits", firsts_seen)
    recorder.log_metrics({"measured_generated_tokens": float(generated),
                          "measured_first_tokens": float(firsts)})
