"""core.stats (the one percentile, the units) and core.progress (the one progress bar)."""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest

from hopperlab.core.progress import progress_bar, track
from hopperlab.core.stats import GB, GIB, MIB, gbps, percentile


@pytest.mark.parametrize("q", [0, 1, 25, 50, 90, 99, 100])
def test_percentile_is_numpys_linear_method(q):
    values = [3.0, 1.0, 4.0, 1.5, 9.0, 2.6, 5.0]
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_percentile_edges():
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([5], 90) == 5
    assert percentile((x for x in [2.0, 1.0]), 100) == 2.0  # any iterable


def test_percentile_of_nothing_raises():
    """The one behaviour: no values is an error, never a NaN that travels into metrics."""
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)
    with pytest.raises(ValueError, match=r"\[0, 100\]"):
        percentile([1.0], 101)


def test_units_and_gbps():
    assert (MIB, GIB, GB) == (2**20, 2**30, 1e9)
    assert gbps(2e9, 0.5) == 4.0
    assert math.isnan(gbps(1, 0.0))


def test_track_yields_every_item_shown_or_not():
    items = list(range(7))
    assert list(track(items, "x")) == items
    assert list(track(items, "x", show=False)) == items
    for i in track(items, "early stop"):  # a caller may stop part-way
        if i == 2:
            break


def test_progress_bar_advances_from_threads():
    seen = []
    with progress_bar("bytes", 4 * MIB, unit="B") as advance:
        threads = [threading.Thread(target=advance, args=(MIB,)) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        seen.append(True)
    with progress_bar("off", None, show=False) as advance:
        advance(1)
    assert seen == [True]
