"""The submitting side of one run: prepare its directory, launch, settle the record, upload.

This is what ``hopperlab submit`` (and so each Snakemake rule) does. A rerun never overwrites:
the previous attempt's files move to ``attempts/<n>/`` first. Whatever happens to the job, the
run directory ends with a record, and an unreachable MLflow only delays the upload.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import subprocess
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from hopperlab.config.spec import Matrix, RunSpec, spec_data_fingerprint
from hopperlab.core.errors import SpecError
from hopperlab.core import locks
from hopperlab.core import rundir as record
from hopperlab.core.rundir import (
    FAILING_STATUSES,
    RUN_UID,
    STATUSES,
    load_record,
    new_run_uid,
    read_json,
    utc_now,
    write_json_atomic,
    write_record,
)
from hopperlab.node.containers import (
    SITE_BINDS_KEY,
    SITE_EXISTING_KEY,
    SITE_IMAGE_KEY,
    start_failure,
)
from hopperlab.profiling import check_profiler
from hopperlab.run import launch, ranks, runner
from hopperlab.run.annotate import annotate_record

ATTEMPTS_DIR = "attempts"
KEPT_ACROSS_ATTEMPTS = {ATTEMPTS_DIR, record.HISTORY_FILE, locks.RUN_LOCK}
#: How long the submitting side waits for space to write a run's record on a full disk, and how
#: often it tries again.
DISK_FULL_WAIT_S = 3600.0
DISK_FULL_RETRY_S = 1.0
#: run keys the workflow was asked to redo (``--forcerun``, ``--force``, ``--forceall``; ``*``
#: for all), set by the Snakefile: those are rerun even when their record is complete
FORCED_ENV = "HOPPERLAB_FORCED_RUNS"


def checkout_commit(root: Path) -> str | None:
    """The project checkout's commit (``-dirty`` with local changes), recorded in spec.json when
    the run is submitted; None outside git. The spec itself never runs git."""
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    commit = out.stdout.strip()
    dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True, timeout=5).stdout.strip()
    return commit + ("-dirty" if dirty else "")


def previous_attempt(run_dir: Path) -> int:
    """The attempt number of what is in ``run_dir`` now (0 when it holds no run)."""
    spec_file = run_dir / record.SPEC_FILE
    if spec_file.exists():
        try:
            return int(read_json(spec_file).get("attempt", 1))
        except (ValueError, json.JSONDecodeError):
            pass
    history = run_dir / record.HISTORY_FILE
    if history.exists():
        return sum(1 for line in history.read_text().splitlines() if '"start"' in line)
    return 0


def archive_previous(run_dir: Path) -> int:
    """Move the previous attempt's files to ``attempts/<n>/``; return the new attempt number."""
    run_dir.mkdir(parents=True, exist_ok=True)
    prev = previous_attempt(run_dir)
    leftovers = [p for p in run_dir.iterdir() if p.name not in KEPT_ACROSS_ATTEMPTS]
    if prev and leftovers:
        dest = run_dir / ATTEMPTS_DIR / str(prev)
        n = 1
        while dest.exists():  # never overwrite an archive
            dest = run_dir / ATTEMPTS_DIR / f"{prev}.{n}"
            n += 1
        dest.mkdir(parents=True)
        for path in leftovers:
            shutil.move(str(path), dest / path.name)
    return prev + 1


def forced_by_workflow(key: str) -> bool:
    """Whether the workflow that started this process was asked to redo ``key``."""
    forced = os.environ.get(FORCED_ENV, "").split()
    return "*" in forced or key in forced


def _history_ended(run_dir: Path, attempt: int) -> bool:
    """Whether ``history.jsonl`` says that ``attempt`` ended (its record was settled)."""
    path = run_dir / record.HISTORY_FILE
    if not path.exists():
        return False
    for line in path.read_text().splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue  # a torn last line of a killed writer
        if entry.get("attempt") == attempt and entry.get("event") == "end":
            return True
    return False


def run_input_files(matrix: Matrix, spec: RunSpec) -> list[Path]:
    """What a run's result depends on besides its spec: its assets' manifests and its image."""
    assets = matrix.root / spec.site.assets_dir
    files = [assets / name / "MANIFEST.sha256" for name in sorted(set(spec.assets.values()))]
    if spec.site.container.image:
        files.append(matrix.root / str(spec.site.container.image_file))
    return files


