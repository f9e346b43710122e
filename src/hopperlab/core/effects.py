"""Is a figure different from another, beyond its noise? One stated test, used by ``check``
(a run against its reference) and ``compare`` (two results folders).

The test (docs/benchmarks/noise.md): the change is the ratio of the two medians, taken on the
log scale, where a relative spread is a standard deviation. Its 95 % interval is
``log(new/old) ± z * s * sqrt(f(m)^2/m + f(n)^2/n)`` with ``s`` the relative spread of one
sample (a reference's measured one, or the larger of the two sides' own from 3 samples on),
``m`` and ``n`` the sample counts, ``f`` the median's efficiency factor
(``core.stats.median_se_factor``) and ``z`` Student's t quantile for the degrees of freedom the
spread was estimated with (0.37 per sample for a median absolute deviation). The change counts
only when the interval excludes no change *and* the change is at least the minimum effect worth
reporting: a regression must be both real and big enough to matter. A change at least that
big whose interval still includes no change is ``inconclusive`` (repeat to tell); a smaller one
is ``same``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Mapping, Sequence

from hopperlab.core.stats import (
    CONFIDENCE,
    check_samples,
    median_se_factor,
    percentile,
    robust_spread,
)

#: what a change is, whichever side is better
WORSE, BETTER, SAME, UNCLEAR = "worse", "better", "same", "unclear"
#: a change smaller than this is not worth reporting unless a reference says otherwise
DEFAULT_MIN_EFFECT = 0.05
#: samples from which a side's own spread is trusted (robust_spread of fewer is too rough)
OWN_SPREAD_FROM = 3
#: a reference's minimum effect is at least NOISE_K x its measured noise (issue 36). A check
#: judges one new sample per metric; under normal noise one sample lies beyond 3 sigma the
#: worse way in 0.13 % of checks, so a check of 10 judged metrics cries wolf in about 1.3 % of
#: healthy checks before the significance test is even asked (k = 2: 2.3 % a metric, 20 % a
#: check). A 10 % slowdown stays detectable for every metric whose noise is below about 2.5 %.
NOISE_K = 3.0
#: the largest minimum effect written (a reference's min_effect is a fraction below 1)
MAX_MIN_EFFECT = 0.9


#: degrees of freedom per sample of a spread from the median absolute deviation (its
#: efficiency against the standard deviation for normal noise, 37 %)
MAD_EFFICIENCY = 0.37


def z_for(confidence: float = CONFIDENCE) -> float:
    """The two-sided normal quantile of ``confidence`` (1.96 at 95 %)."""
    return NormalDist().inv_cdf(0.5 + confidence / 2)


def t_for(confidence: float, df: float) -> float:
    """The two-sided Student t quantile (Cornish-Fisher expansion, within 3 % from 2 degrees
    of freedom): a spread estimated from few samples widens the interval, so that an
    underestimated spread does not raise false alarms."""
    z = z_for(confidence)
    df = max(df, 1.0)
    return (z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)
            + (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / (384 * df ** 3))


@dataclass(frozen=True)
class Effect:
    """The change from ``old`` to ``new`` of one figure."""

    ratio: float            # new median / old median
    ratio_low: float        # its interval
    ratio_high: float
    #: the change the worse way, as a fraction (0.10: 10 % slower or 10 % less throughput);
    #: for a metric without a direction, the size of the change either way
    worse_by: float
    verdict: str            # WORSE | BETTER | SAME | UNCLEAR
    spread: float           # the relative spread of one sample the test used
    detail: str

    @property
    def half_width(self) -> float:
        return (self.ratio_high - self.ratio_low) / 2


@dataclass(frozen=True)
class Measure:
    """One side of a comparison: the median of ``n`` samples and the relative spread of one
    sample (None: unknown, e.g. fewer than 3 samples)."""

    median: float
    n: int
    spread: float | None = None

    @classmethod
    def of(cls, samples: Sequence[float], what: str = "samples") -> "Measure":
        xs = check_samples(samples, what)
        return cls(percentile(xs, 50), len(xs), _side_spread(xs))


def measure_from(metrics: Mapping[str, float], samples: Sequence[Mapping[str, float]],
                 metric: str) -> Measure | None:
    """A run's measure of ``metric``: from its samples (``samples.jsonl``), else its metrics
    (the median, with the ``_cv`` and ``_n`` a repeated run records: what MLflow holds);
    None: the run has no finite figure."""
    values = [float(s[metric]) for s in samples if metric in s]
    if values:
        return Measure.of(values, metric)
    value = metrics.get(metric)
    if value is None or not math.isfinite(value):
        return None
    n = int(metrics.get(f"{metric}_n", 1))
    cv = metrics.get(f"{metric}_cv")
    spread = cv if cv is not None and n >= OWN_SPREAD_FROM else None
    return Measure(value, n, spread)


def noise_of(samples: Sequence[float]) -> float:
    """A figure's noise, relative: the larger of the robust spread (the bulk) and the standard
    deviation of the log samples (which sees regimes the median absolute deviation hides: the
    recommender's latency jumping between 0.82 and 1.17 ms in one run)."""
    xs = check_samples(samples, "samples")
    if len(xs) < 2 or min(xs) <= 0:
        return math.nan
    logs = [math.log(x) for x in xs]
    mean = sum(logs) / len(logs)
    sd = math.sqrt(sum((v - mean) ** 2 for v in logs) / (len(logs) - 1))
    robust = robust_spread(xs)
    return max(sd, robust if math.isfinite(robust) else 0.0)


def widest_deviation(samples: Sequence[float]) -> float:
    """How far the reference's own farthest sample lies from its median, relative, either way
    (the larger of max/median - 1 and median/min - 1; NaN for fewer than 2 samples).

    Distribution-free: a new sample of the same noise lies beyond the farthest of ``n`` in at
    most 2/(n+1) of draws whatever the noise's shape, where ``NOISE_K`` x noise holds only for
    noise near normal. A change no bigger than a healthy sample already showed is no evidence."""
    xs = check_samples(samples, "samples")
    if len(xs) < 2 or min(xs) <= 0:
        return math.nan
    med = percentile(xs, 50)
    return max(max(xs) / med, med / min(xs)) - 1


def min_effect_for(samples: Sequence[float], floor: float = DEFAULT_MIN_EFFECT) -> float:
    """The minimum effect a reference from ``samples`` judges by: the larger of ``NOISE_K`` x
    their noise (normal noise) and their widest deviation (any noise: regimes, a long tail;
    ``widest_deviation``), never below ``floor`` (the change worth reporting) nor above
    ``MAX_MIN_EFFECT``. A healthy check fails only when both rules call the change real."""
    noise, wide = noise_of(samples), widest_deviation(samples)
    if not (math.isfinite(noise) and math.isfinite(wide)):
        return MAX_MIN_EFFECT
    return min(MAX_MIN_EFFECT, max(floor, NOISE_K * noise, wide))


def _side_spread(samples: Sequence[float]) -> float | None:
    if len(samples) < OWN_SPREAD_FROM:
        return None
    s = robust_spread(samples)
    return s if math.isfinite(s) else None


def change(new: Sequence[float], old: Sequence[float] | float, *, direction: str | None,
           min_effect: float = DEFAULT_MIN_EFFECT, old_spread: float | None = None,
           old_n: int | None = None, confidence: float = CONFIDENCE) -> Effect:
    """The change of a figure from ``old`` (samples, or a reference value with its
    ``old_spread`` and ``old_n``) to ``new`` (samples), judged by the module's test.

    ``direction``: ``higher`` or ``lower`` is better; None judges a change either way as worse
    (a check must not guess which way is good). Raises ValueError on a NaN, no samples, a
    non-positive median, or when no spread is known at all (one sample each side and no
    reference spread): the message says what to do.
    """
    if isinstance(old, (int, float)):
        check_samples([float(old)], "reference value")
        before = Measure(float(old), int(old_n or 1), old_spread)
    else:
        before = Measure.of(old, "old samples")
        if old_spread is not None:
            before = Measure(before.median, before.n, max(old_spread, before.spread or 0.0))
    return compare(Measure.of(new, "new samples"), before, direction=direction,
                   min_effect=min_effect, confidence=confidence)


def compare(new: Measure, old: Measure, *, direction: str | None,
            min_effect: float = DEFAULT_MIN_EFFECT, confidence: float = CONFIDENCE) -> Effect:
    """The module's test on two measures (their medians, counts and spreads)."""
    if not 0 <= min_effect < 1:
        raise ValueError(f"min_effect must be a fraction in [0, 1), got {min_effect!r}")
    m, n = new.n, old.n
    new_med, old_med = new.median, old.median
    if not (math.isfinite(new_med) and math.isfinite(old_med)):
        raise ValueError(f"medians must be finite (new {new_med!r}, old {old_med!r})")
    if new_med <= 0 or old_med <= 0:
        raise ValueError(f"medians must be positive for a ratio (new {new_med:g}, old "
                         f"{old_med:g})")
    # (spread, the samples it was estimated from)
    spreads = [(s, k) for s, k in ((old.spread, n), (new.spread, m))
               if s is not None and math.isfinite(s)]
    if not spreads:
        raise ValueError(f"no spread known: {m} new and {n} old sample(s) and no reference "
                         f"spread; measure with repeats (3 or more samples) to judge noise")
    s, k = max(spreads)
    se = s * math.sqrt(median_se_factor(m) ** 2 / m + median_se_factor(n) ** 2 / n)
    z = t_for(confidence, MAD_EFFICIENCY * (k - 1))
    log_ratio = math.log(new_med / old_med)
    lo, hi = log_ratio - z * se, log_ratio + z * se
    sign = {"lower": 1.0, "higher": -1.0}.get(direction or "", 0.0)
    threshold = math.log1p(min_effect)
    if sign:
        worse, worse_lo, worse_hi = sign * log_ratio, min(sign * lo, sign * hi), \
            max(sign * lo, sign * hi)
        if worse_lo > 0 and worse >= threshold:
            verdict = WORSE
        elif worse_hi < 0 and -worse >= threshold:
            verdict = BETTER
        elif abs(worse) >= threshold:
            verdict = UNCLEAR
        else:
            verdict = SAME
    else:
        worse = abs(log_ratio)
        significant = lo > 0 or hi < 0
        verdict = (WORSE if significant else UNCLEAR) if worse >= threshold else SAME
    worse_by = math.expm1(worse)
    detail = (f"{new_med:.4g} vs {old_med:.4g}: x{math.exp(log_ratio):.3f} "
              f"[{math.exp(lo):.3f}, {math.exp(hi):.3f}] ({confidence:.0%}; {m} vs {n} "
              f"sample(s), spread {s:.2%}, min effect {min_effect:.0%})")
    return Effect(math.exp(log_ratio), math.exp(lo), math.exp(hi), worse_by, verdict, s, detail)
