"""The kernel's own count of out-of-memory kills, read before and after a local job.

Why: a job the kernel kills for memory dies by SIGKILL without a word of its own; the last line
of its stderr is whatever it printed before (a warning, a progress bar). The kernel counts each
kill: ``oom_kill`` in ``/proc/vmstat`` (the whole host) and in the job's memory cgroup
(``memory.events`` on cgroup v2, ``memory.oom_control`` on v1). A rise of either across a job
that ended by SIGKILL is the kernel's word that it killed the job for memory.
"""

from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass
from pathlib import Path

VMSTAT = Path("/proc/vmstat")
KMSG = Path("/dev/kmsg")
CGROUP_ROOT = Path("/sys/fs/cgroup")
#: cgroup v2's counter file and v1's (the memory controller's own hierarchy)
V2_EVENTS, V1_CONTROL = "memory.events", "memory.oom_control"


@dataclass(frozen=True)
class OomCounts:
    """``oom_kill`` of the host and of one memory cgroup (None: not readable here)."""

    host: int | None
    cgroup: int | None
    cgroup_file: str | None
    limit_bytes: int | None


def _count(path: Path) -> int | None:
    try:
        text = path.read_text()
    except OSError:
        return None
    found = re.search(r"^oom_kill (\d+)$", text, re.M)
    return int(found.group(1)) if found else None


def memory_cgroup(pid: int | str = "self", root: Path = CGROUP_ROOT) -> tuple[Path, str] | None:
    """(folder, counter file) of ``pid``'s memory cgroup: v2's unified one, or v1's memory
    controller; None when neither is mounted where we look."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        rel = path.lstrip("/")
        if "memory" in controllers.split(","):
            for base in (root / "memory", root):
                if (base / rel / V1_CONTROL).exists():
                    return base / rel, V1_CONTROL
        if controllers == "":
            for base in (root, root / "unified"):
                if (base / rel / V2_EVENTS).exists():
                    return base / rel, V2_EVENTS
    return None


def _limit(folder: Path, counter: str) -> int | None:
    name = "memory.limit_in_bytes" if counter == V1_CONTROL else "memory.max"
    try:
        text = (folder / name).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() and int(text) < 1 << 60 else None


def read_counts(pid: int | str = "self", root: Path = CGROUP_ROOT,
                vmstat: Path = VMSTAT) -> OomCounts:
    """The counters now, for ``pid``'s memory cgroup (a job inherits its submitter's)."""
    found = memory_cgroup(pid, root)
    if found is None:
        return OomCounts(_count(vmstat), None, None, None)
    folder, counter = found
    return OomCounts(_count(vmstat), _count(folder / counter), str(folder / counter),
                     _limit(folder, counter))


def kernel_oom_kill(before: OomCounts, after: OomCounts) -> str | None:
    """The kernel's word that it killed for memory between ``before`` and ``after``, or None."""
    said = []
    if before.cgroup is not None and after.cgroup is not None and after.cgroup > before.cgroup:
        limit = (f", limit {after.limit_bytes / (1 << 30):.2f} GiB"
                 if after.limit_bytes is not None else "")
        said.append(f"oom_kill {before.cgroup} -> {after.cgroup} in {after.cgroup_file}{limit}")
    if before.host is not None and after.host is not None and after.host > before.host:
        said.append(f"oom_kill {before.host} -> {after.host} in {VMSTAT}")
    return "; ".join(said) or None


#: a file in a job's submitit folder naming the process a local job's task stands for (a task
#: forked by the workflow's warm starter, run/warm.py, is not the controller's child)
STAND_IN_GLOB = "warm-*.pid"
STAND_IN_FILE = "warm-{client}.pid"


def stand_ins(folder: Path) -> set[int]:
    """The pids the tasks in submitit ``folder`` stand for (``STAND_IN_FILE``)."""
    found: set[int] = set()
    for path in Path(folder).glob(STAND_IN_GLOB):
        try:
            found.add(int(path.read_text().split()[0]))
        except (OSError, ValueError, IndexError):
            continue
    return found


def children(pid: int) -> set[int]:
    """The pids of ``pid``'s children now (empty once it has gone)."""
    found: set[int] = set()
    try:
        threads = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return found
    for thread in threads:
        try:
            found.update(int(p) for p in (thread / "children").read_text().split())
        except (OSError, ValueError):
            continue
    return found


def kernel_kill_lines(pids: set[int], kmsg: Path = KMSG) -> list[str]:
    """The kernel log's "Killed process <pid>" lines for ``pids`` (the OOM killer's SIGKILL);
    empty when there are none or the log is not readable here (not root)."""
    if not pids:
        return []
    try:
        fd = os.open(kmsg, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return []
    lines = []
    try:
        while True:
            try:
                record = os.read(fd, 8192)
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # a record overwritten while we read: the next
                    continue
                break  # EAGAIN: the end of the log
            if not record:
                break
            text = record.decode(errors="replace").split(";", 1)[-1].split("\n", 1)[0]
            killed = re.search(r"Killed process (\d+) ", text)
            if killed and int(killed.group(1)) in pids:
                lines.append(text.strip())
    finally:
        os.close(fd)
    return lines