def adoptable_record(matrix: Matrix, spec: RunSpec, run_dir: Path) -> dict[str, Any] | None:
    """The record of a finished attempt that can stand for a rerun of ``spec``, else None.

    An interrupted workflow (SIGINT, or SIGKILL then ``--rerun-incomplete``) leaves jobs marked
    incomplete whose runs had in fact finished, been recorded and uploaded. Such a run is
    adopted when its last attempt ended as a result (not failed or timed out), for the same
    spec fingerprint, after its inputs (assets, image) were last rebuilt. Whether the rerun
    was asked for (``--forcerun``) is the caller's to decide: a forced run never adopts.
    """
    spec_file = run_dir / record.SPEC_FILE
    rec_file = run_dir / record.RECORD_FILE
    if not (spec_file.exists() and rec_file.exists()):
        return None
    try:
        stored, rec = read_json(spec_file), read_json(rec_file)
    except (OSError, ValueError):
        return None
    attempt = stored.get("attempt")
    if (rec.get("attempt") != attempt or rec.get("status") not in STATUSES
            or rec.get("status") in FAILING_STATUSES or not _history_ended(run_dir, attempt)):
        return None
    current = json.loads(json.dumps(spec.to_dict(), default=str))
    stored_same_keys = {k: stored.get(k) for k in current}
    if spec_data_fingerprint(stored_same_keys) != spec_data_fingerprint(current):
        return None
    done = rec_file.stat().st_mtime
    if any(p.exists() and p.stat().st_mtime > done for p in run_input_files(matrix, spec)):
        return None
    return rec


def _uploaded(run_dir: Path, rec: dict[str, Any]) -> bool:
    """Whether ``mlflow.json`` says this attempt was uploaded (else the upload is due)."""
    try:
        return read_json(run_dir / record.MLFLOW_FILE).get("attempt") == rec.get("attempt")
    except (OSError, ValueError):
        return False


def _adopt(run_dir: Path, spec: RunSpec, rec: dict[str, Any], upload: Uploader | None,
           log) -> int:
    """Take a finished attempt as this submission's result: its record back as Snakemake's
    output (which Snakemake deleted as incomplete), a history line, the upload if missing."""
    write_record(run_dir, rec)
    _append_history(run_dir, {"attempt": rec["attempt"], "event": "adopted", "time": utc_now(),
                              "status": rec["status"]})
    log(f"[hopperlab] {spec.key}: attempt {rec['attempt']} had finished ({rec['status']}) with "
        f"this spec; adopted, not rerun (`--forcerun` reruns it)")
    if upload and not _uploaded(run_dir, rec):
        upload(run_dir, spec.site.tracking_uri, log)  # interrupted before its upload
    return 0


def _append_history(run_dir: Path, entry: dict[str, Any]) -> None:
    with open(run_dir / record.HISTORY_FILE, "a") as fh:
        fh.write(json.dumps(entry) + "\n")


def _copy_logs(run_dir: Path, outcome: Any) -> str | None:
    """Copy the job's stdout/stderr into ``logs/``; on a full disk, why not (partial copy gone)."""
    copies = [(run_dir / "logs", src, name)
              for src, name in ((outcome.stdout, "job.out"), (outcome.stderr, "job.err"))]
    for rank, (out, err) in enumerate(getattr(outcome, "task_logs", None) or []):
        logs_r = run_dir / ranks.RANKS_DIR / str(rank) / "logs"  # each rank's own output
        copies += [(logs_r, out, "job.out"), (logs_r, err, "job.err")]
    for logs, src, name in copies:
        if src is not None and Path(src).exists():
            try:
                logs.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, logs / name)
            except OSError as exc:
                if not is_disk_full(exc):
                    raise
                (logs / name).unlink(missing_ok=True)  # its space is what the record needs
                return disk_full_reason(logs / name, exc)
    return None


def is_disk_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def _mount_of(path: Path) -> tuple[str, str]:
    """(device, mount point) of the filesystem holding ``path``, from /proc/self/mounts."""
    path = Path(os.path.realpath(path))
    best = ("", "/")
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        fields = line.split()
        if len(fields) < 2:
            continue
        device, mount = (re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), f)
                         for f in fields[:2])
        if (path == Path(mount) or Path(mount) in path.parents) and len(mount) >= len(best[1]):
            best = (device, mount)
    return best


def disk_full_reason(path: Path, exc: BaseException | None = None) -> str:
    """``no space left on <device> mounted at <mount> (writing <path>)``, for the record."""
    device, mount = _mount_of(path)
    what = "quota exceeded" if getattr(exc, "errno", None) == errno.EDQUOT else "no space left"
    return f"{what} on {device or 'the filesystem'} mounted at {mount} (writing {path})"


def _when_space(write: Callable[[], None], path: Path, log=print) -> bool:
    """Run ``write()``; on a full disk retry until there is space (or ``DISK_FULL_WAIT_S``).

    A full disk after the job must still end in a record: it is written when space is back.
    """
    deadline = time.monotonic() + DISK_FULL_WAIT_S
    said = False
    while True:
        try:
            write()
            return True
        except OSError as exc:
            if not is_disk_full(exc):
                raise
            if not said:
                log(f"[hopperlab] {disk_full_reason(path, exc)}; waiting up to "
                    f"{DISK_FULL_WAIT_S:.0f} s for space to write it")
                said = True
            if time.monotonic() >= deadline:
                log(f"[hopperlab] gave up writing {path}: still {disk_full_reason(path, exc)}")
                return False
            time.sleep(DISK_FULL_RETRY_S)


