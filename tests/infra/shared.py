"""Something expensive made once per test run, whichever xdist worker asks first.

A module fixture is made once per worker. When one file's tests run on two workers (its Slurm
tests join the ``slurm`` group, tests/infra/workers.py), a fixture that builds a container
image or runs a workflow would be made twice; ``made_once`` makes it once, under a lock in
the folder all workers of one run share, and hands the others what the first one made. The
tests that use it write only their own files inside it (their own site file, results folder).
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


def run_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder every worker of this run shares (one process: its own base)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def made_once(tmp_path_factory: pytest.TempPathFactory, name: str,
              make: Callable[[Path], Any]) -> tuple[Path, Any]:
    """``make(folder)`` once per run for ``name``; its folder and JSON-able result for every caller.

    A make that failed fails every later caller with the first one's message, instead of
    making it again (a broken build would otherwise cost each worker its full time)."""
    folder = run_folder(tmp_path_factory) / f"shared-{name}"
    folder.mkdir(parents=True, exist_ok=True)
    done, failed = folder / "made.json", folder / "failed.txt"
    with (folder / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # held while the first caller makes it
        if failed.exists():
            pytest.fail(f"{name}, made by another worker, failed:\n{failed.read_text()}",
                        pytrace=False)
        if not done.exists():
            try:
                result = make(folder)
            except BaseException as exc:
                failed.write_text(f"{type(exc).__name__}: {exc}"[-6000:])
                raise
            done.write_text(json.dumps(result))
        return folder, json.loads(done.read_text())
