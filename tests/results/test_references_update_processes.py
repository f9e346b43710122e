"""``references update RESULTS_DIR`` of a run measured with ``processes``: three or more
processes give a reference of the spread between them (n = processes, no warning); fewer give
one process's windows only, with the warning that one process is not enough."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from hopperlab.cli.main import main
from hopperlab.core.rundir import read_process_samples

from tests.results.run_dirs import KEY, write_run


def _run_of_processes(results: Path, processes: list[list[float]]) -> Path:
    """A run whose ``samples.jsonl`` holds each process's windows, as run/processes.py writes."""
    run_dir = write_run(results, samples=[v for p in processes for v in p],
                        record={"tags": {"processes": str(len(processes))}})
    (run_dir / "samples.jsonl").write_text("".join(
        json.dumps({"process": i, "repeat": r, "metrics": {"value": v}}) + "\n"
        for i, windows in enumerate(processes) for r, v in enumerate(windows)))
    return run_dir


def _update(tmp_path: Path) -> dict:
    assert main(["--root", str(tmp_path), "references", "update", str(tmp_path / "results"),
                 "--references", str(tmp_path / "refs")]) == 0
    return yaml.safe_load((tmp_path / "refs/m1.yaml").read_text())["references"][KEY]["value"]


def test_three_processes_give_a_reference_of_their_spread(tmp_path, capsys):
    # windows within 0.1 %, processes 10 % apart: the spread is the processes'
    run_dir = _run_of_processes(tmp_path / "results",
                                [[10.0, 10.01, 10.0], [11.0, 11.01, 11.0], [9.0, 9.01, 9.0]])
    assert [len(g) for g in read_process_samples(run_dir)] == [3, 3, 3]
    entry = _update(tmp_path)
    assert entry["n"] == 3 and entry["value"] == 10.0
    assert entry["spread"] > 0.05  # one process's windows would say 0.001
    assert "3 independent processes" in entry["source"]
    assert "one process per run" not in capsys.readouterr().out


def test_two_processes_give_one_process_s_windows_with_the_warning(tmp_path, capsys):
    _run_of_processes(tmp_path / "results", [[10.0, 10.01, 10.02], [11.0, 11.01, 11.02]])
    entry = _update(tmp_path)
    assert entry["n"] == 3 and entry["value"] == 10.01  # process 0's windows, not all six
    assert "3 repeats" in entry["source"]
    out = capsys.readouterr().out
    assert "one process per run" in out and "processes=3" in out
