"""finetune's entry: ``run(spec, recorder)``.

The torch engine (``backend: torch``) trains here: on ``cuda:0`` where torch sees CUDA and the run asks for a GPU
(tag ``finetune.gpu_measured=true``), otherwise on the CPU with every technique's bookkeeping
(the smoke test's figures, not a measurement of any technique's speed).

``run_torch`` is ``train(prepare(...))``. Benchmarks that compare other projects' pieces use the
two halves (``prepare``, ``TorchRun.adapt``, ``train(optimizer=, forward_context=)``): the
production entry carries no such hooks. Order matters: the managed allocator is installed before
the first CUDA allocation; models with parameter offload are built with their layers in host
memory from the start. Step figures go to ``steps.jsonl``, the summary to ``metrics.summarize``.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager

from hopperlab.core.rundir import SkipRun, write_json_atomic, write_text_atomic
from hopperlab.cuda import peaks
from hopperlab.cuda.link import MIB, pinned_copy_gbps
from hopperlab.memory.fp8 import Fp8Unavailable
from hopperlab.memory.layers import decoder_layers
from hopperlab.memory.managed_allocator import ManagedAllocatorError
from hopperlab.memory.saved_tensor_census import CENSUS_CSV, CENSUS_JSON, SavedTensorCensus
from hopperlab.workloads.base import Recording, RunView, spec_params
from hopperlab.workloads.finetune import HEADLINE_METRICS, FinetuneParams
from hopperlab.workloads.finetune import data, metrics
from hopperlab.workloads.finetune.device import use_cuda
from hopperlab.workloads.finetune.torch import loop
from hopperlab.workloads.finetune.torch.fused_kernels import LigerUnavailable
from hopperlab.workloads.finetune.torch import model as model_mod
from hopperlab.workloads.finetune.torch.master_weights import MasterWeightsAdamW
from hopperlab.workloads.finetune.oversubscription import check_oversubscription
from hopperlab.workloads.finetune.torch.techniques import Techniques

__all__ = ["run", "run_torch", "prepare", "train", "TorchRun", "HEADLINE_METRICS"]

GIB = float(1 << 30)


def run(spec: RunView[FinetuneParams], recorder: Recording) -> None:
    """The torch engine's entry (``EngineInfo.entry``)."""
    params = spec_params(spec, FinetuneParams)
    recorder.set_tag("finetune.backend", params.backend)
    check_oversubscription(spec, params.oversubscribe, recorder)  # before any allocation
    run_torch(spec, params, recorder)


def run_torch(spec: RunView, params: FinetuneParams, recorder: Recording) -> dict[str, float]:
    """The torch backend: the techniques and model of the run, trained; returns the metrics."""
    return train(prepare(spec, params, recorder))


# ----------------------------------------------------------------------------- preparing
@dataclass
class TorchRun:
    """A torch-backend run once prepared: techniques in place, the model built and prepared."""

    spec: RunView
    params: FinetuneParams
    recorder: Recording
    cuda: bool
    device: Any
    tech: Techniques
    model: Any
    layers: Any
    device_peak_gib: list[float] = field(default_factory=lambda: [0.0])

    def adapt(self, fn: Callable[[Any, Any], Any]) -> None:
        """``fn(model, layers) -> model`` changes the prepared model (a benchmark's peer
        technique, e.g. accelerate's offload of the frozen weights); tagged."""
        self.model = fn(self.model, self.layers)
        self.recorder.set_tag("finetune.adapt_model", getattr(fn, "__name__", "yes"))

    def trainable(self) -> list[Any]:
        return [p for p in self.model.parameters() if p.requires_grad]


def prepare(spec: RunView, params: FinetuneParams, recorder: Recording) -> TorchRun:
    """The techniques (the managed allocator before anything touches CUDA) and the model."""
    import torch

    cuda, why_not = use_cuda(spec)
    # no torch.cuda call that initialises CUDA before the managed allocator is in place
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    recorder.set_tag("finetune.gpu_measured", str(cuda).lower())
    if not cuda:
        recorder.set_tag("finetune.no_gpu_reason", why_not)
    tech = _techniques(spec, params, device, cuda, recorder)
    torch.manual_seed(params.seed)
    model, layers = _model(spec, params, device, tech, recorder)
    return TorchRun(spec, params, recorder, cuda, device, tech, model, layers)


def _techniques(spec: RunView, params: FinetuneParams, device: Any, cuda: bool,
                recorder: Recording) -> Techniques:
    allow_over = spec.site.allow_oversubscription
    tech = Techniques(spec.knobs, params, device, cuda, allow_oversubscription=allow_over)
    for k, v in tech.describe().items():
        recorder.set_tag(k, v)
    try:
        tech.before_cuda()
    except ManagedAllocatorError as exc:
        raise SkipRun(f"memory: managed: {exc}") from None
    return tech


