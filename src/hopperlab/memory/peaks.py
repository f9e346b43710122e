"""Peak GPU memory of a window inside a step, without losing the run's overall peak.

PyTorch keeps one peak counter per device (``max_memory_allocated``), reset by
``reset_peak_memory_stats``. The activation offload's budget policy needs the peak of one part
of a step (from the end of forward to the first reload: the loss's backward); the run reports
the peak over all its measured steps. ``start_window`` folds the counter into a running maximum
before it resets it, and ``overall`` gives back the maximum of both: whoever resets through this
module never hides a peak from the run's figure.
"""

from __future__ import annotations

from typing import Any

import torch

_running: dict[int, tuple[int, int]] = {}       # device index -> (allocated, reserved) peaks


def _index(device: Any) -> int:
    device = torch.device(device)
    return device.index if device.index is not None else torch.cuda.current_device()


def start_window(device: Any) -> None:
    """From now on ``window_peak_allocated`` counts from the memory allocated now."""
    i = _index(device)
    alloc, reserved = _running.get(i, (0, 0))
    _running[i] = (max(alloc, torch.cuda.max_memory_allocated(i)),
                   max(reserved, torch.cuda.max_memory_reserved(i)))
    torch.cuda.reset_peak_memory_stats(i)


def window_peak_allocated(device: Any) -> int:
    """The most bytes allocated since the last ``start_window`` (or ``reset``)."""
    return torch.cuda.max_memory_allocated(_index(device))


def reset(device: Any) -> None:
    """Forget every peak (the run's measured phase starts)."""
    i = _index(device)
    _running.pop(i, None)
    torch.cuda.reset_peak_memory_stats(i)


def overall(device: Any) -> tuple[int, int]:
    """The most bytes allocated and reserved since ``reset``, across every window."""
    i = _index(device)
    alloc, reserved = _running.get(i, (0, 0))
    return (max(alloc, torch.cuda.max_memory_allocated(i)),
            max(reserved, torch.cuda.max_memory_reserved(i)))
