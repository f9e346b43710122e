"""The CUDA caching allocator's settings at run time (``PYTORCH_CUDA_ALLOC_CONF``'s keys).

Why at run time: a job's process has started CUDA before a run's parameters are read (the
runner measures the link first), so the environment variable would come too late; torch applies
these settings to segments it makes from then on. One place for both fine-tune backends.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator


def apply(settings: str) -> None:
    """``settings`` (e.g. ``"expandable_segments:True"``) for the caching allocator, now."""
    import torch

    setter = getattr(torch._C, "_accelerator_setAllocatorSettings", None)
    if setter is None:           # torch before 2.9
        setter = torch.cuda.memory._set_allocator_settings
    setter(settings)


@contextmanager
def expandable_segments(enabled: bool) -> Iterator[bool]:
    """Expandable segments while the block runs (``enabled``), the default after it, even when
    the block fails: a next run in the same process gets the allocator it expects. Yields
    whether they were set."""
    if not enabled:
        yield False
        return
    apply("expandable_segments:True")
    try:
        yield True
    finally:
        apply("expandable_segments:False")
