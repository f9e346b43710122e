"""The node's GPUs as a pool of slots, one lock file each, so that local jobs side by side
(``snakemake --cores all --resources gpus=N``) never share a device.

Why: Snakemake counts GPUs but does not say which, and submitit's local executor gives every
job GPU 0 onwards, so two 1-GPU jobs of one node would both run on GPU 0. A job's submitter
takes its slots (all at once, under the pool's own lock, so that two 2-GPU jobs cannot each
hold one and wait for the other) and keeps them for as long as it lives: the kernel drops the
locks when the process ends, however it ends, so a killed submitter leaks no slot.

The pool is ``CUDA_VISIBLE_DEVICES`` of the caller when it lists indices (none when it names
GPUs otherwise: UUIDs, -1), else ``HOPPERLAB_GPU_SLOTS`` (a stand-in count, to exercise the
pool without CUDA), else the ``/dev/nvidia<N>`` devices of the node.
"""

from __future__ import annotations

import fcntl
import os
import re
import tempfile
import time
from pathlib import Path
from typing import IO

#: a stand-in count of GPUs (indices 0..N-1) where the node has none or CUDA is not wanted
SLOTS_ENV = "HOPPERLAB_GPU_SLOTS"
#: where the pool's lock files are (default: one folder per user in the node's temp folder)
DIR_ENV = "HOPPERLAB_GPU_SLOTS_DIR"
WAIT_POLL_S = 0.2

#: the slots this process holds: index -> its open lock file (closing it frees the slot)
_held: dict[int, IO[str]] = {}


def pool(visible: str | None, stand_in: str | None = None,
         devices: Path = Path("/dev")) -> tuple[int, ...]:
    """The GPU indices jobs of this node take slots from (see the module's docstring)."""
    words = [w.strip() for w in (visible or "").split(",") if w.strip()]
    if words and all(w.isdigit() for w in words):
        return tuple(int(w) for w in words)
    if words:  # UUIDs or -1: the caller chose its GPUs in words the pool does not number
        return ()
    if stand_in is not None and stand_in.strip():
        if not stand_in.strip().isdigit():
            raise ValueError(f"{SLOTS_ENV}={stand_in!r}: a count of GPUs (0, 1, 2, ...)")
        return tuple(range(int(stand_in)))
    found = sorted(int(m.group(1)) for p in (devices.glob("nvidia*") if devices.is_dir() else [])
                   if (m := re.fullmatch(r"nvidia(\d+)", p.name)))
    return tuple(found)


def pool_dir() -> Path:
    where = os.environ.get(DIR_ENV) or str(Path(tempfile.gettempdir())
                                           / f"hopperlab-gpu-slots-{os.getuid()}")
    path = Path(where)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _try_lock(path: Path) -> IO[str] | None:
    fh = open(path, "a+")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.close()
        return None
    return fh


def take(n: int, indices: tuple[int, ...], timeout_s: float,
         folder: Path | None = None) -> tuple[int, ...]:
    """``n`` slots of ``indices``, all at once, held until this process ends (or ``release``);
    the ones already held are given again. Waits for slots other jobs hold; TimeoutError after
    ``timeout_s``. ``n`` larger than the pool is a ValueError naming both."""
    if n > len(indices):
        raise ValueError(f"a job asks for {n} GPUs; this node's pool has {len(indices)} "
                         f"({', '.join(map(str, indices)) or 'none'})")
    mine = tuple(i for i in indices if i in _held)
    if len(mine) >= n:
        return mine[:n]
    folder = folder or pool_dir()
    deadline = time.monotonic() + timeout_s
    while True:
        with open(folder / "pool.lock", "a+") as whole:
            fcntl.flock(whole, fcntl.LOCK_EX)
            got: dict[int, IO[str]] = {}
            for i in indices:
                if len(got) + len(mine) >= n:
                    break
                if i in _held:
                    continue
                fh = _try_lock(folder / f"gpu{i}.lock")
                if fh is not None:
                    got[i] = fh
            if len(got) + len(mine) >= n:
                for i, fh in got.items():
                    fh.seek(0)
                    fh.truncate()
                    fh.write(f"{os.getpid()}\n")
                    fh.flush()
                _held.update(got)
                return tuple(sorted([*mine, *got]))
            for fh in got.values():
                fh.close()
        if time.monotonic() >= deadline:
            raise TimeoutError(f"no {n} free GPU slot(s) of {indices} in {timeout_s:.0f} s "
                               f"(held by other jobs: {folder})")
        time.sleep(WAIT_POLL_S)


def release() -> None:
    """Give back every slot this process holds."""
    for fh in _held.values():
        fh.close()
    _held.clear()