def _last_error_line(outcome: Any) -> str:
    """The last line of the job's stderr that names an exception (else its last line)."""
    lines: list[str] = []
    if outcome.stderr is not None and Path(outcome.stderr).exists():
        lines = [ln.strip() for ln in Path(outcome.stderr).read_text(errors="replace").splitlines()
                 if ln.strip()]
    errors = [ln for ln in lines if re.match(r"^[\w.]+(Error|Exception|Interrupt|Exit)\b", ln)
              or "DUE TO TIME LIMIT" in ln or "CANCELLED" in ln]
    return (errors or lines or [""])[-1][-1500:]


def _settle_record(run_dir: Path, spec: RunSpec, attempt: int, outcome: Any,
                   uid: str | None = None) -> dict[str, Any]:
    """The job's own record, or one made here for a job that died before it could write it;
    with the attempt's uid (its identity in MLflow).

    A time limit wins over what the job said while it was being stopped (a local job sees its
    end as KeyboardInterrupt). Nothing is written here: ``_write_settled`` does that.
    """
    rec = load_record(run_dir)
    if spec.resources.distributed and (rec is None or rec.get("attempt") != attempt):
        rec = ranks.merged_record(run_dir, attempt, spec.resources.world_size) or rec
        if rec is not None and rec.get("attempt") == attempt:
            ranks.write_run_files(run_dir, rec)  # the failing rank's traceback, rank 0's steps
    if rec is None or rec.get("attempt") != attempt:
        status = "timeout" if outcome.timed_out else "failed"
        tail = _last_error_line(outcome)
        container = _container_failure(spec, outcome)
        hardware_file = run_dir / record.HARDWARE_FILE
        rec = {
            "key": spec.key, "family": spec.family, "experiment": spec.experiment,
            "variant": spec.variant, "attempt": attempt, "status": status,
            "reason": container or _died_reason(outcome, tail),
            "metrics": {}, "tags": {}, "started_at": None, "finished_at": utc_now(),
            "duration_s": None,
            "hardware": read_json(hardware_file) if hardware_file.exists() else {},
            "slurm": None,
        }
    elif outcome.timed_out and rec.get("status") == "failed":
        rec = {**rec, "status": "timeout", "reason": _timeout_reason(outcome, rec.get("reason"))}
    if uid:
        rec[RUN_UID] = uid
    if outcome.job_id:
        rec["slurm"] = {**(rec.get("slurm") or {}), "job_id": outcome.job_id,
                        "state": outcome.state}
    annotate_record(rec, spec)
    return rec


def _container_failure(spec: RunSpec, outcome: Any) -> str | None:
    """One line naming the site file and key, when the job's container could not start."""
    c = spec.site.container
    if not c.image:
        return None
    text = ""
    for path in (outcome.stderr, outcome.stdout):
        if path is not None and Path(path).exists():
            text += Path(path).read_text(errors="replace") + "\n"
    line = start_failure(text)
    if line is None:
        return None
    key = SITE_EXISTING_KEY if c.existing else SITE_IMAGE_KEY
    if c.binds and "bind" in line.lower() and any(b.split(":")[0] in line for b in c.binds):
        key = SITE_BINDS_KEY  # one of the site's own binds is what failed
    return (f"{spec.site.source}: {key}: the job could not start its container "
            f"({c.runtime}, {c.image_file}): {line[:500]}")


def _died_reason(outcome: Any, tail: str) -> str:
    """Why a job left no record: a full disk it reported, else the scheduler state and its
    last error line."""
    enospc = re.search(r"\[Errno 28\][^'\"]*['\"]([^'\"]+)['\"]", tail)
    if enospc:
        return disk_full_reason(Path(enospc.group(1))) + f" in the job: {tail}"
    if outcome.reason:
        return outcome.reason + (f"; the job was stopped in: {tail}" if tail else "")
    return (f"job ended in scheduler state {outcome.state} before writing its record"
            + (f": {tail}" if tail else ""))


def _timeout_reason(outcome: Any, job_reason: str | None) -> str:
    said = outcome.reason or f"time limit reached (scheduler state {outcome.state})"
    return said + (f"; the job was stopped in: {job_reason}" if job_reason else "")


def _disk_full_record(rec: dict[str, Any], reason: str) -> dict[str, Any]:
    """The run failed: its directory could not be completed on this disk."""
    before = rec.get("status")
    was = f"; the job had ended {before}" + (f": {rec['reason']}" if rec.get("reason") else "")
    return {**rec, "status": "failed", "reason": reason + (was if before else "")}


