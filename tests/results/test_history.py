"""``hopperlab history`` (issue 29, part 3): change points by the noise test on synthetic series
(seeded: rates, not timings), and a metric over time read from a real MLflow server."""

from __future__ import annotations

import random

import pytest

from hopperlab.cli.main import main
from hopperlab.results.machines.history import change_points

from tests.helpers import copy_project, edit_yaml, hopperlab


def test_a_10_percent_step_is_found_where_it_is():
    rng = random.Random(3)
    hits = 0
    for _ in range(100):
        values = [100 * (1 + rng.gauss(0, 0.01)) for _ in range(10)] + \
                 [90 * (1 + rng.gauss(0, 0.01)) for _ in range(10)]
        found = change_points(values, "higher")
        hits += [c.index for c in found] == [10] and found[0].effect.verdict == "worse"
    assert hits >= 95


def test_a_flat_noisy_series_rarely_has_a_change_point():
    rng = random.Random(4)
    flagged = sum(bool(change_points([100 * (1 + rng.gauss(0, 0.02)) for _ in range(20)],
                                     "lower")) for _ in range(200))
    assert flagged <= 10


def test_too_short_a_series_has_none():
    assert change_points([1.0, 2.0, 1.0, 2.0, 1.0], "lower") == []


def test_runs_started_within_one_second_keep_their_order(tmp_path):
    """The history orders runs by start time: at whole seconds two runs of one second tied and
    came out either way round, which hid the change point of the MLflow test below (CI)."""
    import time

    from hopperlab.core.rundir import Recorder
    from hopperlab.results.tracking.layout import to_ms

    starts = []
    for i in range(3):
        record = Recorder(tmp_path / f"r{i}").finish("ok")
        starts.append(to_ms(record["started_at"]))
        time.sleep(0.003)
    assert starts == sorted(starts) and len(set(starts)) == 3


@pytest.mark.integration
@pytest.mark.mlflow_server
@pytest.mark.timeout(600)
def test_history_from_a_real_mlflow_server(tmp_path, mlflow_uri, capsys):
    from hopperlab.results import tracking

    project = copy_project(tmp_path / "proj")
    for i, steps in enumerate((10, 10, 10, 9, 9, 9)):        # the value drops 10 % at run 4
        def change(d, i=i, steps=steps):
            d["experiments"]["noise"]["scales"]["smoke"]["params"].update(
                seed=i, steps=steps, jitter=0.01)
            d["experiments"]["noise"]["repeats"] = 3
            # a variant of its own: the session's MLflow server holds other tests' noisy runs
            d["experiments"]["noise"]["variants"]["history-probe"] = {}
        edit_yaml(project / "experiments/selftest.yaml", change)
        out = hopperlab(["run", "selftest/noise/history-probe", "--no-upload", "--config",
                         "families=selftest"], project)
        assert out.returncode == 0, out.stderr
    report = tracking.sync(project / "results", mlflow_uri, progress=False)
    assert not report.failed
    code = main(["--root", str(project), "history", "--mlflow", mlflow_uri, "--run",
                 "selftest/noise/history-probe", "--out", str(tmp_path / "h")])
    out = capsys.readouterr().out
    assert code == 0
    assert "selftest/noise/history-probe value: 6 runs (first to last" in out
    assert "runs), 1 change point(s)" in out or "%), 1 change point(s)" in out
    assert "CHANGE worse at" in out
    page = (tmp_path / "h/history.html").read_text()
    assert "1 of 1 series with 6 or more runs changed" in page
    assert "data:image/png;base64," in page
    assert main(["--root", str(project), "history", "--mlflow", mlflow_uri, "--run",
                 "nope/none/x"]) == 2
