"""Small statistics and the units every figure is written in, defined once.

Units: sizes in bytes, with MiB/GiB = 2**20/2**30 (what allocators and CUDA's bandwidthTest
count) and GB = 1e9 (what bandwidths are quoted in: GB/s = 1e9 bytes per second).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

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


# --------------------------------------------------------------------------- repeated samples
#: suffixes of the statistics recorded beside a repeated metric (``<metric>_ci_low`` ...)
STAT_SUFFIXES: tuple[str, ...] = ("_ci_low", "_ci_high", "_cv", "_n")
#: the confidence of every interval the platform reports
CONFIDENCE = 0.95


@dataclass(frozen=True)
class Summary:
    """Repeated samples of one figure: the median, an interval for it, the spread, the count.

    ``coverage`` is the interval's exact coverage: at least ``CONFIDENCE`` from 6 samples on;
    below 6 no order-statistic interval reaches 95 %, so the interval is the samples' range and
    ``coverage`` says how much less it covers (2 samples: 50 %, 5: 93.75 %). One sample has no
    interval and no spread (``cv`` is NaN, the interval is the value itself, coverage 0).
    """

    median: float
    ci_low: float
    ci_high: float
    cv: float
    n: int
    coverage: float

    @property
    def half_width(self) -> float:
        """Half the interval's width: what ``value ± half-width`` shows."""
        return (self.ci_high - self.ci_low) / 2


def _binom_cdf_half(k: int, n: int) -> float:
    """P(Binomial(n, 1/2) <= k), exactly (n is small: repeats, not steps)."""
    return sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n


def median_ci_ranks(n: int, confidence: float = CONFIDENCE) -> tuple[int, int, float]:
    """1-based ranks (lo, hi) of the exact distribution-free interval for the median of ``n``
    samples, and its coverage: the narrowest symmetric ``[x_(k), x_(n+1-k)]`` whose coverage
    ``1 - 2 P(B <= k-1)`` (B ~ Binomial(n, 1/2)) is at least ``confidence``; the whole range
    when even that falls short (fewer than 6 samples at 95 %)."""
    if n < 1:
        raise ValueError("an interval for the median needs at least one sample")
    best = (1, n, 1 - 2 * _binom_cdf_half(0, n)) if n > 1 else (1, 1, 0.0)
    for k in range(2, n // 2 + 1):
        coverage = 1 - 2 * _binom_cdf_half(k - 1, n)
        if coverage < confidence:
            break
        best = (k, n + 1 - k, coverage)
    return best


def check_samples(values: Sequence[float], what: str = "samples") -> list[float]:
    """``values`` as floats, refusing none and any NaN or infinity with a message that says so:
    one bad sample would otherwise move a median and an interval silently."""
    out = [float(v) for v in values]
    if not out:
        raise ValueError(f"{what}: no samples")
    bad = [i for i, v in enumerate(out) if not math.isfinite(v)]
    if bad:
        raise ValueError(f"{what}: sample(s) {bad} of {len(out)} are not finite "
                         f"({', '.join(repr(out[i]) for i in bad[:3])}): a median and an "
                         f"interval of them would mean nothing")
    return out


def summarize(values: Sequence[float], what: str = "samples") -> Summary:
    """Median, exact order-statistic 95 % interval of the median, CV (sample standard deviation
    over the mean) and count of ``values``. Deterministic: no resampling."""
    xs = sorted(check_samples(values, what))
    n = len(xs)
    median = percentile(xs, 50)
    lo, hi, coverage = median_ci_ranks(n)
    if n == 1:
        return Summary(median, xs[0], xs[0], math.nan, 1, 0.0)
    mean = sum(xs) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    cv = sd / abs(mean) if mean else math.nan
    return Summary(median, xs[lo - 1], xs[hi - 1], cv, n, coverage)


def robust_spread(values: Sequence[float], what: str = "samples") -> float:
    """The relative spread of one sample: 1.4826 x the median absolute deviation over the
    median (the standard deviation for normal noise, unmoved by one outlier), falling back to
    the CV when more than half the samples are equal. NaN for fewer than 2 samples."""
    xs = check_samples(values, what)
    if len(xs) < 2:
        return math.nan
    med = percentile(xs, 50)
    if med == 0:
        return math.nan
    mad = percentile([abs(x - med) for x in xs], 50)
    if mad > 0:
        return 1.4826 * mad / abs(med)
    return summarize(xs, what).cv


def median_se_factor(n: int) -> float:
    """How much wider the median of ``n`` normal samples scatters than one sample does, over
    1/sqrt(n): 1 for one or two samples (the median is the mean), sqrt(pi/2) from three on
    (the median's asymptotic efficiency)."""
    return 1.0 if n <= 2 else math.sqrt(math.pi / 2)


def aggregate_samples(samples: Sequence[dict[str, float]],
                      with_stats: Sequence[str]) -> dict[str, float]:
    """The final metrics of a run measured ``len(samples)`` times: each metric's median over
    the samples that have it, and for the metrics in ``with_stats`` (the headline and directed
    ones) ``<metric>_ci_low``, ``_ci_high``, ``_cv`` (from 2 samples) and ``_n``. Non-finite
    samples of a metric are left out of it, and ``_n`` says how many remain."""
    names: list[str] = []
    for sample in samples:
        names.extend(m for m in sample if m not in names)
    wanted = set(with_stats)
    out: dict[str, float] = {}
    for name in names:
        values = [float(s[name]) for s in samples
                  if name in s and math.isfinite(float(s[name]))]
        if not values:
            continue
        summary = summarize(values, name)
        out[name] = summary.median
        if name in wanted:
            out[f"{name}_ci_low"] = summary.ci_low
            out[f"{name}_ci_high"] = summary.ci_high
            if summary.n > 1 and math.isfinite(summary.cv):
                out[f"{name}_cv"] = summary.cv
            out[f"{name}_n"] = float(summary.n)
    return out


def half_width(metrics: Mapping[str, float], name: str) -> float | None:
    """Half the 95 % interval a repeated run recorded for ``name`` (None: measured once)."""
    lo, hi = metrics.get(f"{name}_ci_low"), metrics.get(f"{name}_ci_high")
    n = metrics.get(f"{name}_n", 1)
    if lo is None or hi is None or n < 2:
        return None
    return (hi - lo) / 2


def plus_minus(value: float, half: float | None, digits: int = 4) -> str:
    """``value ± half-width`` as the pages show it (the value alone without an interval)."""
    if half is None:
        return f"{value:.{digits}g}"
    return f"{value:.{digits}g} ± {half:.2g}"


#: currency codes written as their sign before the amount
CURRENCY_SIGNS = {"USD": "$", "EUR": "\u20ac", "GBP": "\u00a3"}


def money(value: float, currency: str | None) -> str:
    """An amount as people write it: two significant digits at least, never an exponent
    (``$0.000077``, ``$1.23``, ``12.50 CHF``)."""
    if not math.isfinite(value):
        return f"{value} {currency or ''}".strip()
    size = abs(value)
    decimals = 2 if size >= 1 or size == 0 else max(2, 1 - math.floor(math.log10(size)))
    text = f"{value:,.{decimals}f}"
    sign = CURRENCY_SIGNS.get((currency or "").upper())
    if sign:
        return f"-{sign}{text[1:]}" if text.startswith("-") else f"{sign}{text}"
    return f"{text} {currency}" if currency else text
