"""The submitting side of one run: prepare its directory, launch, settle the record, upload.

This is what ``hopperlab submit`` (and so each Snakemake rule) does. A rerun never overwrites:
the previous attempt's files move to ``attempts/<n>/`` first. Whatever happens to the job, the
run directory ends with a record, and an unreachable MLflow only delays the upload.
"""

from __future__ import annotations

import importlib
import json
import re
import threading
import shutil
from pathlib import Path
from typing import Any

from hopperlab.core import rundir as record
from hopperlab.core.rundir import (FAILING_STATUSES, load_record, read_json, utc_now,
                              write_json_atomic, write_record)
from hopperlab.config.spec import Matrix, RunSpec
from hopperlab.run.annotate import annotate_record

ATTEMPTS_DIR = "attempts"
KEPT_ACROSS_ATTEMPTS = {ATTEMPTS_DIR, record.HISTORY_FILE}


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


def _append_history(run_dir: Path, entry: dict[str, Any]) -> None:
    with open(run_dir / record.HISTORY_FILE, "a") as fh:
        fh.write(json.dumps(entry) + "\n")


def _copy_logs(run_dir: Path, outcome: Any) -> None:
    logs = run_dir / "logs"
    logs.mkdir(exist_ok=True)
    for src, name in ((outcome.stdout, "job.out"), (outcome.stderr, "job.err")):
        if src is not None and Path(src).exists():
            shutil.copyfile(src, logs / name)


def _last_error_line(outcome: Any) -> str:
    """The last line of the job's stderr that names an exception (else its last line)."""
    lines: list[str] = []
    if outcome.stderr is not None and Path(outcome.stderr).exists():
        lines = [ln.strip() for ln in Path(outcome.stderr).read_text(errors="replace").splitlines()
                 if ln.strip()]
    errors = [ln for ln in lines if re.match(r"^[\w.]+(Error|Exception|Interrupt|Exit)\b", ln)
              or "DUE TO TIME LIMIT" in ln or "CANCELLED" in ln]
    return (errors or lines or [""])[-1][-1500:]


def _settle_record(run_dir: Path, spec: RunSpec, attempt: int, outcome: Any) -> dict[str, Any]:
    """The job's own record, or one written here for a job that died before it could."""
    rec = load_record(run_dir)
    if rec is None or rec.get("attempt") != attempt:
        status = "timeout" if outcome.timed_out else "failed"
        tail = _last_error_line(outcome)
        hardware_file = run_dir / record.HARDWARE_FILE
        rec = {
            "key": spec.key, "family": spec.family, "experiment": spec.experiment,
            "variant": spec.variant, "attempt": attempt, "status": status,
            "reason": f"job ended in scheduler state {outcome.state} before writing its record"
                      + (f": {tail}" if tail else ""),
            "metrics": {}, "tags": {}, "started_at": None, "finished_at": utc_now(),
            "duration_s": None,
            "hardware": read_json(hardware_file) if hardware_file.exists() else {},
            "slurm": None,
        }
    if outcome.job_id:
        rec["slurm"] = {**(rec.get("slurm") or {}), "job_id": outcome.job_id,
                        "state": outcome.state}
    annotate_record(rec, spec)
    write_record(run_dir, rec)
    return rec


def submit(matrix: Matrix, key: str, *, upload: bool = True, executor: str | None = None,
           log=print) -> int:
    """Run ``key`` through the site's executor; return the exit code for the Snakemake rule."""
    from hopperlab.run import launch
    from hopperlab.run import runner

    spec = matrix.get(key)
    if executor:
        from dataclasses import replace
        spec = replace(spec, site=replace(spec.site, executor=executor))
    run_dir = matrix.root / spec.run_dir
    from hopperlab.profiling import check_profiler

    check_profiler(spec)  # e.g. profiler=nsys where no nsys is: refused before anything runs
    attempt = archive_previous(run_dir)
    spec_data = spec.to_dict()
    spec_data["attempt"] = attempt
    spec_file = run_dir / record.SPEC_FILE
    write_json_atomic(spec_file, spec_data)
    if spec.knobs.profiler == "nsys":
        (run_dir / "artifacts" / "profile").mkdir(parents=True, exist_ok=True)
    _append_history(run_dir, {"attempt": attempt, "event": "start", "time": utc_now(),
                              "executor": spec.site.executor})
    log(f"[hopperlab] {key}: attempt {attempt} via {spec.site.executor}")
    if upload:
        # importing MLflow takes ~2 s of CPU: do it while the job runs, not after it
        threading.Thread(target=importlib.import_module, args=("mlflow",),
                         daemon=True).start()
    outcome = launch.run_job(
        spec, run_dir, runner.execute, str(spec_file.resolve()),
        on_submitted=lambda job_id: log(f"[hopperlab] {key}: job {job_id} submitted"))
    _copy_logs(run_dir, outcome)
    rec = _settle_record(run_dir, spec, attempt, outcome)
    _append_history(run_dir, {"attempt": attempt, "event": "end", "time": utc_now(),
                              "status": rec["status"], "job_id": outcome.job_id,
                              "state": outcome.state})
    log(f"[hopperlab] {key}: {rec['status']}" + (f" ({rec['reason']})" if rec["reason"] else ""))
    if upload:
        upload_quietly(run_dir, spec.site.tracking_uri, log)
    return 1 if rec["status"] in FAILING_STATUSES else 0


def upload_quietly(run_dir: Path, tracking_uri: str, log=print) -> bool:
    """Upload a run; on any tracking trouble say so and keep going (``hopperlab sync`` later)."""
    from hopperlab.results import tracking

    try:
        tracking.upload_run(run_dir, tracking_uri)
        return True
    except tracking.TrackingUnavailable as exc:
        log(f"[hopperlab] MLflow unreachable ({exc}); the run is on disk in {run_dir}; "
            f"run `hopperlab sync` once the server is back")
    except Exception as exc:  # noqa: BLE001 - tracking trouble never loses the run
        log(f"[hopperlab] upload of {run_dir} failed: {type(exc).__name__}: {exc}; "
            f"`hopperlab sync` retries it")
    return False
