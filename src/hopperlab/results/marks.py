"""What a page must say beside a figure that is not what its name suggests (issue 28, item 13).

Three cases, read from the records (never guessed from names):
- a CPU stand-in: the run was ok but no GPU was measured (``*.stand_in``, ``*.gpu_measured:
  false``, ``*.target: cpu|host``): a variant named ``device``, ``gpu`` or ``h2d-pinned`` then
  measures the CPU code path, not what its name says;
- an example price: the site's ``cost: {example: true}`` (the local site's), tagged
  ``cost.example`` on the run: its costs show how pricing works, not what the run cost;
- a one-sample ratio: either side measured once (no ``<metric>_n`` of 2 or more from
  ``repeats``): a ratio within run-to-run noise (a neighbour's job can make it 1.6-3.4x on a
  shared CPU) is not a difference.
"""

from __future__ import annotations

from typing import Any

STAND_IN = "CPU stand-in"
EXAMPLE_PRICE = "example price"
ONE_SAMPLE = "1 sample"


def stand_in(run: Any) -> str | None:
    """Why an ok run's figures are a CPU stand-in's, or None when a GPU was measured (or the
    run did not end ok)."""
    if getattr(run, "status", None) != "ok":
        return None
    tags = getattr(run, "tags", None) or {}
    for key, value in tags.items():
        if key.endswith(".stand_in") and value:
            return str(value)
    gpu_off = any((k.endswith(".gpu_measured") and str(v).lower() == "false")
                  or (k.endswith(".target") and str(v).lower() in ("cpu", "host"))
                  for k, v in tags.items())
    if not gpu_off:
        return None
    why = next((str(v) for k, v in tags.items()
                if k.endswith((".no_gpu_reason", ".no_cuda_reason")) and v), None)
    return "no GPU was measured" + (f": {why}" if why else "")


def example_price(run: Any) -> bool:
    """The run's cost comes from an example price (the site says ``cost: {example: true}``)."""
    tags = getattr(run, "tags", None) or {}
    return str(tags.get("cost.example", "")).lower() == "true"


def samples(run: Any, metric: str) -> int:
    """How many samples a run's figure is the median of (1 without ``repeats``)."""
    metrics = getattr(run, "metrics", None) or {}
    n = metrics.get(f"{metric}_n")
    return int(n) if isinstance(n, (int, float)) and n >= 1 else 1


def one_sample(run: Any, other: Any, metric: str) -> bool:
    """A ratio of ``run`` to ``other`` on ``metric`` rests on a single sample of either."""
    return samples(run, metric) < 2 or (other is not None and samples(other, metric) < 2)
