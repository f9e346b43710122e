"""The knobs and technique params of a run, turned into what the training loop applies.

One place maps ``offload``, ``memory``, ``precision`` and the family params (checkpointing,
``activation_offload``, budget, resident layers, compile) onto ``hopperlab.memory`` (one module
per technique), in the order they must happen:

1. ``before_cuda()``: the managed allocator, before anything touches CUDA memory;
2. ``prepare_model(model)``: Liger's fused kernels, element-wise recomputation, the chunked loss, checkpointing, FP8 or
   compiled layers, parameter offload;
3. ``forward_context()`` around each forward: activation offload (the async technique,
   or the ``save_on_cpu`` reference) and the parameter offload's saved-weight hooks;
4. ``step_stats()`` after each step: bytes moved to and from the host, what stayed.

On a node without CUDA every technique still runs its bookkeeping on the CPU (host-to-host
copies, no streams), so CI tests the logic; the run is tagged ``finetune.gpu_measured=false``.
"""

from __future__ import annotations

import platform
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, ContextManager

from hopperlab.memory import (caching_allocator, chunked_cross_entropy, checkpointing, fp8,
                              managed_allocator, recompute_elementwise)
from hopperlab.memory.activation_offload import ActivationOffload, save_on_cpu_reference
from hopperlab.memory.parameter_offload import ParameterOffload
from hopperlab.workloads.finetune import ACTIVATION_OFFLOADS as ACTIVATION_POLICIES
from hopperlab.workloads.finetune import OFFLOADS, FinetuneParams
from hopperlab.workloads.finetune.torch import fused_kernels


GIB = 1 << 30
#: the caching allocator's counters a step reports the change of (torch.cuda.memory_stats)
ALLOCATOR_COUNTERS = {"device_mallocs": "num_device_alloc", "device_frees": "num_device_free",
                      "retries": "num_alloc_retries", "sync_all_streams": "num_sync_all_streams"}


#: what a CPU (smoke) run of a compiled or FP8 variant does not do, said in its record
CPU_COMPILE_NOTE = ("inductor code generation: torch.compile's eager backend on a CPU (dynamo "
                    "traces and guards each layer; no kernels are generated)")
CPU_FP8_NOTE = ("FP8 tensor cores: the FP8 products emulated on the CPU in float32 (torchao's "
                "emulate: the conversion, scaling and autograd path run, torch._scaled_mm does "
                "not; FP8's speed is not measured)")

