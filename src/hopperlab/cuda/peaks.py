"""Peak GPU memory of a window inside a step, without losing the run's overall peak.

PyTorch keeps one peak counter per device (``max_memory_allocated``), reset by
``reset_peak_memory_stats``. The activation offload's budget policy needs the peak of parts of
a step (forward; from the end of forward to the end of the last layer's backward; each further
layer's backward); the run reports the peak over all its measured steps. ``start_window`` folds
the counter into a running maximum before it resets it, and ``overall`` gives back the maximum
of both: whoever resets through this module never hides a peak from the run's figure.
``allocated_now`` is the current figure, read as cheaply as these (the policy asks for it on
most saved tensors of a step).
"""

from __future__ import annotations

from typing import Any

_running: dict[int, tuple[int, int]] = {}       # device index -> (allocated, reserved) peaks


def _stat(i: int, kind: str, field: str = "peak") -> int:
    """``<kind>.all.<field>`` of device ``i`` (kind: ``allocated_bytes``, ``reserved_bytes``),
    read from the allocator's nested statistics: ``torch.cuda.max_memory_allocated`` flattens
    all of them into a new dict on each call, 7x slower, and the offload's budget reads these
    in every layer's backward."""
    import torch

    nested = getattr(torch._C, "_cuda_memoryStats", None)
    if nested is None:
        return int(torch.cuda.memory_stats(i).get(f"{kind}.all.{field}", 0))
    return int(nested(i)[kind]["all"][field])


def allocated_now(device: Any) -> int:
    """Bytes the caching allocator has handed out on ``device`` now
    (``torch.cuda.memory_allocated``)."""
    return _stat(_index(device), "allocated_bytes", "current")


def _index(device: Any) -> int:
    import torch

    device = torch.device(device)
    return device.index if device.index is not None else torch.cuda.current_device()


def start_window(device: Any) -> None:
    """From now on ``window_peak_allocated`` counts from the memory allocated now."""
    import torch

    i = _index(device)
    alloc, reserved = _running.get(i, (0, 0))
    _running[i] = (max(alloc, _stat(i, "allocated_bytes")),
                   max(reserved, _stat(i, "reserved_bytes")))
    torch.cuda.reset_peak_memory_stats(i)


def window_peak_allocated(device: Any) -> int:
    """The most bytes allocated since the last ``start_window`` (or ``reset``)."""
    return _stat(_index(device), "allocated_bytes")


def reset(device: Any) -> None:
    """Forget every peak (the run's measured phase starts)."""
    import torch

    i = _index(device)
    _running.pop(i, None)
    torch.cuda.reset_peak_memory_stats(i)


def overall(device: Any) -> tuple[int, int]:
    """The most bytes allocated and reserved since ``reset``, across every window."""
    i = _index(device)
    alloc, reserved = _running.get(i, (0, 0))
    return (max(alloc, _stat(i, "allocated_bytes")),
            max(reserved, _stat(i, "reserved_bytes")))
