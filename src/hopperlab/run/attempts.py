"""The attempts of one run directory: their numbers, their history, archiving and restoring.

A run directory holds its current attempt's files at the top and earlier attempts under
``attempts/<n>/``; ``history.jsonl`` says when each attempt started, which job ran it and how
it ended. Everything here reads those files defensively: a torn line, a file of the wrong JSON
type or an archive named by hand must never stop the next submission (item 10 of issue 28).
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hopperlab.core import locks
from hopperlab.core import rundir as record
from hopperlab.core.rundir import read_json

ATTEMPTS_DIR = "attempts"
KEPT_ACROSS_ATTEMPTS = {ATTEMPTS_DIR, record.HISTORY_FILE, locks.RUN_LOCK}


def read_object(path: Path) -> dict[str, Any] | None:
    """A JSON file that must hold an object: the object, else None (absent, torn, wrong type)."""
    try:
        data = read_json(path)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def history(run_dir: Path) -> list[dict[str, Any]]:
    """The lines of ``history.jsonl`` that are JSON objects (a torn or foreign line is skipped)."""
    path = Path(run_dir) / record.HISTORY_FILE
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(entry, dict):
            out.append(entry)
    return out


def append_history(run_dir: Path, entry: dict[str, Any]) -> None:
    with open(Path(run_dir) / record.HISTORY_FILE, "a") as fh:
        fh.write(json.dumps(entry) + "\n")


def _number(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def spec_attempt(folder: Path) -> int | None:
    """The attempt ``folder``'s spec.json names (None: no readable spec)."""
    spec = read_object(Path(folder) / record.SPEC_FILE)
    return _number(spec.get("attempt")) if spec else None


def next_attempt(run_dir: Path) -> int:
    """One more than any attempt this directory has seen (spec, history, archives): an attempt
    number is never given twice, even after an attempt was restored from the archive."""
    seen = [spec_attempt(run_dir) or 0]
    seen += [_number(e.get("attempt")) or 0 for e in history(run_dir)]
    for folder in archived(run_dir):
        seen.append(spec_attempt(folder) or 0)
    return max(seen) + 1


def archived(run_dir: Path) -> list[Path]:
    """The archived attempts' folders, newest attempt first."""
    root = Path(run_dir) / ATTEMPTS_DIR
    if not root.is_dir():
        return []
    folders = [p for p in root.iterdir() if p.is_dir() and re.fullmatch(r"\d+(\.\d+)?", p.name)]
    return sorted(folders, key=lambda p: tuple(int(x) for x in p.name.split(".")), reverse=True)


def events(run_dir: Path, attempt: int, event: str) -> list[dict[str, Any]]:
    return [e for e in history(run_dir) if e.get("attempt") == attempt and e.get("event") == event]


def ended(run_dir: Path, attempt: int) -> bool:
    """Whether ``history.jsonl`` says that ``attempt`` ended (its record was settled)."""
    return bool(events(run_dir, attempt, "end"))


def submitted(run_dir: Path, attempt: int) -> dict[str, Any] | None:
    """The ``submitted`` line of ``attempt``: its job id (Slurm's, or the local job's process
    with ``host`` and ``start``)."""
    for entry in reversed(events(run_dir, attempt, "submitted")):
        job = entry.get("job_id")
        if isinstance(job, str) and job:
            return entry
    return None


def job_of(run_dir: Path, attempt: int) -> str | None:
    """The scheduler's id of the job that ran ``attempt`` (from its ``submitted`` line)."""
    entry = submitted(run_dir, attempt)
    return entry["job_id"] if entry else None


def archive_current(run_dir: Path) -> Path | None:
    """Move the current attempt's files to ``attempts/<n>/`` (never over an archive); where."""
    run_dir = Path(run_dir)
    leftovers = [p for p in run_dir.iterdir() if p.name not in KEPT_ACROSS_ATTEMPTS]
    if not leftovers:
        return None
    prev = spec_attempt(run_dir) or max(
        [_number(e.get("attempt")) or 0 for e in history(run_dir)] + [0])
    dest = run_dir / ATTEMPTS_DIR / str(prev)
    n = 1
    while dest.exists():
        dest = run_dir / ATTEMPTS_DIR / f"{prev}.{n}"
        n += 1
    dest.mkdir(parents=True)
    for path in leftovers:
        shutil.move(str(path), dest / path.name)
    return dest


def discard_current(run_dir: Path) -> None:
    """Remove the current attempt's files (one that never reached the scheduler)."""
    for path in Path(run_dir).iterdir():
        if path.name in KEPT_ACROSS_ATTEMPTS:
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


def restore(run_dir: Path, folder: Path) -> None:
    """Make the archived attempt in ``folder`` the current one again (the current files go to
    the archive first)."""
    archive_current(run_dir)
    for path in list(Path(folder).iterdir()):
        shutil.move(str(path), Path(run_dir) / path.name)
    Path(folder).rmdir()
    with contextlib.suppress(OSError):  # the archive folder goes with its last attempt
        (Path(run_dir) / ATTEMPTS_DIR).rmdir()


@dataclass(frozen=True)
class Attempt:
    """One attempt as found on disk: where its files are, its spec and record (if any)."""

    folder: Path
    number: int
    spec: dict[str, Any]
    record: dict[str, Any] | None

    @property
    def current(self) -> bool:
        return self.folder.parent.name != ATTEMPTS_DIR


def found(run_dir: Path) -> list[Attempt]:
    """The current attempt, then the archived ones, newest first; those with a readable spec."""
    out = []
    for folder in [Path(run_dir), *archived(run_dir)]:
        spec = read_object(folder / record.SPEC_FILE)
        number = _number(spec.get("attempt")) if spec else None
        if spec is None or number is None:
            continue
        rec = read_object(folder / record.RECORD_FILE)
        if rec is not None and rec.get("attempt") != number:
            rec = None  # an older attempt's record (or another job's): not this attempt's
        out.append(Attempt(folder, number, spec, rec))
    return sorted(out, key=lambda a: a.number, reverse=True)


def dangling(run_dir: Path, attempt: Attempt) -> bool:
    """An attempt that never produced an outcome: no record of its own and no ``end`` line
    (its submitter was killed, or its job never reached the scheduler)."""
    return attempt.record is None and not ended(run_dir, attempt.number)
