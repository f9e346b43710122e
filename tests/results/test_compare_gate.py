"""``hopperlab compare A B`` as a CI gate (issue 37, item 2): exit 1 whenever B has a run that
is worse, failed or missing, 0 only when nothing is; a sample of B that is not a finite number
is one clear line (exit 2), never a traceback."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from hopperlab.cli.main import main

from tests.helpers import hopperlab, project_with_noisy_run

# every test here judges real runs that a module fixture starts as jobs
pytestmark = pytest.mark.integration

NOISY = "selftest/noise/noisy"


def _run(project: Path, key: str, results: str) -> None:
    out = hopperlab(["run", key, "--no-upload", "--config", "families=selftest",
                     f"results_dir={results}"], project)
    assert out.returncode == 0, out.stderr[-2000:]


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A results folder A of real runs: the noisy run with 5 repeats and the trivial one."""
    proj = project_with_noisy_run(tmp_path_factory.mktemp("gate") / "proj")[0]
    _run(proj, "selftest/trivial/ok", "results-a")
    return proj


def _copy(project: Path, name: str) -> Path:
    dest = project / name
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(project / "results-a", dest)
    return dest


def _compare(project: Path, b: Path, tmp_path: Path, capsys) -> tuple[int, str, str]:
    code = main(["--root", str(project), "compare", str(project / "results-a"), str(b),
                 "--out", str(tmp_path / "out")])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_the_same_runs_pass(project, tmp_path, capsys):
    code, out, _ = _compare(project, _copy(project, "results-same"), tmp_path, capsys)
    assert code == 0, out
    assert "FAILED" not in out and "ONLY IN A" not in out


def test_a_run_that_failed_in_b_fails_the_gate(project, tmp_path, capsys):
    b = _copy(project, "results-failed")
    record = b / NOISY / "record.json"
    data = json.loads(record.read_text())
    data.update(status="failed", reason="RuntimeError: CUDA error: an illegal memory access")
    record.write_text(json.dumps(data))
    code, out, _ = _compare(project, b, tmp_path, capsys)
    assert code == 1, out
    assert f"FAILED IN B    {NOISY} status A ok, B failed: RuntimeError: CUDA error" in out
    assert "1 run(s) failed in B." in out
    page = (tmp_path / "out/compare.html").read_text()
    assert "class='verdict bad'" in page and "No change beyond the noise" not in page


def test_a_run_missing_from_b_fails_the_gate(project, tmp_path, capsys):
    b = _copy(project, "results-missing")
    shutil.rmtree(b / "selftest/trivial")
    code, out, _ = _compare(project, b, tmp_path, capsys)
    assert code == 1, out
    assert "ONLY IN A      selftest/trivial/ok" in out
    assert "1 run(s) or metric(s) of A missing from B." in out


def test_a_run_only_in_b_that_failed_fails_the_gate(project, tmp_path, capsys):
    b = _copy(project, "results-new-failure")
    out = hopperlab(["run", "selftest/faults/raises", "--no-upload", "--config",
                     "families=selftest", "results_dir=results-new-failure"], project)
    assert out.returncode != 0
    code, out, _ = _compare(project, b, tmp_path, capsys)
    assert code == 1, out
    assert "FAILED IN B    selftest/faults/raises status not in A, B failed" in out


def test_a_run_that_b_fixed_does_not_fail_the_gate(project, tmp_path, capsys):
    """A failed, B ok: nothing of B is broken."""
    a = _copy(project, "results-a-broken")
    record = a / NOISY / "record.json"
    record.write_text(json.dumps({**json.loads(record.read_text()), "status": "failed"}))
    code = main(["--root", str(project), "compare", str(a), str(project / "results-a"),
                 "--out", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"NOT OK         {NOISY} status A failed, B ok" in out


@pytest.mark.parametrize("bad", ["NaN", "Infinity", "-Infinity", '"fast"'])
def test_a_sample_of_b_that_is_not_a_number_is_one_clear_line(project, tmp_path, capsys, bad):
    b = _copy(project, "results-nan")
    samples = b / NOISY / "samples.jsonl"
    lines = samples.read_text().splitlines()
    first = json.loads(lines[1])
    lines[1] = json.dumps(first).replace(json.dumps(first["metrics"]["value"]), bad, 1)
    samples.write_text("\n".join(lines) + "\n")
    code, out, err = _compare(project, b, tmp_path, capsys)
    assert code == 2, out + err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert f"{samples}: sample 2: value is " in err and "not a finite number" in err