def _write_settled(run_dir: Path, rec: dict[str, Any], disk_full: str | None,
                   log=print) -> tuple[dict[str, Any], bool]:
    """Write the record; a full disk (``disk_full``: met before) makes it a disk-full failure,
    written once space is back. Returns the record as written and whether it was written."""
    if disk_full:
        rec = _disk_full_record(rec, disk_full)
    try:
        write_record(run_dir, rec)
        return rec, True
    except OSError as exc:
        if not is_disk_full(exc):
            raise
        if not disk_full:
            rec = _disk_full_record(rec, disk_full_reason(run_dir / record.RECORD_FILE, exc))
    return rec, _when_space(lambda: write_record(run_dir, rec), run_dir / record.RECORD_FILE, log)


#: uploads a settled run directory to a tracking URI, saying what went wrong instead of raising
#: (``hopperlab.results.tracking.upload_quietly``; the command line passes it in, so that this
#: layer never imports the results layer)
Uploader = Callable[[Path, str, Callable[[str], None]], bool]


def submit(matrix: Matrix, key: str, *, upload: Uploader | None = None,
           executor: str | None = None, adopt: bool = False, log=print) -> int:
    """Run ``key`` through the site's executor; return the exit code for the Snakemake rule.

    ``upload`` (None: leave MLflow for ``hopperlab sync``) takes the settled run directory.

    With ``adopt``, a finished attempt of the same spec is taken instead (``adoptable_record``).
    The run directory is locked against a second writer, and a results folder held by another
    workflow than the one that started this process is refused (``hopperlab.core.locks``).
    """
    spec = matrix.get(key)
    if executor:
        spec = replace(spec, site=replace(spec.site, executor=executor))
    if spec.site.executor == "debug" and spec.resources.distributed:
        raise SpecError(f"{key}: {spec.resources.world_size} tasks cannot run in-process "
                        f"(debug executor); submit it through the site's executor")
    run_dir = matrix.root / spec.run_dir
    check_profiler(spec)  # e.g. profiler=nsys where no nsys is: refused before anything runs
    launch.container_runtime(spec)  # a container site without its runtime here: refused too
    locks.check_free(locks.results_lock_path(matrix.results_dir),
                     f"results folder {matrix.results_dir}", allowed=locks.workflow_holders())
    run_dir.mkdir(parents=True, exist_ok=True)
    with locks.holding(run_dir / locks.RUN_LOCK, f"run directory {run_dir}"):
        rec = adoptable_record(matrix, spec, run_dir) if adopt else None
        if rec is not None:
            return _adopt(run_dir, spec, rec, upload, log)
        return _submit_locked(spec, run_dir, upload, log, checkout_commit(matrix.root))


def _submit_locked(spec: RunSpec, run_dir: Path, upload: Uploader | None, log,
                   commit: str | None) -> int:
    key = spec.key
    attempt = archive_previous(run_dir)
    spec_data = spec.to_dict()
    spec_data["attempt"] = attempt
    spec_data[RUN_UID] = new_run_uid()
    spec_data["git_commit"] = commit
    spec_file = run_dir / record.SPEC_FILE
    write_json_atomic(spec_file, spec_data)
    if spec.knobs.profiler == "nsys":
        (run_dir / "artifacts" / "profile").mkdir(parents=True, exist_ok=True)
        for rank in range(spec.resources.world_size if spec.resources.distributed else 0):
            (run_dir / ranks.RANKS_DIR / str(rank) / "artifacts" / "profile").mkdir(
                parents=True, exist_ok=True)  # each rank's nsys report (launch.job_python)
    _append_history(run_dir, {"attempt": attempt, "event": "start", "time": utc_now(),
                              "executor": spec.site.executor})
    log(f"[hopperlab] {key}: attempt {attempt} via {spec.site.executor}")
    outcome = launch.run_job(
        spec, run_dir, runner.execute, str(spec_file.resolve()),
        on_submitted=lambda job_id: log(f"[hopperlab] {key}: job {job_id} submitted"), log=log)
    disk_full = _copy_logs(run_dir, outcome)
    rec = _settle_record(run_dir, spec, attempt, outcome, spec_data[RUN_UID])
    rec, written = _write_settled(run_dir, rec, disk_full, log)
    end = {"attempt": attempt, "event": "end", "time": utc_now(), "status": rec["status"],
           "job_id": outcome.job_id, "state": outcome.state}
    written = written and _when_space(lambda: _append_history(run_dir, end),
                                      run_dir / record.HISTORY_FILE, log)
    log(f"[hopperlab] {key}: {rec['status']}" + (f" ({rec['reason']})" if rec["reason"] else ""))
    if not written:
        return 1
    if upload:
        upload(run_dir, spec.site.tracking_uri, log)
    return 1 if rec["status"] in FAILING_STATUSES else 0