@dataclass
class Techniques:
    knobs: Any
    params: FinetuneParams
    device: Any
    cuda: bool
    allow_oversubscription: bool = False
    tags: dict[str, str] = field(default_factory=dict)
    _offload: Any = None
    _param_offload: Any = None
    _managed: Any = None
    _liger: Any = None
    _expandable: bool = False
    _capped: bool = False
    _allocator_last: dict[str, float] | None = None

    def __post_init__(self) -> None:
        """A policy name is a closed vocabulary: a params object the matrix never checked (a
        test's, a benchmark's) with another name is refused, not run as the reference."""
        policy = self.params.activation_offload
        if policy not in ACTIVATION_POLICIES:
            raise ValueError(f"activation_offload: {policy!r} is not one of "
                             f"{', '.join(ACTIVATION_POLICIES)}")

    # -- which techniques ----------------------------------------------------------------
    @property
    def offloads_activations(self) -> bool:
        return "activations" in OFFLOADS[self.knobs.offload]

    @property
    def offloads_parameters(self) -> bool:
        return "parameters" in OFFLOADS[self.knobs.offload]

    @property
    def uses_host_link(self) -> bool:
        """The run's techniques move bytes over the host link and count them (the async
        activation offload into host memory, the parameter offload): its link floors apply.
        save_on_cpu, PyTorch's, counts none."""
        p = self.params
        return self.offloads_parameters or (
            self.offloads_activations and p.activation_offload == "async"
            and p.offload_staging == "host")

    @property
    def compiles(self) -> bool:
        return self.params.compile or self.knobs.precision == "fp8"

    def describe(self) -> dict[str, str]:
        p = self.params
        act = "none"
        if self.offloads_activations:
            act = p.activation_offload
            if p.activation_offload == "async" and p.offload_budget_gib is not None:
                act += f"(budget {p.offload_budget_gib:g} GiB)"
            if p.activation_offload == "async" and p.offload_staging == "device":
                act += "(staging on the device: a diagnostic, no memory saved)"
        return {"finetune.activation_offload": act,
                "finetune.parameter_offload": (f"resident {p.resident_layers}, prefetch "
                                               f"{p.prefetch_layers}")
                if self.offloads_parameters else "none",
                "finetune.checkpointing": str(p.checkpointing).lower(),
                "finetune.recompute_elementwise": str(p.recompute_elementwise).lower(),
                "finetune.loss_chunk_tokens": "none" if p.loss_chunk_tokens is None
                else str(p.loss_chunk_tokens),
                "finetune.offload_budget_caps_allocator":
                str(p.offload_budget_caps_allocator).lower(),
                "finetune.expandable_segments": str(p.expandable_segments).lower(),
                "finetune.liger": ",".join(p.liger) or "none",
                "finetune.precision": self.knobs.precision,
                "finetune.compile": str(self.compiles).lower(),
                "finetune.memory": self.knobs.memory}

    # -- 1. before CUDA --------------------------------------------------------------------
    def before_cuda(self) -> None:
        """Route allocations through cudaMallocManaged (knob memory: managed), capped at the
        GPU's free memory, or give the caching allocator expandable segments. Without CUDA:
        the cap policy only (tagged), training on the host."""
        if self.params.expandable_segments and self.cuda:
            caching_allocator.apply("expandable_segments:True")
            self._expandable = True
        if self.knobs.memory != "managed":
            return
        if not self.cuda:
            over = managed_allocator.oversubscription_allowed(platform.machine(), None,
                                                              self.allow_oversubscription)
            self.tags["finetune.managed"] = ("not installed: no CUDA device; oversubscription "
                                             f"{'allowed' if over else 'refused'} on this host")
            return
        self._managed = managed_allocator.install_managed_allocator(
            self.device.index or 0, allow_oversubscription=self.allow_oversubscription,
            advise=self.params.managed_advise, prefetch=self.params.managed_prefetch)
        cap = self._managed.cap_bytes
        self.tags["finetune.managed"] = (
            f"installed on {self._managed.gpu_name}; cap "
            f"{'none (oversubscription allowed)' if cap is None else f'{cap / GIB:.1f} GiB'}; "
            f"advise {self.params.managed_advise}; prefetch {self.params.managed_prefetch}")

    @property
    def managed(self) -> Any:
        """The installed managed allocator (its stats replace torch.cuda's memory figures)."""
        return self._managed

    # -- 2. the model ----------------------------------------------------------------------
    def prepare_model(self, model: Any, layers: Any) -> Any:
        """Apply Liger's kernels, checkpointing, FP8 / compile, and the offloads to the
        decoder ``layers``. Liger without CUDA raises ``fused_kernels.LigerUnavailable``."""
        p = self.params
        if p.liger:
            version = fused_kernels.require(self.cuda)
            self._liger = fused_kernels.apply(model, p.liger, version)
            self.tags["finetune.liger"] = self._liger.describe()
        if p.recompute_elementwise:  # not with fp8 or compile: the family's check refuses them
            handle = recompute_elementwise.apply(model)
            self.tags["finetune.recomputed_modules"] = handle.describe()
        if p.loss_chunk_tokens is not None and hasattr(model, "use_chunked_loss"):
            # a model of our own that computes its loss itself (moe.py) chunks it itself
            self.tags["finetune.chunked_loss"] = model.use_chunked_loss(p.loss_chunk_tokens)
        elif p.loss_chunk_tokens is not None:
            handle = chunked_cross_entropy.apply(model, p.loss_chunk_tokens)
            self.tags["finetune.chunked_loss"] = handle.describe()
        if p.checkpointing:
            checkpointing.checkpoint_layers(layers)
        if self.knobs.precision == "fp8":
            if self.cuda:
                fp8.require_fp8(self.device)  # Fp8Unavailable: the workload skips the run
            converted = fp8.convert_to_fp8(model, lora=p.method == "lora", emulate=not self.cuda)
            self.tags["finetune.fp8_linears"] = str(len(converted))
            if not self.cuda:   # the record says what a CPU run of this variant leaves out
                self.tags["finetune.fp8_matmul"] = CPU_FP8_NOTE
        if self.compiles:
            # CPU (smoke): dynamo's tracing and guards with the eager backend; the inductor
            # kernels are a GPU matter and would cost minutes of C++ compilation here
            kwargs = {} if self.cuda else {"backend": "eager"}
            n = fp8.compile_layers(model, **kwargs)
            self.tags["finetune.compiled_layers"] = f"{n} ({kwargs.get('backend', 'inductor')})"
            if not self.cuda:
                self.tags["finetune.compile_skipped"] = CPU_COMPILE_NOTE
        if self.offloads_parameters:
            self._param_offload = ParameterOffload(
                layers, self.device, resident_layers=p.resident_layers,
                prefetch=p.prefetch_layers)
        if self.offloads_activations and p.activation_offload == "async":
            budget = None if p.offload_budget_gib is None else int(p.offload_budget_gib * GIB)
            self._offload = ActivationOffload(
                self.device, min_bytes=p.offload_min_bytes, budget_bytes=budget,
                keep_last_layers=p.offload_keep_last_layers, keep_head=p.offload_keep_head,
                max_inflight_bytes=p.offload_max_inflight_mib << 20,
                parameter_offload=self._param_offload, staging=p.offload_staging)
            self._offload.wrap_layers(layers).track_parameters(model)
            if p.offload_budget_caps_allocator:
                self._cap_allocator(budget)
        return model

    def _cap_allocator(self, budget: int) -> None:
        """The caching allocator may reserve at most ``budget`` bytes (the budget policy keeps
        allocated memory under it; this keeps what the allocator holds under it too; refused
        with memory: managed in ``before_cuda``)."""
        if not self.cuda:
            self.tags["finetune.allocator_cap"] = "none: no CUDA device"
            return
        import torch

        total = torch.cuda.get_device_properties(self.device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, budget / total), self.device)
        self._capped = True
        self.tags["finetune.allocator_cap"] = f"{budget / GIB:g} GiB of {total / GIB:.1f}"

    # -- 3. each step ----------------------------------------------------------------------
    def forward_context(self) -> ContextManager[Any]:
        """Around one forward (saved-tensor hooks: one pair active at a time, so the async
        activation offload carries the parameter offload's when both are on)."""
        if self._offload is not None:
            return self._offload
        if self.offloads_activations and self.params.activation_offload == "save_on_cpu":
            return save_on_cpu_reference(pin_memory=self.cuda)
        if self._param_offload is not None:
            return self._param_offload
        return nullcontext()

    def step_stats(self) -> dict[str, float]:
        """Bytes moved to / from the host in the last step (and what the techniques report),
        and the caching allocator's work in it (``allocator_*``: cudaMalloc / cudaFree calls,
        retries after freeing its cache; a steady step makes none)."""
        out: dict[str, float] = self._allocator_counters()
        for name, tech in (("act", self._offload), ("param", self._param_offload),
                           ("managed", self._managed)):
            if tech is None:
                continue
            stats = tech.stats()
            stats = stats.as_dict() if hasattr(stats, "as_dict") else dict(stats)
            for key, value in stats.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    out[f"{name}_{key}"] = float(value)
        return out

    def _allocator_counters(self) -> dict[str, float]:
        if not self.cuda or self._managed is not None:
            return {}
        import torch

        stats = torch.cuda.memory_stats(self.device)
        now = {name: float(stats.get(key, 0)) for name, key in ALLOCATOR_COUNTERS.items()}
        last, self._allocator_last = self._allocator_last, now
        if last is None:
            return {}
        return {f"allocator_{k}": now[k] - last[k] for k in now}

    def close(self) -> None:
        """Take the techniques' hooks away and give the activation offload's pinned pool back
        (``ActivationOffload.remove`` keeps it, for a next step that will not come)."""
        for tech in (self._offload, self._param_offload):
            if tech is not None and hasattr(tech, "remove"):
                tech.remove()
        pool = getattr(self._offload, "pool", None)
        if pool is not None and hasattr(pool, "clear"):
            pool.clear()
        if self._liger is not None:
            self._liger.remove()
            self._liger = None
        if self._capped:
            import torch

            torch.cuda.set_per_process_memory_fraction(1.0, self.device)
            self._capped = False
        if self._expandable:     # a next run in this process gets the default allocator
            caching_allocator.apply("expandable_segments:False")
            self._expandable = False

