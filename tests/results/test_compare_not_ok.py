"""``hopperlab compare A B`` where runs did not end ok or a metric is not a number (issue 46,
D24 and C9): a run skipped or failed on both sides is "not ok on both", shown but no change, so
that a folder compared with itself (every CPU folder has skipped GPU runs) exits 0 with "no
change"; a metric recorded as NaN is "not a number", never "only in A"."""

from __future__ import annotations

import json
from pathlib import Path

from hopperlab.cli.main import main
from tests.helpers import REPO


def _run(folder: Path, key: str, status: str = "ok", reason: str | None = None,
         **metrics: float) -> None:
    """A run directory measured once: its record (status, reason, metrics) and spec."""
    family, experiment, variant = key.split("/")
    run_dir = folder / key
    run_dir.mkdir(parents=True, exist_ok=True)
    record = {"family": family, "experiment": experiment, "variant": variant, "attempt": 1,
              "status": status, "reason": reason, "metrics": metrics}
    (run_dir / "record.json").write_text(json.dumps(record))  # NaN as JSON's NaN
    (run_dir / "spec.json").write_text(json.dumps(
        {"family": family, "experiment": experiment, "variant": variant,
         "headline_metrics": ["value"]}))


def _folder(root: Path, value_c: float = 2.0) -> Path:
    """A CPU folder: a run ok, a GPU run skipped, a run that failed."""
    _run(root, "selftest/trivial/ok", value=1.0)
    _run(root, "selftest/trivial/c", value=value_c)
    _run(root, "membench/copy/h2d-pinned", "skipped", "no CUDA device on this node")
    _run(root, "selftest/faults/raises", "failed", "RuntimeError: deliberately")
    return root


def _compare(a: Path, b: Path, tmp_path: Path, capsys) -> tuple[int, str]:
    code = main(["--root", str(REPO), "compare", str(a), str(b), "--out", str(tmp_path / "out")])
    return code, capsys.readouterr().out


def test_a_folder_compared_with_itself_is_no_change(tmp_path, capsys):
    folder = _folder(tmp_path / "results")
    code, out = _compare(folder, folder, tmp_path, capsys)
    assert code == 0, out
    assert ": no change, 2 metric(s) the same within noise, 2 not ok on both sides alike" in out
    assert "FAILED IN B" not in out
    assert ("NOT OK ON BOTH membench/copy/h2d-pinned status A skipped, B skipped: no CUDA "
            "device on this node") in out
    assert "NOT OK ON BOTH selftest/faults/raises status A failed, B failed" in out
    assert "No change beyond the noise; 2 not ok on both sides alike (not a change)." in out
    page = (tmp_path / "out/compare.html").read_text()
    assert "class='verdict good'" in page and "Not ok on both sides alike (2)" in page


def test_a_run_ok_in_a_and_skipped_in_b_still_fails_the_gate(tmp_path, capsys):
    a = _folder(tmp_path / "a")
    b = _folder(tmp_path / "b")
    _run(b, "selftest/trivial/ok", "skipped", "no GPU")
    code, out = _compare(a, b, tmp_path, capsys)
    assert code == 1, out
    assert "FAILED IN B    selftest/trivial/ok status A ok, B skipped: no GPU" in out


def test_a_nan_metric_of_b_is_not_a_number_not_only_in_a(tmp_path, capsys):
    a = _folder(tmp_path / "a")
    b = _folder(tmp_path / "b", value_c=float("nan"))
    code, out = _compare(a, b, tmp_path, capsys)
    assert code == 1, out
    assert "ONLY IN A" not in out
    assert "NOT A NUMBER IN B selftest/trivial/c value recorded as NaN or inf" in out
    assert "] 1 metric(s) of B not a number; 2 not ok on both sides alike" in out
    code, out = _compare(b, a, tmp_path, capsys)  # B has the number back: a fix, not a failure
    assert code == 0, out
    assert "NOT A NUMBER IN A selftest/trivial/c value" in out
    code, out = _compare(b, b, tmp_path, capsys)
    assert code == 0, out
    assert "NOT A NUMBER ON BOTH selftest/trivial/c value" in out and "no change" in out
