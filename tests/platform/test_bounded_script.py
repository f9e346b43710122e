"""benchmarks/bounded.sh: a GPU script's time bound ends the command and every process it
started, a child that ignores SIGTERM (as submitit's jobs do) included; a command within its
bound keeps its exit status."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _bounded(seconds: int, command: str, tmp_path: Path) -> int:
    script = f'. "{REPO}/benchmarks/bounded.sh"; GRACE_S=1 run_bounded {seconds} {command}'
    return subprocess.run(["bash", "-c", script], cwd=tmp_path, timeout=120).returncode


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


@pytest.mark.integration  # processes and a 1 s bound
def test_the_bound_ends_a_child_that_ignores_sigterm(tmp_path):
    child = tmp_path / "child.pid"
    command = (f"bash -c 'bash -c \"trap \\\"\\\" TERM; echo \\$\\$ > {child}; sleep 300\" & "
               f"wait'")
    assert _bounded(1, command, tmp_path) == 124
    pid = int(child.read_text())
    assert not _alive(pid), f"pid {pid} outlived the bound"


@pytest.mark.integration
def test_a_command_within_its_bound_keeps_its_exit_status_and_leaves_nothing(tmp_path):
    child = tmp_path / "child.pid"
    command = f"bash -c 'sleep 300 & echo $! > {child}; exit 3'"
    assert _bounded(60, command, tmp_path) == 3
    assert not _alive(int(child.read_text()))  # left running by the command: ended
    assert _bounded(0, "bash -c 'exit 5'", tmp_path) == 5  # 0: no bound
    assert os.path.exists(child)
