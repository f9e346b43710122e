"""Which finished runs ``hopperlab submit`` adopts instead of redoing, and which runs the
workflow was told to redo (no jobs run here: the run directories are written by hand)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from hopperlab.cli.workflow import forced_run_keys
from hopperlab.config.matrix import load_matrix
from hopperlab.config.spec import spec_data_fingerprint
from hopperlab.core import rundir as record
from hopperlab.run.submit import FORCED_ENV, adoptable_record, forced_by_workflow
from tests.helpers import copy_project, edit_yaml

CONFIG = {"families": ["selftest"], "only": ["selftest/faults/ok", "selftest/assets/table"]}


@pytest.fixture
def project(tmp_path):
    return copy_project(tmp_path / "project")


def _finished(matrix, key: str, status: str = "ok", ended: bool = True) -> Path:
    """A run directory as `hopperlab submit` leaves it after attempt 1."""
    spec = matrix.get(key)
    run_dir = matrix.root / spec.run_dir
    record.write_json_atomic(run_dir / record.SPEC_FILE, {**spec.to_dict(), "attempt": 1})
    record.write_record(run_dir, {"key": key, "attempt": 1, "status": status, "reason": None,
                                  "metrics": {}})
    lines = [{"attempt": 1, "event": "start"}] + ([{"attempt": 1, "event": "end"}] if ended
                                                  else [])
    (run_dir / record.HISTORY_FILE).write_text("".join(json.dumps(x) + "\n" for x in lines))
    return run_dir


def test_a_complete_record_of_the_same_spec_is_adopted(project):
    matrix = load_matrix(project, CONFIG)
    run_dir = _finished(matrix, "selftest/faults/ok")
    rec = adoptable_record(matrix, matrix.get("selftest/faults/ok"), run_dir)
    assert rec is not None and rec["status"] == "ok"


@pytest.mark.parametrize("status", ["failed", "timeout"])
def test_a_failed_run_is_never_adopted_and_leaves_no_snakemake_output(project, status):
    matrix = load_matrix(project, CONFIG)
    run_dir = _finished(matrix, "selftest/faults/ok", status=status)
    assert not (run_dir / record.METRICS_FILE).exists()  # Snakemake can never take it as done
    assert adoptable_record(matrix, matrix.get("selftest/faults/ok"), run_dir) is None


def test_an_ok_record_whose_submitter_never_ended_it_is_adopted(project):
    """Issue 28 item 3: Ctrl-C to the process group can stop `hopperlab submit` after its job
    wrote its `ok` record and before the history's `end` line: that run is finished."""
    matrix = load_matrix(project, CONFIG)
    run_dir = _finished(matrix, "selftest/faults/ok", ended=False)
    rec = adoptable_record(matrix, matrix.get("selftest/faults/ok"), run_dir)
    assert rec is not None and rec["status"] == "ok"


def _second_attempt(run_dir, spec) -> None:
    """Attempt 1's files archived under attempts/1 and attempt 2's spec written, as a resubmit
    leaves them before attempt 2 runs."""
    (run_dir / "attempts/1").mkdir(parents=True)
    for name in ("spec.json", "record.json", "metrics.json"):
        (run_dir / name).rename(run_dir / "attempts/1" / name)
    record.write_json_atomic(run_dir / record.SPEC_FILE, {**spec.to_dict(), "attempt": 2})


def test_an_attempt_without_record_or_end_is_passed_over_for_the_finished_one(project):
    """Issue 28 items 1 and 2: a killed `hopperlab run` (or a submission that never reached
    the scheduler) leaves attempt 2 with a spec and no outcome; attempt 1 finished ok."""
    matrix = load_matrix(project, CONFIG)
    spec = matrix.get("selftest/faults/ok")
    run_dir = _finished(matrix, spec.key)
    _second_attempt(run_dir, spec)
    (run_dir / "steps.jsonl").write_text('{"step": 0')  # torn by the kill
    with open(run_dir / record.HISTORY_FILE, "a") as fh:
        fh.write(json.dumps({"attempt": 2, "event": "start"}) + "\n")
    rec = adoptable_record(matrix, spec, run_dir)
    assert rec is not None and rec["attempt"] == 1


def test_a_later_failed_attempt_is_retried_not_covered_by_an_older_success(project):
    matrix = load_matrix(project, CONFIG)
    spec = matrix.get("selftest/faults/ok")
    run_dir = _finished(matrix, spec.key)
    _second_attempt(run_dir, spec)
    record.write_record(run_dir, {"key": spec.key, "attempt": 2, "status": "failed"})
    assert adoptable_record(matrix, spec, run_dir) is None


@pytest.mark.parametrize("bad", ["[1, 2]", "null", "\"text\"", "{torn"])
def test_a_wrong_typed_spec_or_record_never_crashes_adoption(project, bad):
    """Issue 28 item 10: such a file made every `hopperlab submit` crash until removed."""
    matrix = load_matrix(project, CONFIG)
    spec = matrix.get("selftest/faults/ok")
    for name in (record.SPEC_FILE, record.RECORD_FILE):
        run_dir = _finished(matrix, spec.key)
        (run_dir / name).write_text(bad)
        assert adoptable_record(matrix, spec, run_dir) is None


