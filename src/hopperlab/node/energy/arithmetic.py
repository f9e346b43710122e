"""Joules from counter readings and power samples: wrap-around, stuck counters, the trace.

Pure (no sensors): the meter feeds it what it read, the tests feed it recorded traces. A figure
that cannot be had is ``None`` with the reason, never 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

#: NVML's total-energy counter is an unsigned 64-bit count of millijoules
NVML_WRAP_MJ = 2**64
#: the counter updates every 20-100 ms (published; docs/benchmarks/energy.md): a window shorter
#: than this may legitimately see it not move
COUNTER_UPDATE_S = 0.1
#: windows at least this long are where the counter and the integrated trace must agree
AGREEMENT_MIN_S = 2.0
#: a counter step this many times the trace's energy (plus a margin) is a reset, not energy
IMPLAUSIBLE_RATIO = 3.0


def counter_delta(start: float | None, end: float | None, wrap: float | None) -> float | None:
    """``end - start`` of a counter that wraps to 0 after ``wrap`` (None: cannot say).

    A decrease is one wrap when ``wrap`` is known; without it a decrease is no figure."""
    if start is None or end is None:
        return None
    delta = end - start
    if delta < 0:
        if not wrap:
            return None
        delta += wrap
    return delta


class Accumulator:
    """A wrapping counter read often enough to see every wrap: the sum of its steps.

    RAPL's package counter wraps after ``max_energy_range_uj`` (minutes at full power), so one
    start/end difference cannot tell one wrap from two; the sampler feeds every reading."""

    def __init__(self, wrap: float | None) -> None:
        self.wrap = wrap
        self.total = 0.0
        self.last: float | None = None
        self.lost = 0  # steps that could not be counted (a decrease without a known wrap)

    def feed(self, raw: float | None) -> float:
        if raw is None:
            return self.total
        if self.last is not None:
            step = counter_delta(self.last, raw, self.wrap)
            if step is None:
                self.lost += 1
            else:
                self.total += step
        self.last = raw
        return self.total


def integrate(samples: Sequence[tuple[float, float | None]], t0: float, t1: float) -> float | None:
    """Joules of power samples ``(t, watts)`` over ``[t0, t1]``: trapezoids, the edges
    interpolated (held flat beyond the first and last sample). None: fewer than two samples
    fall within reach of the window, or it has no length."""
    pts = [(t, w) for t, w in samples if w is not None]
    if t1 <= t0 or len(pts) < 2:
        return None
    pts.sort()
    inside = [p for p in pts if t0 < p[0] < t1]
    before = [p for p in pts if p[0] <= t0]
    after = [p for p in pts if p[0] >= t1]
    if len(inside) + bool(before) + bool(after) < 2:
        return None

    def at(t: float) -> float:
        lo = max((p for p in pts if p[0] <= t), default=None)
        hi = min((p for p in pts if p[0] >= t), default=None)
        if lo is None:
            return hi[1]  # type: ignore[index]
        if hi is None or hi[0] == lo[0]:
            return lo[1]
        return lo[1] + (hi[1] - lo[1]) * (t - lo[0]) / (hi[0] - lo[0])

    edge = [(t0, at(t0)), *inside, (t1, at(t1))]
    return sum((b[0] - a[0]) * (a[1] + b[1]) / 2 for a, b in zip(edge, edge[1:]))


def power_stats(samples: Sequence[tuple[float, float | None]], t0: float, t1: float
                ) -> tuple[float | None, float | None]:
    """Mean (the integral over the length) and peak power of the samples in ``[t0, t1]``."""
    joules = integrate(samples, t0, t1)
    inside = [w for t, w in samples if w is not None and t0 <= t <= t1]
    mean = joules / (t1 - t0) if joules is not None else None
    return mean, (max(inside) if inside else None)


@dataclass(frozen=True)
class Energy:
    """One device's energy over a window: the figure, where it came from, and why not."""

    joules: float | None
    source: str  # counter | trace | not measured
    note: str | None = None


def window_energy(counter_j: float | None, trace_j: float | None, seconds: float,
                  counter_reason: str | None = None) -> Energy:
    """The window's energy: the counter, else the integrated trace, with the reason.

    The counter is trusted unless it did not move while the trace shows power (a stuck
    counter, or a window shorter than its update period), or it jumped far beyond what the
    trace allows (a driver reload reset it)."""
    if counter_j is None:
        why = counter_reason or "no energy counter"
        if trace_j is not None:
            return Energy(trace_j, "trace", f"{why}: integrated power trace")
        return Energy(None, "not measured", f"{why}, and no power trace")
    if counter_j == 0:
        why = ("the window is shorter than the counter's update period"
               if seconds < COUNTER_UPDATE_S else "the energy counter did not move")
        if trace_j:
            return Energy(trace_j, "trace", f"{why}: integrated power trace")
        return Energy(None, "not measured", f"{why}, and no power trace")
    if trace_j is not None and counter_j > IMPLAUSIBLE_RATIO * trace_j + 1.0:
        return Energy(trace_j, "trace", f"the counter moved {counter_j:.4g} J against "
                                        f"{trace_j:.4g} J of traced power (reset?): trace used")
    return Energy(counter_j, "counter")
