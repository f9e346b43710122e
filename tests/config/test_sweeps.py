"""Sweeps (config/sweeps.py): axes crossed and zipped into points with stable names, points the
family refuses left out and named, ``only=`` selecting points, ``hopperlab list`` showing the
axes; growing an axis reruns nothing that ran (through Snakemake)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hopperlab.config import sweeps
from hopperlab.config.matrix import load_matrix
from hopperlab.core.errors import SpecError
from tests.helpers import copy_project, edit_yaml, snakemake

SOURCE = "experiments/selftest.yaml"


def _experiment(axes=None, zipped=None) -> dict:
    sweep = {}
    if axes:
        sweep["axes"] = axes
    if zipped:
        sweep["zip"] = zipped
    return {"baseline": "ok", "sweep": sweep,
            "scales": {"smoke": {"resources": {"time_min": 2}},
                       "full": {"resources": {"time_min": 2}}},
            "variants": {"ok": {}, "slow": {"params": {"action": "sleep", "sleep_s": 0.01}}}}


def test_two_axes_of_three_values_expand_to_their_points_and_name_the_refused():
    exp = _experiment({"steps": [1, 2, -1], "jitter": [0.0, 0.01, 0.02]})
    found = sweeps.expand("selftest", "grid", exp, "smoke", SOURCE)
    names = list(found.experiment["variants"])
    # 3 x 3 points x 2 variants; steps -1 is below the family's bound: refused, with why
    assert len(names) + len(found.refused) == 18
    assert len(found.refused) == 6
    assert all(r.variant.split(".")[1] == "steps-m1" for r in found.refused)
    assert all("steps" in r.why for r in found.refused)
    assert "ok.steps-2.jitter-0p01" in names and "slow.steps-1.jitter-0" in names
    assert found.axes == {"steps": [1, 2, -1], "jitter": [0.0, 0.01, 0.02]}
    # the baseline's first point is the experiment's baseline; each point is compared with
    # the baseline at the same point
    assert found.experiment["baseline"] == "ok.steps-1.jitter-0"
    slow = found.experiment["variants"]["slow.steps-2.jitter-0p02"]
    assert slow["compare_to"] == "ok.steps-2.jitter-0p02"
    assert slow["scales"]["smoke"]["params"] == {"steps": 2, "jitter": 0.02}


def test_growing_an_axis_keeps_every_earlier_name():
    small = sweeps.expand("selftest", "grid", _experiment({"steps": [1, 2], "jitter": [0.0]}),
                          "smoke", SOURCE)
    grown = sweeps.expand("selftest", "grid",
                          _experiment({"steps": [1, 2, 3], "jitter": [0.0]}), "smoke", SOURCE)
    assert set(small.experiment["variants"]) < set(grown.experiment["variants"])
    for name, var in small.experiment["variants"].items():
        assert grown.experiment["variants"][name] == var


def test_zip_moves_axes_together_and_needs_equal_lengths():
    found = sweeps.expand("selftest", "grid",
                          _experiment({"jitter": [0.0, 0.01]},
                                      {"steps": [1, 2, 3], "sleep_s": [0.0, 0.1, 0.2]}),
                          "smoke", SOURCE)
    ok = [n for n in found.experiment["variants"] if n.startswith("ok.")]
    assert len(ok) == 2 * 3 and "ok.jitter-0p01.steps-3.sleep_s-0p2" in ok
    with pytest.raises(SpecError, match=r"selftest.yaml: experiments.grid.sweep.zip: .*equal"):
        sweeps.expand("selftest", "grid", _experiment(None, {"steps": [1, 2], "jitter": [0.0]}),
                      "smoke", SOURCE)


def test_an_axis_the_family_does_not_have_is_a_one_line_error():
    with pytest.raises(SpecError, match=r"experiments.grid.sweep: 'nope' is neither a knob"):
        sweeps.expand("selftest", "grid", _experiment({"nope": [1]}), "smoke", SOURCE)


def _add_sweep(project: Path, axes: dict) -> None:
    def change(data):
        data["experiments"]["grid"] = _experiment(axes)
    edit_yaml(project / "experiments" / "selftest.yaml", change)


def test_only_selects_points_and_list_shows_axes_and_refused(tmp_path, capsys):
    from hopperlab.cli.main import main

    project = copy_project(tmp_path / "p")
    _add_sweep(project, {"steps": [1, 2, -1], "jitter": [0.0, 0.01, 0.02]})
    matrix = load_matrix(project, {"families": ["selftest"], "only": ["selftest/grid"]})
    assert len(matrix.runs) == 12
    one = "selftest/grid/slow.steps-2.jitter-0p01"
    matrix = load_matrix(project, {"families": ["selftest"], "only": [one]})
    assert list(matrix.runs) == [one]
    spec = matrix.runs[one]
    assert spec.params.steps == 2 and spec.params.jitter == 0.01
    assert spec.compare_to == "ok.steps-2.jitter-0p01"
    assert main(["--root", str(project), "list", "--config", "families=selftest",
                 "only=selftest/grid"]) == 0
    out = capsys.readouterr().out
    assert "sweep selftest/grid: steps [1, 2, -1] x jitter [0.0, 0.01, 0.02]; 12 points run, " \
           "6 refused" in out
    assert "refused selftest/grid/ok.steps-m1.jitter-0: " in out


def _records(project: Path) -> dict[str, str]:
    out = {}
    for rec in (project / "results" / "selftest" / "grid").glob("*/record.json"):
        out[rec.parent.name] = json.loads(rec.read_text())["run_uid"]
    return out


@pytest.mark.integration  # runs Snakemake and jobs
@pytest.mark.timeout(900)
def test_growing_an_axis_through_snakemake_reruns_nothing(tmp_path):
    project = copy_project(tmp_path / "p")
    _add_sweep(project, {"steps": [1, 2], "jitter": [0.0]})
    args = ["--cores", "2", "--config", "families=selftest", "only=selftest/grid"]
    first = snakemake(args, project)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    before = _records(project)
    assert len(before) == 4
    _add_sweep(project, {"steps": [1, 2], "jitter": [0.0, 0.01]})
    plan = snakemake([*args, "-n"], project)
    assert plan.returncode == 0
    second = snakemake(args, project)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    after = _records(project)
    assert len(after) == 8
    assert {k: after[k] for k in before} == before  # no earlier point ran again
    new = set(after) - set(before)
    assert new == {"ok.steps-1.jitter-0p01", "ok.steps-2.jitter-0p01",
                   "slow.steps-1.jitter-0p01", "slow.steps-2.jitter-0p01"}


def test_a_points_axes_go_to_mlflow_as_params():
    from hopperlab.results.tracking.upload import axis_params

    flat = {"params.steps": "2", "params.jitter": "0.01", "knobs.profiler": "none"}
    assert axis_params("slow.steps-2.jitter-0p01", flat) == {
        "axis.technique": "slow", "axis.steps": "2", "axis.jitter": "0.01"}
    assert axis_params("ok", flat) == {}
