"""``processes=N`` (run/processes.py): the key resolved from the config and refused when bad, and
the run's record made from its processes' records: one entry each (status, node, job, median),
the metrics the median of the medians, every window in samples.jsonl with its process, and a
failing or missing process failing the run with its reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hopperlab.config.matrix import load_matrix
from hopperlab.core.errors import SpecError
from hopperlab.core.rundir import read_process_samples
from hopperlab.run import processes

from tests.helpers import REPO
from tests.results.run_dirs import KEY, write_run


def _spec(n: int):
    return load_matrix(REPO, {"families": ["selftest"], "only": [KEY],
                              "processes": n}).runs[KEY]


def _folders(run_dir: Path, runs: list[tuple[list[float], dict]]) -> list[Path]:
    """``processes/<i>/`` of ``run_dir``, one run directory per (windows, record changes)."""
    out = []
    for i, (windows, changes) in enumerate(runs):
        folder = write_run(run_dir / "processes", key=f"p/p/{i}", samples=windows,
                           record={"hardware": {"hostname": f"node-{i}"},
                                   "slurm": {"job_id": str(100 + i)}, **changes})
        out.append(folder)
    return out


def test_processes_are_resolved_from_the_config_and_bad_values_refused():
    assert _spec(3).processes == 3 and _spec(3).to_dict()["processes"] == 3
    plain = load_matrix(REPO, {"families": ["selftest"], "only": [KEY]}).runs[KEY]
    assert plain.processes == 1 and "processes" not in plain.to_dict()  # fingerprint kept
    for bad in ("0", "two", "2.5"):
        with pytest.raises(SpecError, match="processes"):
            _spec(bad)
    sub = processes.process_spec(_spec(3), 2)
    assert sub.processes == 1 and sub.run_dir.endswith("noisy/processes/2")


def test_the_record_holds_each_process_and_the_median_of_their_medians(tmp_path):
    run_dir = tmp_path / KEY
    folders = _folders(run_dir, [([10.0, 10.2], {}), ([12.0, 12.2], {}), ([8.0, 8.2], {})])
    rec = processes.merged_record(_spec(3), folders, attempt=1, uid="u1")
    assert rec["status"] == "ok" and rec["run_uid"] == "u1"
    assert [(p["process"], p["node"], p["job_id"], p["windows"]) for p in rec["processes"]] == [
        (0, "node-0", "100", 2), (1, "node-1", "101", 2), (2, "node-2", "102", 2)]
    assert [p["metrics"]["value"] for p in rec["processes"]] == [10.1, 12.1, 8.1]
    assert rec["metrics"]["value"] == 10.1 and rec["metrics"]["value_n"] == 3
    assert rec["tags"]["process_nodes"] == "node-0,node-1,node-2"
    run_dir.mkdir(parents=True, exist_ok=True)
    processes.write_samples(run_dir, folders)
    lines = [json.loads(x) for x in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert [(x["process"], x["metrics"]["value"]) for x in lines] == [
        (0, 10.0), (0, 10.2), (1, 12.0), (1, 12.2), (2, 8.0), (2, 8.2)]
    assert [len(g) for g in read_process_samples(run_dir)] == [2, 2, 2]


def test_a_failing_or_missing_process_fails_the_run_naming_it(tmp_path):
    spec = _spec(3)
    folders = _folders(tmp_path / "a", [([10.0], {}), ([10.0], {"status": "failed",
                                                                 "reason": "ValueError: x"}),
                                        ([10.0], {})])
    rec = processes.merged_record(spec, folders, attempt=1, uid="u")
    assert rec["status"] == "failed" and rec["reason"] == "process 1: ValueError: x"
    assert rec["metrics"]["value_n"] == 2  # the two that ended ok
    stopped = processes.merged_record(spec, folders[:1], attempt=1, uid="u")
    assert stopped["status"] == "failed" and "after 1 of 3" in stopped["reason"]
    (folders[2] / "record.json").unlink()
    (folders[2] / "metrics.json").unlink()
    gone = processes.merged_record(spec, [folders[0], folders[2]], attempt=1, uid="u")
    assert gone["status"] == "failed" and "left no record" in gone["reason"]
    mixed = _folders(tmp_path / "b", [([10.0], {}), ([10.0], {"status": "oom",
                                                              "reason": "out of memory"}),
                                      ([10.0], {})])
    rec = processes.merged_record(spec, mixed, attempt=1, uid="u")
    assert rec["status"] == "failed" and "disagree" in rec["reason"]


def test_the_figures_of_a_whole_process_are_kept_beside_its_windows(tmp_path):
    """Energy is metered over a process's windows together (its record, not samples.jsonl):
    the run's record holds the median of the processes' joules, and a process's own
    statistics of a windowed metric are made again over the processes, not carried."""
    run_dir = tmp_path / KEY
    folders = _folders(run_dir, [
        ([10.0, 10.2], {"metrics": {"value": 10.1, "value_ci_low": 1.0, "energy_gpu_j": 300.0}}),
        ([12.0, 12.2], {"metrics": {"value": 12.1, "value_ci_low": 1.0, "energy_gpu_j": 330.0}}),
        ([8.0, 8.2], {"metrics": {"value": 8.1, "value_ci_low": 1.0, "energy_gpu_j": 310.0}})])
    rec = processes.merged_record(_spec(3), folders, attempt=1, uid="u1")
    assert [p["metrics"]["energy_gpu_j"] for p in rec["processes"]] == [300.0, 330.0, 310.0]
    assert rec["metrics"]["energy_gpu_j"] == 310.0
    assert rec["metrics"]["value"] == 10.1
    assert rec["metrics"]["value_ci_low"] != 1.0 and rec["metrics"]["value_ci_low"] <= 10.1
