"""One writer at a time for a results folder and for a run directory.

Two checkouts (or a hand-run ``hopperlab submit`` beside a workflow) writing into one results
folder overwrite each other's records and history. A writer therefore holds a lock file that
names it (host, pid, when, from where), created atomically, and a second writer is refused
with a message naming the holder. A holder that died on this host (pid gone or reused) leaves
a stale lock that the next writer takes over; a holder on another host cannot be checked from
here, so the message says which file to remove once that writer is known to be gone.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hopperlab.core.errors import HopperlabError

#: the lock of a results folder, and of one run directory
RESULTS_LOCK = Path(".hopperlab") / "writer.lock"
RUN_LOCK = ".writer.lock"
#: set by the workflow that holds a results folder, so that its own jobs may write there
HOLDER_ENV = "HOPPERLAB_RESULTS_HOLDER"


class LockHeld(HopperlabError, RuntimeError):
    """Another live process writes here; the message names it and the lock file."""


def _start_ticks(pid: int) -> str | None:
    """The process's start time in clock ticks (Linux): tells a live holder from a reused pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def this_process() -> dict[str, Any]:
    """The holder record of the calling process."""
    pid = os.getpid()
    return {"host": socket.gethostname(), "pid": pid, "start": _start_ticks(pid),
            "since": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "cwd": os.getcwd()}


def process_on_this_host(pid: int) -> dict[str, Any]:
    """A record of process ``pid`` of this host that ``is_alive`` can check later (a pid that
    the kernel gave to another process since counts as gone)."""
    return {"host": socket.gethostname(), "pid": pid, "start": _start_ticks(pid)}


def is_alive(holder: dict[str, Any]) -> bool | None:
    """Whether the process of ``holder`` runs (None: another host's, which cannot be told)."""
    if holder.get("host") != socket.gethostname():
        return None
    return _alive_here(holder)


def holder_id(holder: dict[str, Any]) -> str:
    return f"{holder.get('host')}:{holder.get('pid')}"


def _alive_here(holder: dict[str, Any]) -> bool:
    """Whether a holder on this host still runs (a recycled pid counts as gone)."""
    pid = int(holder.get("pid") or 0)
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, someone else's
    start = holder.get("start")
    return start is None or _start_ticks(pid) in (None, start)


def is_stale(holder: dict[str, Any]) -> bool:
    """A lock is stale when its holder ran on this host and is gone; another host's is not."""
    return holder.get("host") == socket.gethostname() and not _alive_here(holder)


def read_holder(path: Path) -> dict[str, Any] | None:
    """The holder named in a lock file; None when there is no lock (a torn one counts as stale)."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        data = None
    if not isinstance(data, dict) or not isinstance(data.get("host"), str) or \
            isinstance(data.get("pid"), bool) or not isinstance(data.get("pid"), int):
        # torn, or of another shape than ours: no holder can be named, so none is alive
        return {"host": socket.gethostname(), "pid": 0, "cwd": f"(unreadable lock {path})"}
    return data


def held_message(path: Path, what: str, holder: dict[str, Any]) -> str:
    return (f"{what} is being written by pid {holder.get('pid')} on host {holder.get('host')} "
            f"(since {holder.get('since', '?')}, from {holder.get('cwd', '?')}); "
            f"wait for it to finish, or write elsewhere (--config results_dir=...). "
            f"If that process is gone, remove {path}")


@contextlib.contextmanager
def _guard(path: Path) -> Iterator[None]:
    """Serialises check-and-take of one lock between processes of this host: a ``flock`` on
    the folder that holds the lock file (no second file to leave behind)."""
    with folder_held(path.parent):
        yield


@contextlib.contextmanager
def folder_held(folder: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``folder`` itself for the block: one read-modify-write of a
    file in it at a time among the processes of this host, no lock file left behind."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the flock


def acquire(path: Path, what: str, *, allowed: set[str] = frozenset()) -> bool:
    """Take the lock at ``path`` for this process; False when it held it already.

    ``allowed`` names holders (``host:pid``) this process writes for, e.g. the workflow that
    started it. Raises LockHeld when another live writer holds it.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    me = this_process()
    with _guard(path):
        holder = read_holder(path)
        if holder is not None:
            if holder_id(holder) == holder_id(me) or holder_id(holder) in allowed:
                return False
            if not is_stale(holder):
                raise LockHeld(held_message(path, what, holder))
            path.unlink(missing_ok=True)
        tmp = path.with_name(f"{path.name}.{me['pid']}.tmp")
        tmp.write_text(json.dumps(me) + "\n")
        try:
            os.link(tmp, path)  # atomic: a reader never sees a lock without its holder
        finally:
            tmp.unlink(missing_ok=True)
    return True


def release(path: Path) -> None:
    """Remove the lock at ``path`` if this process holds it (another's is left alone)."""
    path = Path(path)
    if not path.exists():
        return
    with _guard(path):
        holder = read_holder(path)
        if holder is not None and holder_id(holder) == holder_id(this_process()):
            path.unlink(missing_ok=True)


def check_free(path: Path, what: str, *, allowed: set[str] = frozenset()) -> None:
    """Raise LockHeld when a live writer other than ``allowed`` holds ``path``."""
    holder = read_holder(path)
    if holder is None or holder_id(holder) in allowed or holder_id(holder) == holder_id(
            this_process()):
        return
    if not is_stale(holder):
        raise LockHeld(held_message(path, what, holder))


@contextlib.contextmanager
def holding(path: Path, what: str, *, allowed: set[str] = frozenset()) -> Iterator[None]:
    """Hold the lock at ``path`` for the block (released after, unless it was held before)."""
    taken = acquire(path, what, allowed=allowed)
    try:
        yield
    finally:
        if taken:
            release(path)


def results_lock_path(results_dir: Path) -> Path:
    return Path(results_dir) / RESULTS_LOCK


def workflow_holders() -> set[str]:
    """Holders this process writes for: the workflow that started it, if any."""
    value = os.environ.get(HOLDER_ENV)
    return {value} if value else set()
