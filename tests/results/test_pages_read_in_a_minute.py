"""Pages a person reads in a minute (issue 49, item 7): history's y-axis spans at least the
noise band, compare's interval column is filled or absent, and machines.html on the shipped
fixtures folds its details below the lead (nothing lost)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from hopperlab.core import effects
from hopperlab.results.machines import ab_page
from hopperlab.results.machines.ab import Change
from hopperlab.results.machines.history import y_limits

FIX = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "machines"


def test_a_move_within_the_noise_does_not_fill_the_history_axis():
    lo, hi = y_limits([100.0, 100.1, 100.2], [None, None, None])
    # the band of the smallest change counted (5 % of the median) either side
    assert lo == pytest.approx(100.1 * (1 - effects.DEFAULT_MIN_EFFECT))
    assert hi == pytest.approx(100.1 * (1 + effects.DEFAULT_MIN_EFFECT))
    # a real move wider than the band: the axis is the data's, intervals included
    lo, hi = y_limits([50.0, 100.0, 150.0], [1.0, 2.0, 3.0])
    assert (lo, hi) == (49.0, 153.0)


def test_compares_interval_column_is_filled_or_absent():
    once = [Change("f/e/v", "m", "inconclusive", 1.0, 1.1, 1, 1)]
    assert "x0.5" not in ab_page._rows(once)
    effect = effects.compare(effects.Measure(1.1, 5, 0.01), effects.Measure(1.0, 5, 0.01),
                             direction="higher")
    repeated = [*once, Change("f/e/w", "m", "faster", 1.0, 1.1, 5, 5, effect)]
    table = ab_page._rows(repeated)
    assert "x0.5" in table and 'class="bar"' in table


def test_machines_html_keeps_every_table_in_a_fold(tmp_path):
    from hopperlab.results.machines import compare, runs

    folders = []
    for name in ("results-h200", "results-h100"):
        shutil.copytree(FIX / name, tmp_path / name)
        folders.append(tmp_path / name)
    groups = runs.load_folders(folders)
    _, page = compare.compare(groups, tmp_path / "out")
    text = page.read_text()
    lead, folded = text.split('<details class="fold">', 1)
    assert "What each technique buys and what it costs" in lead
    # every experiment's table is on the page, below the lead
    for g in groups:
        for key in g.runs:
            family, experiment, _ = key.split("/")
            assert f"<h2>{family} / {experiment}</h2>" in folded
    assert "<h2>Predictions</h2>" in folded
