"""finetune's entry: ``run(spec, recorder)``.

What runs where:

* ``backend: nemo``: the NeMo command in the site's ``nemo`` container (``nemo.py``).
* ``backend: torch`` on a node where torch sees CUDA and the run asks for a GPU
  (``resources.gpus > 0``): the whole study on ``cuda:0``, tag ``finetune.gpu_measured=true``.
* otherwise on the CPU, with every technique's bookkeeping (host-to-host copies, no streams,
  no managed allocator, compile with a CPU backend), tag ``finetune.gpu_measured=false``: the
  figures are then the smoke test's, not a measurement of any technique's speed.

Order matters: the managed allocator is installed before the first CUDA allocation; models
with parameter offload are built with their layers in pinned host memory from the start.
Per step ``steps.jsonl`` gets loss, step time, tokens/s, data wait and the offload bytes; the
final metrics are in ``metrics.summarize`` (its docstring states the FLOP formula).
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any

from hopperlab.workloads.base import no_cuda_reason, spec_params
from hopperlab.core.rundir import SkipRun
from hopperlab.workloads.finetune import HEADLINE_METRICS, FinetuneParams

__all__ = ["run", "HEADLINE_METRICS"]

GIB = float(1 << 30)



def use_cuda(spec: Any) -> tuple[bool, str]:
    """Whether this run measures a GPU, and if not, why."""
    try:
        import torch
    except ImportError:
        return False, "torch is not installed"
    reason = no_cuda_reason(torch, int(getattr(getattr(spec, "resources", None), "gpus", 0) or 0))
    return reason is None, reason or ""


def _pinned_link(device: Any) -> tuple[float, float]:
    """The node's pinned host->device and device->host GB/s, measured after training (the GPU
    is idle then): the figure the run's link floors are judged with, from the same node and
    moment (``hopperlab.cuda.link``)."""
    from hopperlab.cuda.link import MIB, pinned_copy_gbps

    return tuple(pinned_copy_gbps(device, d, 256 * MIB, copies=4, samples=3, verify=True)
                 for d in ("h2d", "d2h"))  # type: ignore[return-value]


def run(spec: Any, recorder: Any) -> None:
    params = spec_params(spec, FinetuneParams)
    recorder.set_tag("finetune.backend", params.backend)
    if params.backend == "nemo":
        from hopperlab.workloads.finetune.nemo import run_nemo

        run_nemo(spec, params, recorder)
        return
    run_torch(spec, params, recorder)


def run_torch(spec: Any, params: FinetuneParams, recorder: Any, *,
              forward_context: Any = None, make_optimizer: Any = None,
              adapt_model: Any = None) -> dict[str, float]:
    """The torch backend. ``forward_context`` (a context-manager factory entered around each
    forward) and ``make_optimizer(trainable_params)`` replace the family's own, and
    ``adapt_model(model, layers) -> model`` changes the prepared model, for comparisons with
    other projects' implementations (benchmarks/finetune_gpu.py); runs never set them."""
    import torch

    from hopperlab.workloads.finetune import data, loop, metrics, model as model_mod
    from hopperlab.workloads.finetune.techniques import Techniques

    cuda, why_not = use_cuda(spec)
    # no torch.cuda call that initialises CUDA before the managed allocator is in place
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    knobs = spec.knobs
    allow_over = bool(getattr(getattr(spec, "site", None), "allow_oversubscription", False))
    tech = Techniques(knobs, params, device, cuda, allow_oversubscription=allow_over)
    recorder.set_tag("finetune.gpu_measured", str(cuda).lower())
    if not cuda:
        recorder.set_tag("finetune.no_gpu_reason", why_not)
    for k, v in tech.describe().items():
        recorder.set_tag(k, v)
    try:
        tech.before_cuda()  # the managed allocator must come before any CUDA allocation
    except RuntimeError as exc:
        if type(exc).__name__ == "ManagedAllocatorError":
            raise SkipRun(f"memory: managed: {exc}") from None
        raise
    managed = tech.managed

    torch.manual_seed(params.seed)
    model_dir = spec.asset_path("model")
    if tech.offloads_parameters:
        model, tags = model_mod.build_host_layers_model(model_dir, params, device)
    else:
        model, tags = model_mod.load_base_model(model_dir, params, device)
    for k, v in tags.items():
        recorder.set_tag(k, v)
    model = model_mod.make_trainable(model, params)  # adapters follow their base weights
    layers = model_mod.decoder_layers(model)
    try:
        model = tech.prepare_model(model, layers)
    except RuntimeError as exc:
        if type(exc).__name__ == "Fp8Unavailable":
            raise SkipRun(f"precision: fp8: {exc}") from None
        raise
    if adapt_model is not None:
        model = adapt_model(model, layers)
        recorder.set_tag("finetune.adapt_model", getattr(adapt_model, "__name__", "yes"))
    for k, v in tech.tags.items():
        recorder.set_tag(k, v)
    counts = model_mod.counts(model)
    recorder.set_tag("finetune.method", params.method)
    recorder.set_tag("model.dtype", params.dtype)
    recorder.set_tag("model.parameters", counts.total)
    recorder.set_tag("model.trainable_parameters", counts.trainable)

    trainable = [p for p in model.parameters() if p.requires_grad]
    if make_optimizer is not None:
        optimizer = make_optimizer(trainable)
        recorder.set_tag("finetune.optimizer", type(optimizer).__name__)
    else:
        optimizer = torch.optim.AdamW(trainable, lr=params.learning_rate,
                                      weight_decay=params.weight_decay, fused=cuda or None)
    source = data.open_source(spec, params, counts.vocab)
    recorder.set_tag("data.source", source.description)
    num_workers = int(knobs.num_workers)
    loader = data.make_loader(source, params, num_workers, pin_memory=params.pin_memory and cuda)
    recorder.set_tag("data.num_workers", num_workers)

    flops_token = metrics.flops_per_token(counts, source.seq_len, params.method)
    gpu_name = torch.cuda.get_device_name(device) if cuda else None  # CUDA is initialised now
    peak = metrics.peak_flops(gpu_name)
    if gpu_name:
        recorder.set_tag("finetune.gpu", gpu_name)
    device_used = {"peak": 0.0}

    def on_step(rec: metrics.StepRecord) -> None:
        figures = {"loss": rec.loss, "step_time_s": rec.step_s, "data_wait_s": rec.data_wait_s,
                   "tokens_per_s": rec.tokens / rec.step_s, "measured": float(rec.measured),
                   **rec.extra}
        if cuda:
            free, total = torch.cuda.mem_get_info(device)
            device_used["peak"] = max(device_used["peak"], (total - free) / GIB)
            if managed is None:  # the caching allocator's counters (none with managed memory)
                figures["gpu_allocated_gib"] = torch.cuda.memory_allocated(device) / GIB
        recorder.log_step(rec.step, **figures)

    def reset_peaks() -> None:
        if cuda:
            torch.cuda.synchronize(device)
            if managed is None:
                from hopperlab.cuda import peaks

                peaks.reset(device)

    technique_context = tech.forward_context
    if forward_context is not None:
        technique_context = forward_context
        recorder.set_tag("finetune.forward_context", getattr(forward_context, "__name__",
                                                             type(forward_context).__name__))
    amp = cuda and params.autocast and params.dtype == "bfloat16"
    recorder.set_tag("finetune.autocast", "bfloat16" if amp else "none")

    def forward_ctx() -> ExitStack:
        stack = ExitStack()
        stack.enter_context(technique_context())
        if amp:
            stack.enter_context(torch.autocast("cuda", dtype=torch.bfloat16))
        return stack

    tech.forward_context = forward_ctx  # type: ignore[method-assign]
    try:
        records = loop.train(
            model, optimizer, data.timed_batches(loader), device=device,
            warmup_steps=params.warmup_steps, measured_steps=params.measured_steps,
            techniques=tech, profiler=str(knobs.profiler), cuda=cuda, on_step=on_step,
            trace_path=lambda: recorder.artifact_path("profile/torch_trace.json"),
            on_measure_start=reset_peaks)
    finally:
        tech.close()
    final = metrics.summarize(records, flops_token=flops_token, peak=peak)
    measured = [r for r in records if r.measured]
    for key in sorted({k for r in measured for k in r.extra}):
        final[f"{key}_per_step"] = sum(r.extra.get(key, 0.0) for r in measured) / len(measured)
    if cuda and managed is None:
        final.update(metrics.gpu_memory(torch, device))
    elif managed is not None:  # peaks since install (warm-up included): the allocator's own
        stats = managed.stats()
        final["peak_gpu_allocated_gib"] = stats.peak_in_use_bytes / GIB
        final["peak_gpu_reserved_gib"] = stats.peak_managed_bytes / GIB
    if cuda:
        final["peak_device_used_gib"] = device_used["peak"]
    # the host traffic of the techniques that count it (save_on_cpu, PyTorch's, does not)
    counted = [k for k in ("act_bytes_offloaded_per_step", "param_bytes_streamed_per_step")
               if k in final]
    if counted:
        final["bytes_to_host_per_step"] = final.get("act_bytes_offloaded_per_step", 0.0)
        final["bytes_from_host_per_step"] = final.get("act_bytes_reloaded_per_step", 0.0) + \
            final.get("param_bytes_streamed_per_step", 0.0)
        if cuda and managed is None and tech.uses_host_link:
            final.update(metrics.link_floors(final, *_pinned_link(device), two_phase=(
                tech.offloads_activations and not tech.offloads_parameters)))
    if tech.offloads_parameters or params.num_layers is not None:
        final["step_time_per_layer_s"] = final["step_time_p50_s"] / counts.layers
    recorder.log_metrics(final)
    return final
