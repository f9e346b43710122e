"""``setup_s``: every run's seconds from job start to its first step, recorded in one place (the
Recorder) for every family, the slowest rank's for a distributed run."""

from __future__ import annotations

import json
import time

import pytest

from hopperlab.core import rundir as record
from hopperlab.run import ranks
from tests.helpers import copy_project, hopperlab


def test_setup_ends_where_the_workload_says_its_steps_begin(tmp_path):
    rec = record.Recorder(tmp_path / "a", job_started=time.time() - 30.0)
    rec.mark_setup_done()
    time.sleep(0.05)
    rec.log_step(0, loss=1.0)  # the first step's end is not set-up
    rec.mark_setup_done()  # only the first mark counts
    setup = rec.finish("ok")["metrics"][record.SETUP_METRIC]
    assert 30.0 <= setup < 30.05


def test_a_workload_that_says_nothing_is_set_up_by_its_first_step(tmp_path):
    rec = record.Recorder(tmp_path / "b", job_started=time.time() - 5.0)
    rec.log_step(0, loss=1.0)
    time.sleep(0.05)
    rec.log_step(1, loss=0.5)
    assert 5.0 <= rec.finish("ok")["metrics"]["setup_s"] < 5.05


def test_no_step_no_setup_and_a_workload_figure_wins(tmp_path):
    assert "setup_s" not in record.Recorder(tmp_path / "c").finish("skipped", "x")["metrics"]
    rec = record.Recorder(tmp_path / "d")
    rec.log_metric("setup_s", 7.0)  # a workload that knows better keeps its own
    rec.log_step(0, loss=1.0)
    assert rec.finish("ok")["metrics"]["setup_s"] == 7.0


def test_the_process_start_is_before_now():
    started = record.process_started_at()
    assert started is not None and 0 < time.time() - started < 24 * 3600


def test_a_distributed_run_is_set_up_when_its_last_rank_is(tmp_path):
    for rank, setup in ((0, 3.0), (1, 11.0)):
        d = tmp_path / ranks.RANKS_DIR / str(rank)
        d.mkdir(parents=True)
        record.write_json_atomic(d / record.RECORD_FILE, {
            "attempt": 1, "status": "ok", "metrics": {"setup_s": setup, "step_s": 1.0}})
    merged = ranks.merged_record(tmp_path, 1, 2)
    assert merged is not None and merged["metrics"]["setup_s"] == 11.0


@pytest.mark.integration
def test_a_cpu_run_of_another_family_records_its_setup(tmp_path):
    """Through the runner, as a user runs it: the job's set-up (interpreter, imports) is in."""
    key = "selftest/trivial/ok"
    project = copy_project(tmp_path / "project")
    out = hopperlab(["submit", key, "--no-upload", "--config", f"results_dir={tmp_path}/r",
                     "families=selftest"], project, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    rec = json.loads((tmp_path / "r" / key / "metrics.json").read_text())
    assert rec["status"] == "ok" and rec["metrics"]["setup_s"] > 0