def test_a_changed_spec_is_not_adopted(project):
    matrix = load_matrix(project, CONFIG)
    run_dir = _finished(matrix, "selftest/faults/ok")
    edit_yaml(project / "experiments/selftest.yaml", lambda d: d["experiments"]["faults"][
        "variants"]["ok"]["params"].update(steps=7))
    changed = load_matrix(project, CONFIG)
    assert adoptable_record(changed, changed.get("selftest/faults/ok"), run_dir) is None


def test_a_run_older_than_its_rebuilt_asset_is_not_adopted(project):
    matrix = load_matrix(project, CONFIG)
    spec = matrix.get("selftest/assets/table")
    run_dir = _finished(matrix, spec.key)
    manifest = Path(spec.site.assets_dir) / spec.assets["table"] / "MANIFEST.sha256"
    manifest.parent.mkdir(parents=True)
    manifest.write_text("")
    done = (run_dir / record.RECORD_FILE).stat().st_mtime
    os.utime(manifest, (done - 60, done - 60))
    assert adoptable_record(matrix, spec, run_dir) is not None
    os.utime(manifest, (done + 60, done + 60))  # rebuilt after the run
    assert adoptable_record(matrix, spec, run_dir) is None


def test_forced_runs_follow_forcerun_force_and_forceall(project, monkeypatch):
    monkeypatch.chdir(project)
    matrix = load_matrix(project, CONFIG)
    target = "results/selftest/faults/ok/metrics.json"

    def settings(**kw):
        return SimpleNamespace(**{"forceall": False, "forcerun": frozenset(),
                                  "forcetargets": False, "targets": frozenset(), **kw})

    assert forced_run_keys(matrix, None) == []
    assert forced_run_keys(matrix, settings()) == []
    assert forced_run_keys(matrix, settings(forcerun={target})) == ["selftest/faults/ok"]
    assert forced_run_keys(matrix, settings(forcerun={str(project / target)})) == [
        "selftest/faults/ok"]
    assert forced_run_keys(matrix, settings(targets={target})) == []  # a target, not forced
    assert forced_run_keys(matrix, settings(targets={target}, forcetargets=True)) == [
        "selftest/faults/ok"]
    assert forced_run_keys(matrix, settings(forcerun={"run"})) == ["*"]
    assert forced_run_keys(matrix, settings(forcerun={"report"})) == []
    assert forced_run_keys(matrix, settings(forceall=True)) == ["*"]

    monkeypatch.setenv(FORCED_ENV, "selftest/faults/ok")
    assert forced_by_workflow("selftest/faults/ok")
    assert not forced_by_workflow("selftest/assets/table")
    monkeypatch.setenv(FORCED_ENV, "*")
    assert forced_by_workflow("selftest/assets/table")
    monkeypatch.delenv(FORCED_ENV)
    assert not forced_by_workflow("selftest/faults/ok")


def _fingerprints(project, config=CONFIG):
    matrix = load_matrix(project, config)
    return {key: spec_data_fingerprint(spec.to_dict()) for key, spec in matrix.runs.items()}


def test_what_does_not_change_a_result_does_not_change_the_fingerprint(tmp_path):
    """Issue 28 item 5: the polling interval, the price, the tracking URI or a moved checkout
    planned every finished run again (and a second MLflow run of each)."""
    first = copy_project(tmp_path / "first")
    before = _fingerprints(first)
    moved = copy_project(tmp_path / "elsewhere" / "moved")
    assert _fingerprints(moved) == before

    def site(d):
        d.update(poll_interval_s=7, cost={"per_node_hour": 9.5, "currency": "EUR"},
                 tracking={"uri": "http://user:pw@mlflow.example.org:5000", "upload": "each"},
                 description="another words")
    edit_yaml(moved / "configs/sites/local.yaml", site)
    assert _fingerprints(moved) == before


@pytest.mark.parametrize("change", [
    lambda d: d.update(env={"OMP_NUM_THREADS": "1"}),
    lambda d: d.update(executor="slurm", slurm={"partition": "other"}),
])
def test_what_changes_a_result_changes_the_fingerprint(tmp_path, change):
    project = copy_project(tmp_path / "project")
    before = _fingerprints(project)
    edit_yaml(project / "configs/sites/local.yaml", change)
    after = _fingerprints(project)
    assert all(after[k] != before[k] for k in before)


def test_a_finished_run_is_adopted_in_a_moved_checkout(tmp_path):
    first = copy_project(tmp_path / "first")
    matrix = load_matrix(first, CONFIG)
    run_dir = _finished(matrix, "selftest/faults/ok")
    moved = copy_project(tmp_path / "elsewhere" / "moved")
    shutil.copytree(first / "results", moved / "results")
    moved_matrix = load_matrix(moved, CONFIG)
    spec = moved_matrix.get("selftest/faults/ok")
    assert run_dir != moved / spec.run_dir
    assert adoptable_record(moved_matrix, spec, moved / spec.run_dir) is not None
