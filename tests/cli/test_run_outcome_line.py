"""What ``hopperlab run KEY`` prints at the end (issue 46): the figures of a run that ended ok,
and for one that did not (skipped on a node without a GPU, oom, failed) its status and reason,
never "measured" with the price or set-up time it recorded."""

from __future__ import annotations

import json

from hopperlab.cli.main import measured_line


def _record(run_dir, **fields):
    run_dir.mkdir(parents=True)
    (run_dir / "record.json").write_text(json.dumps(fields))
    return run_dir


def test_a_skipped_run_says_skipped_with_its_reason_and_no_figures(tmp_path):
    run_dir = _record(tmp_path / "membench/copy/h2d-pinned", status="skipped",
                      reason="no CUDA device on this node\n(CPU only)",
                      metrics={"cost_run": 0.0001, "setup_s": 0.4})
    line = measured_line("membench/copy/h2d-pinned", run_dir, ("h2d_gbps",))
    assert line == (f"[hopperlab] membench/copy/h2d-pinned skipped: no CUDA device on this node "
                    f"(CPU only) ({run_dir / 'record.json'})")


def test_a_failed_run_says_failed(tmp_path):
    run_dir = _record(tmp_path / "r", status="failed", metrics={"cost_run": 0.1})
    line = measured_line("selftest/faults/raises", run_dir, ())
    assert "failed: no reason recorded" in line and "cost_run" not in line


def test_a_run_that_ended_ok_shows_what_it_measured(tmp_path):
    run_dir = _record(tmp_path / "r", status="ok", metrics={"value": 2.5, "cost_run": 0.1})
    line = measured_line("selftest/trivial/ok", run_dir, ("value",))
    assert line.startswith("[hopperlab] selftest/trivial/ok measured value = 2.5 (")
