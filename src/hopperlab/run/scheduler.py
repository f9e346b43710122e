"""The submitting process and its signals: SIGINT or SIGTERM while a job runs raise
``Interrupted`` (the job is cancelled and the attempt settled before the process exits), and
are held off while an attempt is settled."""

from __future__ import annotations

import signal
import time
from contextlib import contextmanager
from typing import Any, Callable, ContextManager, Iterator


class Interrupted(KeyboardInterrupt):
    """The submitting process was told to stop (SIGINT or SIGTERM): its job is cancelled and
    its attempt settled before it exits."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise(signum: int, _frame: object) -> None:
    raise Interrupted(signum)


@contextmanager
def _sigint_sigterm(handler: Any) -> Iterator[None]:
    """SIGINT and SIGTERM go to ``handler`` in this block, the old handlers back after it (main
    thread only: elsewhere handlers cannot be set and the block runs as it is)."""
    try:
        old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        for s, previous in old.items():
            signal.signal(s, previous)


def interrupts_raise() -> ContextManager[None]:
    """SIGINT and SIGTERM raise ``Interrupted`` in this block."""
    return _sigint_sigterm(_raise)


def uninterrupted() -> ContextManager[None]:
    """SIGINT and SIGTERM are held off while the block settles an attempt (a second Ctrl-C
    must not leave it half written); they are not lost to the caller, which re-raises."""
    return _sigint_sigterm(signal.SIG_IGN)


def poll_until(done: Callable[[], bool], poll_s: float, limit_s: float) -> bool:
    deadline = time.monotonic() + limit_s
    while not done():
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)
    return True
