"""Submitting on this machine through submitit's LocalExecutor.

The time limit is ours to enforce (``enforces_time_limit`` is False): the controller's own
limit lies ``BACKSTOP_MIN`` past it and only stops orphans, since its SIGINT would read as a
crash ("KeyboardInterrupt"). submitit is imported inside functions.
"""

from __future__ import annotations

import os
import socket
from typing import Callable

from hopperlab.backends.base import MASTER_PORT_ENV, Executor, JobRequest, Launcher

#: the local controller's own limit lies this far past ours (minutes)
BACKSTOP_MIN = 1


def free_port() -> int:
    """A port free on this node now (the local submitter hands it to every task)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalLauncher(Launcher):
    def make_executor(self, req: JobRequest, log: Callable[[str], None]) -> Executor:
        import submitit

        res = req.resources
        ex = submitit.LocalExecutor(folder=req.folder, python=req.python, max_num_timeout=0)
        if res.distributed:  # every task of this job reads the port this process found free
            os.environ[MASTER_PORT_ENV] = str(free_port())
        ex.update_parameters(timeout_min=res.time_min + BACKSTOP_MIN, gpus_per_node=res.gpus,
                             tasks_per_node=res.tasks_on_node, nodes=1, signal_delay_s=0)
        return ex


LAUNCHER = LocalLauncher()