def _model(spec: RunView, params: FinetuneParams, device: Any, tech: Techniques,
           recorder: Recording) -> tuple[Any, Any]:
    model_dir = spec.asset_path("model")
    build = model_mod.build_host_layers_model if tech.offloads_parameters \
        else model_mod.load_base_model
    model, tags = build(model_dir, params, device)
    for k, v in tags.items():
        recorder.set_tag(k, v)
    model = model_mod.make_trainable(model, params)  # adapters follow their base weights
    layers = decoder_layers(model)
    try:
        model = tech.prepare_model(model, layers)
    except Fp8Unavailable as exc:
        raise SkipRun(f"precision: fp8: {exc}") from None
    except LigerUnavailable as exc:
        raise SkipRun(f"liger: {exc}") from None
    return model, layers


# ----------------------------------------------------------------------------- training
def train(run: TorchRun, *, optimizer: Any = None,
          forward_context: Callable[[], ContextManager[Any]] | None = None) -> dict[str, float]:
    """Train the prepared run and record its metrics. ``optimizer`` and ``forward_context`` (a
    context-manager factory entered around each forward) replace the family's own: the seam for
    benchmarks' comparisons with other projects (benchmarks/finetune_gpu.py); runs set neither."""
    import torch

    params, recorder, tech = run.params, run.recorder, run.tech
    for k, v in tech.tags.items():
        recorder.set_tag(k, v)
    counts = _record_model(run)
    if optimizer is None and params.master_weights:
        optimizer = MasterWeightsAdamW(run.trainable(), lr=params.learning_rate,
                                       weight_decay=params.weight_decay, fused=run.cuda or None)
        recorder.set_tag("finetune.optimizer", "AdamW, float32 master weights")
    elif optimizer is None:
        optimizer = torch.optim.AdamW(run.trainable(), lr=params.learning_rate,
                                      weight_decay=params.weight_decay, fused=run.cuda or None)
    else:
        recorder.set_tag("finetune.optimizer", type(optimizer).__name__)
    if forward_context is not None:
        recorder.set_tag("finetune.forward_context", getattr(forward_context, "__name__",
                                                             type(forward_context).__name__))
    source, loader = _data(run, counts.vocab)
    gpu_name = torch.cuda.get_device_name(run.device) if run.cuda else None  # CUDA is up now
    if gpu_name:
        recorder.set_tag("finetune.gpu", gpu_name)
    tech.forward_context = _forward_context(run, forward_context or tech.forward_context)  # type: ignore[method-assign]
    census = SavedTensorCensus(run.model, run.layers) if params.census else None
    windows = run.spec.repeats  # repeat_unit "windows": of steps
    try:
        records = loop.train(
            run.model, optimizer, data.timed_batches(loader), device=run.device,
            warmup_steps=params.warmup_steps, measured_steps=params.measured_steps * windows,
            techniques=tech, profiler=str(run.spec.knobs.profiler), cuda=run.cuda,
            on_step=lambda rec: _log_step(run, rec),
            trace_path=lambda: recorder.artifact_path("profile/torch_trace.json"),
            on_measure_start=lambda: _reset_peaks(run),
            census=census.observe if census is not None else None)
    finally:
        tech.close()
    if census is not None:
        _record_census(run, census, records)
    flops_token = metrics.flops_per_token(counts, source.seq_len, params.method)
    final = metrics.summarize(records, flops_token=flops_token, peak=metrics.peak_flops(gpu_name))
    if windows > 1:
        measured = [r for r in records if r.measured]
        n = params.measured_steps
        for w in range(windows):
            window = measured[w * n:(w + 1) * n]
            recorder.add_sample({**metrics.summarize(
                window, flops_token=flops_token, peak=metrics.peak_flops(gpu_name)),
                **_per_step_extras(window)})
    final.update(_per_step_extras(records))
    final.update(metrics.window_work(records))
    final.update(_memory_figures(run))
    final.update(_host_traffic(run, final))
    if tech.offloads_parameters or params.num_layers is not None:
        final["step_time_per_layer_s"] = final["step_time_p50_s"] / counts.layers
    recorder.log_metrics(final)
    return final


def _record_census(run: TorchRun, census: SavedTensorCensus,
                   records: list[metrics.StepRecord]) -> None:
    """The census step's table: ``census_*`` metrics, the kinds of each class as tags, and the
    rows in ``artifacts/census.json`` and ``artifacts/census.csv`` (uploaded with the run)."""
    step = next(r.step for r in records if r.extra.get("census"))
    table = census.table(step)
    recorder = run.recorder
    recorder.log_metrics(table.metrics())
    recorder.log_metric("census_step", step)
    for k, v in table.kind_tags().items():
        recorder.set_tag(k, v)
    write_json_atomic(recorder.artifact_path(CENSUS_JSON), table.to_json())
    write_text_atomic(recorder.artifact_path(CENSUS_CSV), table.to_csv())


