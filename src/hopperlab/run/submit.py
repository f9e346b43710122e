"""The submitting side of one run: prepare its directory, launch, settle the record, upload.

This is what ``hopperlab submit`` (and so each Snakemake rule) does. A rerun never overwrites:
the previous attempt's files move to ``attempts/<n>/`` first. Whatever happens to the job, the
run directory ends with a record, and an unreachable MLflow only delays the upload.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from hopperlab import backends
from hopperlab.backends.base import CANCEL_WAIT_S, Launcher, SchedulerDown
from hopperlab.config.spec import Matrix, RunSpec, spec_data_fingerprint
from hopperlab.core import locks
from hopperlab.core import rundir as record
from hopperlab.core.errors import SpecError
from hopperlab.core.rundir import (
    FAILING_STATUSES,
    RUN_UID,
    STATUSES,
    STOPPED_BY_SUBMITTER,
    load_record,
    new_run_uid,
    read_json,
    record_time,
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
from hopperlab.run import attempts, launch, processes, ranks, runner, scheduler
from hopperlab.run.annotate import annotate_record

#: How long the submitting side waits for space to write a run's record on a full disk, and how
#: often it tries again.
DISK_FULL_WAIT_S = 3600.0
DISK_FULL_RETRY_S = 1.0
#: how long past its collective timeout a rank may run on after a peer failed before the job
#: is taken for hung and cancelled (the healthy peers record their own timeouts first)
HUNG_RANK_GRACE_S = 15.0
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


def forced_by_workflow(key: str) -> bool:
    """Whether the workflow that started this process was asked to redo ``key``."""
    forced = os.environ.get(FORCED_ENV, "").split()
    return "*" in forced or key in forced


def run_input_files(matrix: Matrix, spec: RunSpec) -> list[Path]:
    """What a run's result depends on besides its spec: its assets' manifests and its image."""
    assets = matrix.root / spec.site.assets_dir
    files = [assets / name / "MANIFEST.sha256" for name in sorted(set(spec.assets.values()))]
    if spec.site.container.image:
        files.append(matrix.root / str(spec.site.container.image_file))
    return files


def adoptable_attempt(matrix: Matrix, spec: RunSpec, run_dir: Path) -> attempts.Attempt | None:
    """The finished attempt that can stand for a rerun of ``spec``, else None.

    An interrupted workflow (SIGINT to the whole process group, or SIGKILL then
    ``--rerun-incomplete``) or a killed ``hopperlab run`` leaves runs that Snakemake redoes
    although a finished attempt of the same spec is on disk. Attempts are looked at newest
    first; one that never produced an outcome (its submitter was killed before its job ended,
    or its job never reached the scheduler) is passed over. The newest attempt with an outcome
    is adopted when that outcome is a result (not failed or timed out) of the same spec
    fingerprint, written after its inputs (assets, image) were last rebuilt. The job's own
    ``ok`` record counts even when its submitter never appended the history's ``end`` line.
    Whether the rerun was asked for (``--forcerun``) is the caller's to decide.
    """
    current = spec_data_fingerprint(json.loads(json.dumps(spec.to_dict(), default=str)))
    for attempt in attempts.found(run_dir):
        if attempts.dangling(run_dir, attempt):
            continue
        rec = attempt.record
        if (rec is None or rec.get("status") not in STATUSES
                or rec.get("status") in FAILING_STATUSES):
            return None
        if spec_data_fingerprint(attempt.spec) != current:
            return None
        done = (attempt.folder / record.RECORD_FILE).stat().st_mtime
        if any(p.exists() and p.stat().st_mtime > done for p in run_input_files(matrix, spec)):
            return None
        return attempt
    return None


def adoptable_record(matrix: Matrix, spec: RunSpec, run_dir: Path) -> dict[str, Any] | None:
    """The record of ``adoptable_attempt`` (None: nothing to adopt)."""
    found = adoptable_attempt(matrix, spec, run_dir)
    return found.record if found else None


def _uploaded(run_dir: Path, rec: dict[str, Any]) -> bool:
    """Whether ``mlflow.json`` says this attempt was uploaded (else the upload is due)."""
    data = attempts.read_object(run_dir / record.MLFLOW_FILE)
    return data is not None and bool(data) and data.get("attempt") == rec.get("attempt")


def _adopt(run_dir: Path, spec: RunSpec, found: attempts.Attempt, upload: Uploader | None,
           log) -> int:
    """Take a finished attempt as this submission's result: an archived one back in place, its
    record back as Snakemake's output (which Snakemake deleted as incomplete), its settling if
    its submitter died before (the ``end`` line, machine and price), the upload if missing."""
    if not found.current:
        attempts.restore(run_dir, found.folder)
    rec = dict(found.record or {})
    if not attempts.ended(run_dir, found.number):
        uid = found.spec.get(RUN_UID)
        if uid:
            rec[RUN_UID] = uid
        annotate_record(rec, spec)
        write_record(run_dir, rec)
        attempts.append_history(run_dir, {"attempt": found.number, "event": "end",
                                          "time": utc_now(), "status": rec["status"],
                                          "settled": "on adoption"})
    else:
        write_record(run_dir, rec)
    attempts.append_history(run_dir, {"attempt": found.number, "event": "adopted",
                                      "time": utc_now(), "status": rec["status"]})
    log(f"[hopperlab] {spec.key}: attempt {found.number} had finished ({rec['status']}) with "
        f"this spec; adopted, not rerun (`--forcerun` reruns it)")
    if upload and not _uploaded(run_dir, rec):
        upload(run_dir, spec.site.tracking_uri, log)  # interrupted before its upload
    return 0


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


def _when_space(write: Callable[[], object], path: Path, log=print) -> bool:
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


def _last_error_line(output: tuple[str, str], stop_words: tuple[str, ...] = ()) -> str:
    """The last line of the job's stderr, else stdout (``output``), that names an exception
    or holds one of the scheduler's ``stop_words`` (else the last line of stderr); a full disk
    ("[Errno 28]") wherever it was said comes first."""
    texts = [[ln.strip() for ln in text.splitlines() if ln.strip()] for text in output]
    lines = texts[0] + texts[1]
    full = [ln for ln in lines if "[Errno 28]" in ln or "[Errno 122]" in ln]
    if full:
        return full[-1][-1500:]
    for found in texts:
        errors = [ln for ln in found if re.match(r"^[\w.]+(Error|Exception|Interrupt|Exit)\b", ln)
                  or any(word in ln for word in stop_words)]
        if errors:
            return errors[-1][-1500:]
    return (texts[0] or [""])[-1][-1500:]


def _settle_record(run_dir: Path, spec: RunSpec, attempt: int, outcome: launch.JobOutcome,
                   uid: str | None = None) -> dict[str, Any]:
    """The job's own record, or one made here for a job that died before it could write it;
    with the attempt's uid (its identity in MLflow).

    A time limit wins over what the job said while it was being stopped (a local job sees its
    end as KeyboardInterrupt). Nothing is written here: ``_write_settled`` does that.
    """
    launcher = backends.launcher(spec.site.executor)
    output = _job_output(outcome)
    rec = _job_record(run_dir, spec, attempt, uid)
    if rec is None or rec.get("attempt") != attempt:
        rec = _record_of_a_dead_job(run_dir, spec, attempt, outcome, output, launcher)
    else:
        rec = _stopped_by_us(rec, outcome)
    rec = _scheduler_verdict(rec, spec, outcome, output, launcher)
    if uid:
        rec[RUN_UID] = uid
    if outcome.job_id:
        _add_scheduler_job(rec, outcome, launcher)
    annotate_record(rec, spec)
    return rec


def _job_record(run_dir: Path, spec: RunSpec, attempt: int,
                uid: str | None) -> dict[str, Any] | None:
    """What the job itself recorded of this attempt (a distributed run's ranks merged), or
    None: torn, of the wrong type, or an earlier attempt's."""
    try:
        rec = load_record(run_dir)
    except (OSError, ValueError):
        rec = None  # torn or of the wrong type: the job left no record we can use
    if rec is not None and spec_uid_differs(rec, uid):
        rec = None  # another job's (an earlier attempt's), never this attempt's
    if spec.resources.distributed and (rec is None or rec.get("attempt") != attempt):
        rec = ranks.merged_record(run_dir, attempt, spec.resources.world_size) or rec
        if rec is not None and rec.get("attempt") == attempt:
            ranks.write_run_files(run_dir, rec)  # the failing rank's traceback, rank 0's steps
    return rec


def _record_of_a_dead_job(run_dir: Path, spec: RunSpec, attempt: int,
                          outcome: launch.JobOutcome, output: tuple[str, str],
                          launcher: Launcher) -> dict[str, Any]:
    """The record of a job that left none: why it died, from its output and the scheduler."""
    tail = _last_error_line(output, launcher.stop_words)
    container = _container_failure(spec, "\n".join(output))
    hardware_file = run_dir / record.HARDWARE_FILE
    return {
        "key": spec.key, "family": spec.family, "experiment": spec.experiment,
        "variant": spec.variant, "attempt": attempt,
        "status": "timeout" if outcome.timed_out else "failed",
        "reason": container or _in_image(spec, _died_reason(outcome, tail)),
        "metrics": {}, "tags": {}, "started_at": None, "finished_at": record_time(),
        "duration_s": None,
        "hardware": read_json(hardware_file) if hardware_file.exists() else {},
        "slurm": None,
    }


def _stopped_by_us(rec: dict[str, Any], outcome: launch.JobOutcome) -> dict[str, Any]:
    """The job's record, with a time limit or a stop of ours (a hung rank, an interrupt) said
    first."""
    if outcome.timed_out and rec.get("status") == "failed":
        return {**rec, "status": "timeout",
                "reason": _timeout_reason(outcome, rec.get("reason"))}
    if outcome.reason and rec.get("status") in FAILING_STATUSES \
            and outcome.reason not in str(rec.get("reason")):
        return {**rec, "reason": f"{outcome.reason}; {rec.get('reason')}"}
    return rec


def _scheduler_verdict(rec: dict[str, Any], spec: RunSpec, outcome: launch.JobOutcome,
                       output: tuple[str, str], launcher: Launcher) -> dict[str, Any]:
    """What the scheduler's words change: a kill for memory is a result (oom), as a
    MemoryError would be; a failed node is said before what the ranks saw (a peer gone)."""
    state = str(outcome.state or "")
    killed_for_memory = launcher.memory_kill(state, "\n".join(output))
    if killed_for_memory and rec.get("status") in FAILING_STATUSES:
        rec = {**rec, "status": "oom",
               "reason": f"{killed_for_memory} (memory asked: {spec.resources.mem_gb:g} GB per "
                         f"task; raise resources.mem_gb)"}
    kernel_oom = outcome.kernel_oom
    if kernel_oom and not killed_for_memory and rec.get("status") in FAILING_STATUSES \
            and not rec.get("started_at"):  # the job left no record of its own: it was killed
        rec = {**rec, "status": "oom", "reason": _kernel_oom_reason(outcome, kernel_oom)}
    node_failed = launcher.node_failure(state)
    if node_failed and rec.get("status") == "failed" and node_failed not in str(rec.get("reason")):
        rec = {**rec, "reason": f"{node_failed}; {rec.get('reason')}"}
    return rec


def _add_scheduler_job(rec: dict[str, Any], outcome: launch.JobOutcome,
                       launcher: Launcher) -> None:
    """The scheduler's job id and end state, and what its accounting says of the whole job
    (Slurm: its energy)."""
    rec["slurm"] = {**(rec.get("slurm") or {}), "job_id": outcome.job_id,
                    "state": outcome.state}
    metrics, tags = launcher.accounting(str(outcome.job_id))
    if tags:
        rec.setdefault("tags", {}).update(tags)
    if metrics:
        rec.setdefault("metrics", {}).update(metrics)


def _container_failure(spec: RunSpec, output: str) -> str | None:
    """One line naming the site file and key, when the job's container could not start (its
    runtime's words in the job's ``output``)."""
    c = spec.site.container
    if not c.image:
        return None
    line = start_failure(output)
    if line is None:
        return None
    key = SITE_EXISTING_KEY if c.existing else SITE_IMAGE_KEY
    if c.binds and "bind" in line.lower() and any(b.split(":")[0] in line for b in c.binds):
        key = SITE_BINDS_KEY  # one of the site's own binds is what failed
    return (f"{spec.site.source}: {key}: the job could not start its container "
            f"({c.runtime}, {c.image_file}): {line[:500]}")


def _in_image(spec: RunSpec, reason: str) -> str:
    """A job of a container site that died before its record, its runtime silent: the image is
    the first suspect (a damaged copy fails inside it, in words that name nothing)."""
    c = spec.site.container
    if not c.image or outcome_was_stopped(reason):
        return reason
    return (f"{reason}; it ran in the image {c.image_file} ({spec.site.source}: "
            f"{SITE_EXISTING_KEY if c.existing else SITE_IMAGE_KEY}): if the image is damaged "
            f"(a partial copy, a disk error), check its digest against the build's and rebuild it"
            + ("" if c.existing else f" (snakemake {c.image_file} --forcerun)"))


def outcome_was_stopped(reason: str) -> bool:
    """We stopped the job ourselves (a time limit, an interrupt): the image is no suspect."""
    return "time limit" in reason or STOPPED_BY_SUBMITTER in reason


def _job_output(outcome: Any) -> tuple[str, str]:
    """The job's stderr and stdout, read once for every question asked of them ("" for what
    it did not leave)."""
    stderr, stdout = (Path(path).read_text(errors="replace")
                      if path is not None and Path(path).exists() else ""
                      for path in (outcome.stderr, outcome.stdout))
    return stderr, stdout


def spec_uid_differs(rec: dict[str, Any], uid: str | None) -> bool:
    return bool(uid) and bool(rec.get(RUN_UID)) and rec.get(RUN_UID) != uid


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


def _kernel_oom_reason(outcome: Any, counted: str) -> str:
    """The kernel killed a job of this host for memory: its own words, and the way out."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 30)
        host = f"this host has {total:.0f} GiB"
    except (OSError, ValueError):
        host = "this host's memory is too small for it"
    return (f"killed by the kernel's out-of-memory killer ({counted}); {host}: run a smaller "
            f"scale or on a machine with more memory")


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

    With ``adopt``, a finished attempt of the same spec is taken instead (``adoptable_attempt``).
    The run directory is locked against a second writer, and a results folder held by another
    workflow than the one that started this process is refused (``hopperlab.core.locks``).
    Nothing is moved before the scheduler is known to take jobs, a job still running an
    earlier attempt is awaited (same spec) or cancelled (changed spec) first, and SIGINT or
    SIGTERM while the job runs cancels it and settles the attempt before the process exits.
    """
    spec = matrix.get(key)
    if executor:
        spec = replace(spec, site=replace(spec.site, executor=executor))
    if not spec.site.backend.multi_task and spec.resources.distributed:
        raise SpecError(f"{key}: {spec.resources.world_size} tasks cannot run "
                        f"{spec.site.backend.placement} ({spec.site.executor} executor); submit "
                        f"it through the site's executor")
    run_dir = matrix.root / spec.run_dir
    check_profiler(spec)  # e.g. profiler=nsys where no nsys is: refused before anything runs
    launch.container_runtime(spec)  # a container site without its runtime here: refused too
    backends.launcher(spec.site.executor).check_reachable(spec.site.source)  # Slurm down: too
    locks.check_free(locks.results_lock_path(matrix.results_dir),
                     f"results folder {matrix.results_dir}", allowed=locks.workflow_holders())
    run_dir.mkdir(parents=True, exist_ok=True)
    with locks.holding(run_dir / locks.RUN_LOCK, f"run directory {run_dir}"), \
            scheduler.interrupts_raise():
        _await_earlier_job(spec, run_dir, log)
        found = adoptable_attempt(matrix, spec, run_dir) if adopt else None
        if found is not None:
            return _adopt(run_dir, spec, found, upload, log)
        if spec.processes > 1:
            return _submit_processes(spec, run_dir, upload, log, checkout_commit(matrix.root))
        return _submit_locked(spec, run_dir, upload, log, checkout_commit(matrix.root))


def _submit_processes(spec: RunSpec, run_dir: Path, upload: Uploader | None, log,
                      commit: str | None) -> int:
    """``spec.processes`` jobs of the run, one after the other (``run/processes.py``); the
    run's record made from theirs, uploaded once."""
    def one(sub: RunSpec, folder: Path) -> int:
        index = folder.name
        return _submit_locked(sub, folder, None, lambda line: log(f"{line} [process {index}]"),
                              commit)

    rec = processes.submit_processes(spec, run_dir, one, commit, log)
    log(f"[hopperlab] {spec.key}: {rec['status']} over {spec.processes} processes"
        + (f" ({rec['reason']})" if rec["reason"] else ""))
    if upload:
        upload(run_dir, spec.site.tracking_uri, log)
    return 1 if rec["status"] in FAILING_STATUSES else 0


def _await_earlier_job(spec: RunSpec, run_dir: Path, log) -> None:
    """Never start an attempt while the scheduler still runs the last one (its submitter was
    killed before it could cancel it): wait for a job of the same spec (its result may be
    adopted), cancel one of a changed spec, and in both cases wait until it has left."""
    found = attempts.found(run_dir)
    if not found or attempts.ended(run_dir, found[0].number):
        return
    last = found[0]
    entry = attempts.submitted(run_dir, last.number)
    if entry is not None and "host" in entry:
        _await_earlier_local_job(spec, run_dir, last, entry, log)
        return
    job = entry["job_id"] if entry else None
    ops = backends.launcher(spec.site.executor)  # a job the scheduler knows by its id
    if job is None or not ops.job_active(job):
        return
    poll = max(1.0, spec.site.poll_interval_s)
    current = spec_data_fingerprint(json.loads(json.dumps(spec.to_dict(), default=str)))
    if spec_data_fingerprint(last.spec) == current:
        log(f"[hopperlab] {spec.key}: job {job} of attempt {last.number} still runs this spec; "
            f"waiting for it")
        limit_s = last_time_limit_s(last.spec) + CANCEL_WAIT_S
        if scheduler.poll_until(lambda: not ops.job_active(job), poll, limit_s):
            return
        log(f"[hopperlab] {spec.key}: job {job} still listed past its time limit; cancelling it")
        note = "cancelled: still listed past its time limit"
    else:
        note = "cancelled: its spec changed"
        log(f"[hopperlab] {spec.key}: job {job} of attempt {last.number} still runs an older "
            f"spec; cancelling it before attempt {attempts.next_attempt(run_dir)}")
    if not ops.cancel_job(job, poll):
        raise SchedulerDown(f"{spec.key}: job {job} of attempt {last.number} is still "
                                      f"queued after scancel; try again once it has left")
    _end_line(run_dir, last.number, "failed", job, "CANCELLED", note)


def _await_earlier_local_job(spec: RunSpec, run_dir: Path, last: attempts.Attempt,
                             entry: dict[str, Any], log) -> None:
    """The local job of a killed submitter: waited for (same spec) or stopped (SIGINT to its
    controller, which stops its tasks; SIGKILL if it has not ended a minute later)."""
    holder = {"host": entry.get("host"), "pid": entry.get("pid"), "start": entry.get("start")}

    def gone() -> bool:
        return locks.is_alive(holder) is not True

    if gone():
        return
    pid = int(entry["pid"])
    current = spec_data_fingerprint(json.loads(json.dumps(spec.to_dict(), default=str)))
    if spec_data_fingerprint(last.spec) == current:
        log(f"[hopperlab] {spec.key}: local job {pid} of attempt {last.number} still runs this "
            f"spec; waiting for it")
        if scheduler.poll_until(gone, 0.5, last_time_limit_s(last.spec)):
            return
    log(f"[hopperlab] {spec.key}: local job {pid} of attempt {last.number} still runs; "
        f"stopping it before attempt {attempts.next_attempt(run_dir)}")
    for sig, wait_s in ((signal.SIGINT, 60.0), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
        if scheduler.poll_until(gone, 0.2, wait_s):
            break
    _end_line(run_dir, last.number, "failed", entry.get("job_id"), "CANCELLED",
              "stopped: a later submission found it still running")


def last_time_limit_s(spec_data: dict[str, Any]) -> float:
    """An attempt's time limit in seconds, from its spec.json (an hour when it does not say)."""
    res: dict[str, Any] = (spec_data["resources"] if isinstance(spec_data.get("resources"), dict)
                           else {})
    minutes = res.get("time_min")
    if isinstance(minutes, (int, float)) and not isinstance(minutes, bool) and minutes > 0:
        return float(minutes) * 60
    return 3600.0


def _end_line(run_dir: Path, attempt: int, status: str, job_id: str | None, state: str,
              note: str | None = None) -> dict[str, Any]:
    end = {"attempt": attempt, "event": "end", "time": utc_now(), "status": status,
           "job_id": job_id, "state": state}
    if note:
        end["note"] = note
    attempts.append_history(run_dir, end)
    return end


def _not_submitted(spec: RunSpec, run_dir: Path, attempt: int, archive: Path | None,
                   reason: str, log) -> int:
    """The scheduler refused the job (a partition it does not know, a controller gone since the
    check): nothing ran. An earlier attempt stays the current one, as if this one never was;
    a run with none gets a ``failed`` record saying why. One line, exit 1: the rule fails."""
    if archive is not None:
        attempts.discard_current(run_dir)
        attempts.restore(run_dir, archive)
        attempts.append_history(run_dir, {"attempt": attempt, "event": "not-submitted",
                                          "time": utc_now(), "reason": reason})
        log(f"[hopperlab] {spec.key}: attempt {attempt} not submitted, attempt "
            f"{attempts.spec_attempt(run_dir)} kept: {reason}")
        return 1
    rec = {"key": spec.key, "family": spec.family, "experiment": spec.experiment,
           "variant": spec.variant, "attempt": attempt, "status": "failed",
           "reason": f"not submitted: {reason}", "metrics": {}, "tags": {},
           "started_at": None, "finished_at": record_time(), "duration_s": None, "hardware": {},
           "slurm": None}
    uid = (attempts.read_object(run_dir / record.SPEC_FILE) or {}).get(RUN_UID)
    if uid:
        rec[RUN_UID] = uid
    write_record(run_dir, annotate_record(rec, spec))
    _end_line(run_dir, attempt, "failed", None, "NOT_SUBMITTED")
    log(f"[hopperlab] {spec.key}: failed (not submitted: {reason})")
    return 1


def _submit_locked(spec: RunSpec, run_dir: Path, upload: Uploader | None, log,
                   commit: str | None) -> int:
    key = spec.key
    attempt = attempts.next_attempt(run_dir)
    archive = attempts.archive_current(run_dir)
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
    attempts.append_history(run_dir, {"attempt": attempt, "event": "start", "time": utc_now(),
                                      "executor": spec.site.executor})
    log(f"[hopperlab] {key}: attempt {attempt} via {spec.site.executor}")

    def submitted(job_id: str) -> None:
        # what a later submission checks (_await_earlier_job): Slurm's job id, or the local
        # job's controller process
        entry = {"attempt": attempt, "event": "submitted", "time": utc_now(), "job_id": job_id}
        handle = spec.site.backend.job_handle
        if handle == "process" and job_id.isdigit():
            entry.update(locks.process_on_this_host(int(job_id)), job_id=job_id)
        if handle != "none":
            attempts.append_history(run_dir, entry)
        log(f"[hopperlab] {key}: job {job_id} submitted")

    try:
        res = spec.resources
        hung = ranks.HangWatch(run_dir, attempt, res.world_size,
                               res.collective_timeout_s + HUNG_RANK_GRACE_S) \
            if res.distributed else None
        outcome = launch.run_job(spec, run_dir, runner.execute, str(spec_file.resolve()),
                                 on_submitted=submitted, log=log, stop_when=hung)
    except launch.NotSubmitted as exc:
        return _not_submitted(spec, run_dir, attempt, archive, str(exc), log)
    with scheduler.uninterrupted():
        disk_full = _copy_logs(run_dir, outcome)
        rec = _settle_record(run_dir, spec, attempt, outcome, spec_data[RUN_UID])
        rec, written = _write_settled(run_dir, rec, disk_full, log)
        written = written and _when_space(
            lambda: _end_line(run_dir, attempt, rec["status"], outcome.job_id, outcome.state),
            run_dir / record.HISTORY_FILE, log)
    log(f"[hopperlab] {key}: {rec['status']}" + (f" ({rec['reason']})" if rec["reason"] else ""))
    if outcome.interrupted is not None:
        raise outcome.interrupted  # settled: the process stops as it was told to
    if not written:
        return 1
    if upload:
        upload(run_dir, spec.site.tracking_uri, log)
    return 1 if rec["status"] in FAILING_STATUSES else 0
