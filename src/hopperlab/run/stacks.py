"""Where a job's process was when it was stopped: its Python stacks on SIGTERM and SIGINT.

A rank that hangs is ended from outside (the workflow's or the scheduler's time limit sends
SIGTERM) and, without this, leaves nothing that says where it waited: on 2026-11-28 one rank of
a 2-GPU run stopped between its ``task.json`` and its hardware fingerprint, and its log was
empty. (Slurm's ``scancel`` sends SIGTERM; submitit's local controller forwards SIGTERM, and
when it is itself interrupted sends SIGINT, then SIGKILL a second later.) ``faulthandler`` writes every thread's stack from the signal handler itself (no Python
code has to run, so a thread stuck in C still gets its stack written) and then hands the signal on
to the handler that was there before (submitit's, or the default: the process still ends).
"""
from __future__ import annotations

import faulthandler
import signal
import sys


#: the signals a job is stopped with
STOP_SIGNALS = ("SIGTERM", "SIGINT")


def dump_on_term() -> bool:
    """Write every thread's Python stack to stderr when a stop signal arrives, then let the
    signal do what it did before. Returns whether it could be set up (not in every process:
    a stderr without a file descriptor, a platform without these signals)."""
    try:
        for name in STOP_SIGNALS:
            faulthandler.register(getattr(signal, name), file=sys.stderr, all_threads=True,
                                  chain=True)
    except (AttributeError, ValueError, RuntimeError, OSError):
        return False
    return True
