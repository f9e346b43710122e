"""Where the run computes, and the few stream/event/timer tools every technique here shares.

On a CUDA device the copies of the techniques go to a side stream (``Runtime.side``) and the
compute stream waits for them through events, so that copies overlap compute. Without CUDA the
same code runs on the CPU: copies happen at once (there is nothing to overlap with) and every
event is already complete, so the bookkeeping of each technique (which layer is where, what waits
for what) is still exercised and its results still checked.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from hopperlab.core.stats import MIB
from hopperlab.cuda.link import pinned_copy_gbps
from hopperlab.workloads.base import no_cuda_reason


@dataclass
class Runtime:
    torch: Any
    device: Any  # torch.device
    is_cuda: bool
    side: Any = None  # host->device copies (reloads, prefetches, streamed weights); CUDA only
    d2h: Any = None  # device->host copies (evictions), so that they never queue before a reload
    no_cuda_reason: str | None = None

    # -- streams and events ----------------------------------------------------------------
    def side_stream(self) -> Any:
        """A context manager that makes the side stream current (nothing without CUDA)."""
        from contextlib import nullcontext  # noqa: PLC0415

        return self.torch.cuda.stream(self.side) if self.is_cuda else nullcontext()

    def d2h_stream(self) -> Any:
        from contextlib import nullcontext  # noqa: PLC0415

        return self.torch.cuda.stream(self.d2h) if self.is_cuda else nullcontext()

    def compute_stream(self) -> Any:
        return self.torch.cuda.current_stream(self.device) if self.is_cuda else None

    def record_on(self, stream: Any) -> Any:
        """An event marking ``stream``'s work so far (None without CUDA: already done)."""
        if not self.is_cuda:
            return None
        event = self.torch.cuda.Event()
        event.record(stream)
        return event

    def wait_on(self, stream: Any, event: Any) -> None:
        if event is not None and stream is not None:
            stream.wait_event(event)

    def side_waits_for_compute(self) -> None:
        """The side stream starts its next copies only after the compute stream's work so far
        (the memory it reads or writes was made or last used there)."""
        if self.is_cuda:
            self.side.wait_stream(self.torch.cuda.current_stream(self.device))

    def compute_waits_for_side(self) -> None:
        if self.is_cuda:
            self.torch.cuda.current_stream(self.device).wait_stream(self.side)

    def record_on_side(self) -> Any:
        """An event marking the side stream's work so far (None without CUDA: already done)."""
        if not self.is_cuda:
            return None
        event = self.torch.cuda.Event()
        event.record(self.side)
        return event

    def record_on_compute(self) -> Any:
        if not self.is_cuda:
            return None
        event = self.torch.cuda.Event()
        event.record(self.torch.cuda.current_stream(self.device))
        return event

    def compute_waits(self, event: Any) -> None:
        if event is not None:
            self.torch.cuda.current_stream(self.device).wait_event(event)

    def side_waits(self, event: Any) -> None:
        if event is not None:
            self.side.wait_event(event)

    def synchronize(self) -> None:
        if self.is_cuda:
            self.torch.cuda.synchronize(self.device)

    def sync_compute(self) -> None:
        """Wait for the compute stream only (copies on the side streams may go on)."""
        if self.is_cuda:
            self.torch.cuda.current_stream(self.device).synchronize()

    # -- memory ----------------------------------------------------------------------------
    def allocated_bytes(self) -> int:
        return int(self.torch.cuda.memory_allocated(self.device)) if self.is_cuda else 0

    def free_bytes(self) -> int | None:
        if not self.is_cuda:
            return None
        free, _total = self.torch.cuda.mem_get_info(self.device)
        return int(free)

    def gpu_timer(self) -> "GpuTimer":
        return GpuTimer(self)


class GpuTimer:
    """Seconds between ``start()`` and ``stop()`` of the work enqueued on a stream: CUDA events on
    a GPU, the host clock without one (where work is synchronous anyway)."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self._t0 = 0.0
        self._events: tuple[Any, Any] | None = None

    def start(self, stream: Any = None) -> "GpuTimer":
        if self.rt.is_cuda:
            torch = self.rt.torch
            self._events = (torch.cuda.Event(enable_timing=True),
                            torch.cuda.Event(enable_timing=True))
            self._events[0].record(stream)
        else:
            self._t0 = time.perf_counter()
        return self

    def stop(self, stream: Any = None) -> "GpuTimer":
        if self._events is not None:
            self._events[1].record(stream)
        else:
            self._t1 = time.perf_counter()
        return self

    def seconds(self) -> float:
        if self._events is not None:
            self._events[1].synchronize()
            return self._events[0].elapsed_time(self._events[1]) / 1e3
        return self._t1 - self._t0


def probe(torch: Any, want_gpu: bool = True) -> Runtime:
    """A CUDA runtime when torch has one and the run asks for a GPU, else the CPU."""
    reason = no_cuda_reason(torch, 1 if want_gpu else 0)
    if reason is not None:
        return Runtime(torch=torch, device=torch.device("cpu"), is_cuda=False,
                       no_cuda_reason=reason)
    device = torch.device("cuda", torch.cuda.current_device())
    return Runtime(torch=torch, device=device, is_cuda=True, side=torch.cuda.Stream(device),
                   d2h=torch.cuda.Stream(device))


def measure_pinned_h2d_gbps(rt: Runtime, nbytes: int = 256 * MIB, repeats: int = 5) -> float:
    """Pinned host->device copy GB/s on the side stream (median of ``repeats``), measured in the
    run itself so that a floor and the result it judges come from the same node and moment.
    NaN without CUDA (there is no link to measure)."""
    if not rt.is_cuda:
        return float("nan")
    return pinned_copy_gbps(rt.device, "h2d", nbytes, samples=repeats, stream=rt.side)
