"""Submitting in-process through submitit's DebugExecutor: ``submit`` runs the function when
its result is asked for, in this process (the site's ``env:`` is applied by the runner)."""

from __future__ import annotations

from typing import Callable

from hopperlab.backends.base import Executor, JobRequest, Launcher


class DebugLauncher(Launcher):
    def make_executor(self, req: JobRequest, log: Callable[[str], None]) -> Executor:
        import submitit

        return submitit.DebugExecutor(folder=req.folder)


LAUNCHER = DebugLauncher()
