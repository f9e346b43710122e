"""Issue 37 (minor): a local run stopped by Ctrl-C printed submitit's controller traceback
(KeyboardInterrupt in its wait loop) on the user's terminal; the run's own lines say why it
stopped, the controller's stderr goes into the job's submitit folder."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.helpers import copy_project, default_signals

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def test_ctrl_c_on_a_local_run_prints_no_controller_traceback(tmp_path):
    project = copy_project(tmp_path / "project")
    run_dir = project / "results/selftest/faults/long"
    proc = subprocess.Popen([sys.executable, "-m", "hopperlab.cli", "submit",
                             "selftest/faults/long", "--no-upload", "--config",
                             "families=selftest"], cwd=project, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            preexec_fn=default_signals, env={**os.environ})
    try:
        deadline = time.monotonic() + 120
        while not list((run_dir / "submitit").glob("*_log.out")):
            assert time.monotonic() < deadline and proc.poll() is None, "the job never started"
            time.sleep(0.5)
        time.sleep(3)
        os.killpg(proc.pid, signal.SIGINT)          # Ctrl-C: the whole foreground group
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert "stopped by SIGINT" in out, out
    assert "Traceback" not in out and "KeyboardInterrupt\n" not in out, out
    assert "KeyboardInterrupt" in (run_dir / "submitit/controller.err").read_text()
