"""Small statistics and the units every figure is written in, defined once.

Units: sizes in bytes, with MiB/GiB = 2**20/2**30 (what allocators and CUDA's bandwidthTest
count) and GB = 1e9 (what bandwidths are quoted in: GB/s = 1e9 bytes per second).
"""

from __future__ import annotations

import math
from typing import Sequence

KIB = 1 << 10
MIB = 1 << 20
GIB = 1 << 30
GB = 1e9


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (``q`` in [0, 100]) by linear interpolation between the closest
    ranks (numpy's default method).

    No values raise ``ValueError``: a percentile of nothing is not a figure, and a NaN would
    travel silently into metrics and comparisons. A caller that can legitimately have no
    samples says what it records instead (e.g. no metric), before it asks.
    """
    if not 0 <= q <= 100:
        raise ValueError(f"percentile: q must be in [0, 100], got {q}")
    xs = sorted(values)
    if not xs:
        raise ValueError("percentile of no values")
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def gbps(nbytes: float, seconds: float) -> float:
    """Bandwidth in GB/s (GB = 1e9 bytes); NaN when no time was measured (``seconds`` <= 0)."""
    return nbytes / seconds / GB if seconds > 0 else math.nan
