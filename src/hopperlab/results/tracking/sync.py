"""``hopperlab sync``: upload every run directory the store does not have yet (the store, not
``mlflow.json``, says what it has)."""

from __future__ import annotations

import contextlib
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from hopperlab.core.progress import track
from hopperlab.core.rundir import (
    METRICS_FILE,
    MLFLOW_FILE,
    RECORD_FILE,
    RUN_UID,
    load_record,
    read_json,
)
from hopperlab.core.secrets import redact_uri
from hopperlab.results.tracking.client import (
    TrackingUnavailable,
    mlflow_client,
    require_reachable,
    retry,
    scrub,
    sqlite_path,
    store_lock,
    translate_errors,
)
from hopperlab.results.tracking.layout import TAG_RUN_UID, TAG_UPLOADED, prepare
from hopperlab.results.tracking.upload import (
    RunFiles,
    UploadInProgress,
    find_spec,
    read_run,
    run_uid,
    upload_run_files,
    write_mlflow_json,
)

log = logging.getLogger(__name__)


@dataclass
class SyncReport:
    uploaded: list[str] = field(default_factory=list)  # run keys
    already: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)  # (run dir or key, why)
    #: runs another uploader (another host's sync or job) was uploading: left to it
    busy: list[str] = field(default_factory=list)
    unavailable: bool = False  # the server went away part-way; the rest was not tried
    #: runs the store had and whose mlflow.json already said so (nothing to do; ``already``
    #: lists those whose mlflow.json had to be rewritten)
    in_sync: list[str] = field(default_factory=list)

    @property
    def counts(self) -> dict[str, int]:
        return {"uploaded": len(self.uploaded), "already": len(self.already),
                "failed": len(self.failed)}

    def __str__(self) -> str:
        c = self.counts
        present = c["already"] + len(self.in_sync)
        total = c["uploaded"] + present + c["failed"]
        text = (f"{total} run{'s' * (total != 1)}: {c['uploaded']} uploaded, {present} already "
                f"in MLflow, {c['failed']} failed")
        if self.failed:  # which, and why: "1 failed" alone leaves the user to guess
            text += " (" + "; ".join(f"{run}: {_why(why)}" for run, why in
                                     self.failed[:SHOWN_FAILURES])
            more = len(self.failed) - SHOWN_FAILURES
            text += f"; and {more} more)" if more > 0 else ")"
        if self.busy:
            text += f", {len(self.busy)} being uploaded by another uploader (left to it)"
        return text + (" (MLflow became unreachable)" if self.unavailable else "")


#: failed runs a sync report names, with their reasons (the rest are counted)
SHOWN_FAILURES = 3


def _why(text: str) -> str:
    """A failure's reason on one line: its first line, cut, without credentials."""
    first = (scrub(str(text)).strip().splitlines() or ["no reason given"])[0]
    return first if len(first) <= 200 else first[:199] + "…"


#: folders under a run directory that hold no run of their own: its artifacts, its logs, and the
#: per-rank records of a distributed run (merged into the run's own by rank 0)
_SKIP_PARTS = {"artifacts", "logs", "ranks"}


def find_run_dirs(results_dir: Path) -> list[Path]:
    """Every run directory and archived attempt under ``results_dir`` that holds a record."""
    results_dir = Path(results_dir)
    found: set[Path] = set()
    for name in (METRICS_FILE, RECORD_FILE):
        for path in results_dir.rglob(name):
            rel = path.parent.relative_to(results_dir).parts
            if _SKIP_PARTS.intersection(rel):
                continue
            found.add(path.parent)
    return sorted(found)


