"""Whether a finetune run measures a GPU, and if not why: one answer for every engine, so that
their records say the same thing for the same cause."""

from __future__ import annotations

from hopperlab.workloads.base import RunView, no_cuda_reason


def use_cuda(spec: RunView) -> tuple[bool, str]:
    """Whether this run measures a GPU, and if not, why."""
    try:
        import torch
    except ImportError:
        return False, "torch is not installed"
    reason = no_cuda_reason(torch, spec.resources.gpus)
    return reason is None, reason or ""
