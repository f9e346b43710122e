"""Memory techniques shared by the workloads: one module per technique.

==========================  ===============================================================
``activation_offload``      saved activations to pinned host memory on a side stream, prefetched
                            back in backward; size threshold, buffer pool, GPU-memory budget;
                            ``save_on_cpu_reference()`` is PyTorch's own variant
``checkpointing``           activation checkpointing of decoder layers (non-reentrant)
``recompute_elementwise``   Llama's norms and SiLU-product recomputed in backward: fewer saved
                            bytes, no matrix product recomputed
``peaks``                   the peak memory of a window inside a step, the run's peak kept
``parameter_offload``       frozen weights in pinned host memory, streamed layer by layer
``managed_allocator``       every CUDA allocation through cudaMallocManaged (pluggable allocator),
                            with a cap so that it never asks for more than the GPU has free
``fp8``                     torchao float8 linears and per-layer ``torch.compile``
``managed_policy``          the free-memory rule every family checks before managed memory
``cuda_runtime``            the CUDA runtime through ctypes: managed/pinned/mapped buffers, advice,
                            prefetch, free memory (what torch does not expose)
==========================  ===============================================================

How they compose (see docs/memory.md): only one pair of saved-tensor hooks is active at a time,
so ``ActivationOffload(parameter_offload=...)`` carries the parameter offload's hooks when both
are used; checkpointing wraps the layers so that their forward hooks also run when backward
recomputes them, which is what parameter offload needs to bring the weights back in time.

This package is imported by the spec layer's neighbours: it stays cheap (no torch import here).
"""

from __future__ import annotations

#: the values of the ``offload`` knob and what each turns on
OFFLOAD_MODES = ("none", "activations", "parameters", "both")
#: the values of the ``memory`` knob
MEMORY_MODES = ("device", "managed")


def offloads_activations(mode: str) -> bool:
    return mode in ("activations", "both")


def offloads_parameters(mode: str) -> bool:
    return mode in ("parameters", "both")