def is_synced(run_dir: Path, tracking_uri: str, record: Mapping[str, Any] | None = None,
              run_id: str | None = None) -> bool:
    """Whether ``mlflow.json`` says this attempt (its run uid) went to this tracking URI (as
    ``run_id``, when given). Only what the run directory says: ``sync`` asks the store."""
    path = Path(run_dir) / MLFLOW_FILE
    if not path.exists():
        return False
    record = record if record is not None else load_record(run_dir)
    try:
        info = read_json(path)
    except (OSError, ValueError):
        return False
    if record is None:
        return False
    uid = run_uid(record, find_spec(Path(run_dir)))
    return (int(info.get("attempt", -1)) == int(record.get("attempt") or 1)
            and info.get(RUN_UID) == uid
            and info.get("tracking_uri") == redact_uri(tracking_uri)
            and bool(info.get("run_id")) and info.get("run_id") == (run_id or info["run_id"]))


def stored_uploads(tracking_uri: str, families: Iterable[str]) -> dict[str, tuple[str, str]]:
    """run uid -> (MLflow run id, experiment id) of every complete upload of these families in
    the store: what ``sync`` compares the run directories with."""
    out: dict[str, tuple[str, str]] = {}
    flt = f"tags.`{TAG_UPLOADED}` = 'true'"
    with translate_errors(tracking_uri):
        require_reachable(tracking_uri)
        sqlite = sqlite_path(tracking_uri) is not None
        with store_lock(tracking_uri) if sqlite else contextlib.nullcontext():
            client = mlflow_client(tracking_uri)
            for family in sorted(set(families)):
                exp = retry(client.get_experiment_by_name, family)
                if exp is None or exp.lifecycle_stage == "deleted":
                    continue
                token = None
                while True:
                    page = retry(client.search_runs, [exp.experiment_id], filter_string=flt,
                                  max_results=1000, page_token=token)
                    for r in page:
                        uid = r.data.tags.get(TAG_RUN_UID)
                        if uid:
                            out[uid] = (r.info.run_id, exp.experiment_id)
                    token = page.token
                    if not token:
                        break
    return out


def sync(results_dir: Path, tracking_uri: str, *, progress: bool | None = None) -> SyncReport:
    """Upload every run directory under ``results_dir`` that the store at ``tracking_uri``
    lacks, once each.

    The store is asked for each run's uid (``mlflow.json`` may be stale: an emptied, replaced or
    copied store). A run the store has but ``mlflow.json`` does not say so is counted as
    ``already`` and its ``mlflow.json`` rewritten. Raises TrackingUnavailable if the store
    cannot be reached at the start, TrackingError if it cannot be read; if it goes away
    part-way the report says so and lists what failed.
    """
    report = SyncReport()
    runs: list[RunFiles] = []
    for run_dir in find_run_dirs(results_dir):
        try:
            runs.append(read_run(run_dir))
        except Exception as exc:  # a broken record must not stop the others
            report.failed.append((str(run_dir), str(exc)))
    if not runs:
        return report
    stored = stored_uploads(tracking_uri, {r.family for r in runs})
    todo: list[RunFiles] = []
    for run in runs:
        if run.uid not in stored:
            todo.append(run)
            continue
        run_id, experiment_id = stored[run.uid]
        if not is_synced(run.run_dir, tracking_uri, run.record, run_id):
            write_mlflow_json(run, run_id, experiment_id, tracking_uri)
            report.already.append(run.key)
        else:
            report.in_sync.append(run.key)
    if not todo:
        return report

    prepare(tracking_uri, {(r.family, r.experiment) for r in todo})
    if progress is None:
        progress = len(todo) >= 20 and sys.stderr.isatty()
    for run in track(todo, f"uploading to {redact_uri(tracking_uri)}", show=progress):
        try:
            _, created = upload_run_files(run, tracking_uri)
        except UploadInProgress:
            report.busy.append(run.key)
            continue
        except TrackingUnavailable as exc:
            report.unavailable = True
            report.failed.append((run.key, str(exc)))
            break
        except Exception as exc:
            log.warning("cannot upload %s: %s", run.run_dir, scrub(str(exc)))
            report.failed.append((run.key, scrub(str(exc))))
            continue
        (report.uploaded if created else report.already).append(run.key)
    return report

