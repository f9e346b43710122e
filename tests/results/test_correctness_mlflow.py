"""The correctness tag in MLflow follows the verdict where it is decided, not only at upload
(issue 47): a run uploaded before its baseline finished reads ``not compared`` there; the next
``hopperlab check`` or ``report`` of the folder sets it to what it reads now (here the fault,
``DIFFERENT``), a verdict that went away is deleted, a folder whose verdicts did not change
asks MLflow nothing, and MLflow down is one line, never a failure. On a SQLite store (unit)
and on a real tracking server on 127.0.0.1 (integration)."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path


from hopperlab.cli.main import main
from hopperlab.core.rundir import MLFLOW_FILE
from hopperlab.results import correctness
from hopperlab.results.tracking import upload_run

from tests.helpers import copy_project, edit_yaml
from tests.infra.mlflow_fixture import free_port
from tests.results.different_runs import (BASELINE, EXPERIMENT, HONEST, SPEEDS, WRONG,
                                          write_finetune, write_folder)

TAG, DETAIL = correctness.MLFLOW_TAG, f"{correctness.MLFLOW_TAG}.detail"


def _project(tmp_path: Path, uri: str | None) -> tuple[Path, str]:
    """A project whose local site tracks in ``uri`` (None: its default SQLite store)."""
    project = copy_project(tmp_path / "proj")
    if uri is not None:
        edit_yaml(project / "configs/sites/local.yaml",
                  lambda d: d["tracking"].update(uri=uri))
    return project, uri or f"sqlite:///{(project / 'results' / 'mlflow.db').resolve()}"


def _tags(uri: str, run_dir: Path) -> dict[str, str]:
    import mlflow

    run_id = json.loads((run_dir / MLFLOW_FILE).read_text())["run_id"]
    return mlflow.MlflowClient(uri).get_run(run_id).data.tags


def _check(project: Path, results: Path) -> int:
    return main(["--root", str(project), "check", str(results), "--references",
                 str(project / "no-refs")])


def _verdict_follows_the_folder(tmp_path: Path, capsys, server: str | None) -> None:
    project, uri = _project(tmp_path, server)
    results = write_folder(project / "results")
    base = results / EXPERIMENT / BASELINE
    held = tmp_path / "baseline-still-running"
    shutil.move(base, held)                    # uploaded while the baseline still ran
    for variant in (WRONG, HONEST):
        upload_run(results / EXPERIMENT / variant, uri)
    wrong = results / EXPERIMENT / WRONG
    assert _tags(uri, wrong)[TAG] == correctness.NOT_COMPARED
    shutil.move(held, base)                    # the baseline finished
    capsys.readouterr()
    assert _check(project, results) == 1       # check decides DIFFERENT ...
    tags = _tags(uri, wrong)                    # ... and MLflow says so now
    assert tags[TAG] == correctness.DIFFERENT and "gradient norm" in tags[DETAIL], tags
    assert _tags(uri, results / EXPERIMENT / HONEST)[TAG] == correctness.SAME
    out = capsys.readouterr().out
    assert "correctness in MLflow: 2 run(s) set to their verdict now" in out, out
    # nothing changed since: report asks MLflow nothing (mlflow.json says what was set)
    assert main(["--root", str(project), "report"]) == 0
    assert "correctness in MLflow" not in capsys.readouterr().out
    # the baseline's run moved away (rerun elsewhere): report decides "not compared" again
    shutil.move(base, held)
    assert main(["--root", str(project), "report"]) == 0
    assert "correctness in MLflow: 2 run(s)" in capsys.readouterr().out
    assert _tags(uri, wrong)[TAG] == correctness.NOT_COMPARED


def test_check_and_report_set_the_verdict_on_a_sqlite_store(tmp_path, capsys):
    _verdict_follows_the_folder(tmp_path, capsys, None)


def test_a_server_mlflow_run_is_tagged_after_check(tmp_path, capsys, mlflow_uri):
    _verdict_follows_the_folder(tmp_path, capsys, mlflow_uri)


def test_mlflow_down_is_one_line_and_the_check_stands(tmp_path, capsys):
    down = f"http://127.0.0.1:{free_port()}"
    project, uri = _project(tmp_path, down)
    results = write_folder(project / "results")
    for variant in (HONEST, WRONG):           # both uploaded to a server that is down now
        (results / EXPERIMENT / variant / MLFLOW_FILE).write_text(json.dumps(
            {"attempt": 1, "run_id": "0" * 32, "experiment_id": "1", "tracking_uri": down}))
    assert _check(project, results) == 1       # DIFFERENT, as without MLflow
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "not set in MLflow" in ln]
    assert len(lines) == 1 and "and 1 more run(s)" in lines[0], lines   # one line, not two
    assert "hopperlab sync" in lines[0]


def test_the_machines_page_from_mlflow_marks_the_different_run(tmp_path, capsys):
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    a = write_folder(tmp_path / "results-a", machine="m1", wrong=False)
    write_finetune(a, WRONG, SPEEDS[BASELINE], offload="activations", machine="m1")  # honest
    b = write_folder(tmp_path / "results-b", machine="m2")   # the fault, twice as fast
    for folder in (a, b):
        for variant in (BASELINE, HONEST, WRONG):
            upload_run(folder / EXPERIMENT / variant, uri)
    out = tmp_path / "out"
    assert main(["--root", str(tmp_path), "machines", "--mlflow", uri, "--reference", "m1",
                 "--out", str(out)]) == 0
    rows = list(csv.DictReader((out / "machines.csv").open()))
    wrong = next(r for r in rows if r["variant"] == WRONG and r["machine"] == "m2")
    assert wrong["correctness"] == correctness.DIFFERENT and wrong["ratio_to_reference"] == ""
    honest = next(r for r in rows if r["variant"] == HONEST and r["machine"] == "m2")
    assert honest["ratio_to_reference"] != ""


def test_history_leaves_a_different_run_out_of_its_series(tmp_path, capsys):
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    for i in range(7):   # seven runs of the variant over time, the fourth the fault
        folder = write_folder(tmp_path / f"results-{i}", wrong=i == 3)
        if i != 3:
            write_finetune(folder, WRONG, SPEEDS[BASELINE], offload="activations")
        upload_run(folder / EXPERIMENT / WRONG, uri)
    capsys.readouterr()
    assert main(["--root", str(tmp_path), "history", "--mlflow", uri, "--run",
                 f"{EXPERIMENT}/{WRONG}", "--metric", "tokens_per_s",
                 "--out", str(tmp_path / "hist")]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith(f"m1 {EXPERIMENT}/{WRONG} "))
    assert ": 6 runs" in line and "1 run(s) left out, DIFFERENT: not a finding" in line, line


def test_the_workflow_end_sets_the_verdict_when_the_report_rule_did_not_run(tmp_path, capsys):
    from hopperlab.cli.workflow import verdicts_at_end
    from hopperlab.config.matrix import load_matrix

    project, uri = _project(tmp_path, None)
    results = write_folder(project / "results")
    base, held = results / EXPERIMENT / BASELINE, tmp_path / "held"
    shutil.move(base, held)
    upload_run(results / EXPERIMENT / WRONG, uri)     # while the baseline still ran
    shutil.move(held, base)
    verdicts_at_end(load_matrix(project, {}))          # the workflow's onsuccess/onerror
    assert _tags(uri, results / EXPERIMENT / WRONG)[TAG] == correctness.DIFFERENT
    assert "correctness in MLflow: 1 run(s) set" in capsys.readouterr().out