def _record_model(run: TorchRun) -> model_mod.ModelCounts:
    counts = model_mod.counts(run.model)
    recorder = run.recorder
    recorder.set_tag("finetune.method", run.params.method)
    recorder.set_tag("model.dtype", run.params.dtype)
    recorder.set_tag("model.parameters", counts.total)
    recorder.set_tag("model.trainable_parameters", counts.trainable)
    return counts


def _data(run: TorchRun, vocab: int) -> tuple[Any, Any]:
    source = data.open_source(run.spec, run.params, vocab)
    run.recorder.set_tag("data.source", source.description)
    num_workers = int(run.spec.knobs.num_workers)
    loader = data.make_loader(source, run.params, num_workers,
                              pin_memory=run.params.pin_memory and run.cuda)
    run.recorder.set_tag("data.num_workers", num_workers)
    return source, loader


def _forward_context(run: TorchRun, technique_context: Callable[[], Any]) -> Callable[[], Any]:
    """The techniques' context around each forward, under bf16 autocast where it applies."""
    import torch

    amp = run.cuda and run.params.autocast and run.params.dtype == "bfloat16"
    run.recorder.set_tag("finetune.autocast", "bfloat16" if amp else "none")

    def forward_ctx() -> ExitStack:
        stack = ExitStack()
        stack.enter_context(technique_context())
        if amp:
            stack.enter_context(torch.autocast("cuda", dtype=torch.bfloat16))
        return stack
    return forward_ctx


def _log_step(run: TorchRun, rec: metrics.StepRecord) -> None:
    import torch

    figures = {"loss": rec.loss, "step_time_s": rec.step_s, "data_wait_s": rec.data_wait_s,
               "tokens_per_s": rec.tokens / rec.step_s, "measured": float(rec.measured),
               **rec.extra}
    if run.cuda:
        free, total = torch.cuda.mem_get_info(run.device)
        run.device_peak_gib[0] = max(run.device_peak_gib[0], (total - free) / GIB)
        if run.tech.managed is None:  # the caching allocator's counters (none with managed)
            figures["gpu_allocated_gib"] = torch.cuda.memory_allocated(run.device) / GIB
    run.recorder.log_step(rec.step, **figures)


def _reset_peaks(run: TorchRun) -> None:
    import torch

    if run.cuda:
        torch.cuda.synchronize(run.device)
        if run.tech.managed is None:
            peaks.reset(run.device)


def _per_step_extras(records: list[metrics.StepRecord]) -> dict[str, float]:
    measured = [r for r in records if r.measured]
    return {f"{key}_per_step": sum(r.extra.get(key, 0.0) for r in measured) / len(measured)
            for key in sorted({k for r in measured for k in r.extra})}


def _memory_figures(run: TorchRun) -> dict[str, float]:
    """Peak GPU memory: the caching allocator's (across the windows a technique measured), or
    the managed allocator's own since install (warm-up included)."""
    out: dict[str, float] = {}
    managed = run.tech.managed
    if run.cuda and managed is None:
        allocated, reserved = peaks.overall(run.device)
        out.update(peak_gpu_allocated_gib=allocated / GIB, peak_gpu_reserved_gib=reserved / GIB)
    elif managed is not None:
        stats = managed.stats()
        out.update(peak_gpu_allocated_gib=stats.peak_in_use_bytes / GIB,
                   peak_gpu_reserved_gib=stats.peak_managed_bytes / GIB)
    if run.cuda:
        out["peak_device_used_gib"] = run.device_peak_gib[0]
    return out


def _host_traffic(run: TorchRun, final: dict[str, float]) -> dict[str, float]:
    """Bytes to and from the host per step, of the techniques that count them (save_on_cpu,
    PyTorch's, does not), and the link floors they imply."""
    if not any(k in final for k in ("act_bytes_offloaded_per_step",
                                    "param_bytes_streamed_per_step")):
        return {}
    out = {"bytes_to_host_per_step": final.get("act_bytes_offloaded_per_step", 0.0),
           "bytes_from_host_per_step": final.get("act_bytes_reloaded_per_step", 0.0)
           + final.get("param_bytes_streamed_per_step", 0.0)}
    tech = run.tech
    if run.cuda and tech.managed is None and tech.uses_host_link:
        out.update(metrics.link_floors({**final, **out}, *_pinned_link(run.device), two_phase=(
            tech.offloads_activations and not tech.offloads_parameters)))
    return out


def _pinned_link(device: Any) -> tuple[float, float]:
    """The node's pinned host->device and device->host GB/s, measured after training (the GPU
    is idle then): the figure the run's link floors are judged with, from the same node and
    moment (``hopperlab.cuda.link``)."""
    return tuple(pinned_copy_gbps(device, d, 256 * MIB, copies=4, samples=3, verify=True)
                 for d in ("h2d", "d2h"))  # type: ignore[return-value]
