"""A run measured in ``processes`` independent jobs (``--config processes=N``).

Why: windows inside one process agree more closely than processes do, so the spread a
reference needs is the spread between processes (docs/benchmarks/noise.md). Each process is a
whole job of its own (``processes/<i>/`` of the run directory, submitted one after the other so
that they never measure side by side; on Slurm each is a job of its own and may land on
another node), and the run's record is made from them: ``processes`` lists each one's status,
node, scheduler job and median per metric, the metrics are the median of those medians, and
``samples.jsonl`` holds every window with the process it came from.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from hopperlab.config.spec import RunSpec
from hopperlab.core import rundir as record
from hopperlab.core.rundir import (
    FAILING_STATUSES,
    RUN_UID,
    load_record,
    new_run_uid,
    read_samples,
    record_time,
    utc_now,
    write_json_atomic,
    write_record,
    write_text_atomic,
)
from hopperlab.core.stats import aggregate_samples
from hopperlab.run import attempts
from hopperlab.run.annotate import annotate_record
from hopperlab.run.repeats import stat_metrics
from hopperlab.workloads import family_info

PROCESSES_DIR = "processes"
#: what submits one process: (its spec, its directory) -> the rule's exit code
SubmitOne = Callable[[RunSpec, Path], int]


def process_spec(spec: RunSpec, index: int) -> RunSpec:
    """Process ``index`` of ``spec``: the same run, measured once as a process of its own."""
    return replace(spec, processes=1,
                   run_dir=str(Path(spec.run_dir) / PROCESSES_DIR / str(index)))


def submit_processes(spec: RunSpec, run_dir: Path, submit_one: SubmitOne,
                     commit: str | None, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Submit ``spec.processes`` jobs one after the other, then write the run's record from
    theirs (also when an interrupt stops the series: the processes that ended are kept)."""
    attempt = attempts.next_attempt(run_dir)
    attempts.archive_current(run_dir)
    spec_data = {**spec.to_dict(), "attempt": attempt, RUN_UID: new_run_uid(),
                 "git_commit": commit}
    write_json_atomic(run_dir / record.SPEC_FILE, spec_data)
    attempts.append_history(run_dir, {"attempt": attempt, "event": "start", "time": utc_now(),
                                      "executor": spec.site.executor,
                                      "processes": spec.processes})
    log(f"[hopperlab] {spec.key}: attempt {attempt} in {spec.processes} independent processes")
    folders: list[Path] = []
    try:
        for i in range(spec.processes):
            folder = run_dir / PROCESSES_DIR / str(i)
            folder.mkdir(parents=True, exist_ok=True)
            folders.append(folder)
            submit_one(process_spec(spec, i), folder)
    finally:
        rec = merged_record(spec, folders, attempt, spec_data[RUN_UID])
        write_samples(run_dir, folders)
        write_record(run_dir, rec)
        attempts.append_history(run_dir, {"attempt": attempt, "event": "end",
                                          "time": utc_now(), "status": rec["status"]})
    return rec


#: a repeated run's own statistics of a metric (``core.stats.aggregate_samples``): made again
#: over the processes, never carried from one process
_STATS = ("_ci_low", "_ci_high", "_cv", "_n")


def process_median(folder: Path, rec: dict[str, Any]) -> dict[str, float]:
    """One process's figure per metric: the median of its windows where its windows have the
    metric, else its record's (the figures measured over the whole process, as the energy
    meter's joules and power: windows hold only what each window measured)."""
    figures = {k: float(v) for k, v in (rec.get("metrics") or {}).items()
               if isinstance(v, (int, float)) and not isinstance(v, bool)
               and not k.endswith(_STATS)}
    windows = read_samples(folder)
    if windows:
        figures.update(aggregate_samples(windows, ()))
    return figures


def _process_entry(index: int, folder: Path, rec: dict[str, Any] | None) -> dict[str, Any]:
    if rec is None:
        return {"process": index, "status": "failed", "reason": f"{folder}: left no record",
                "node": None, "job_id": None, "windows": 0, "metrics": {}}
    return {"process": index, "status": rec.get("status"), "reason": rec.get("reason"),
            "node": (rec.get("hardware") or {}).get("hostname"),
            "job_id": (rec.get("slurm") or {}).get("job_id"),
            "started_at": rec.get("started_at"), "finished_at": rec.get("finished_at"),
            "windows": len(read_samples(folder)),
            "metrics": process_median(folder, rec) if rec.get("status") == "ok" else {}}


def _status(entries: list[dict[str, Any]], wanted: int) -> tuple[str, str | None]:
    """The run's status: its processes' when they agree, else the first failing one's."""
    if len(entries) < wanted:
        done = len(entries)
        failing = next((e for e in entries if e["status"] in FAILING_STATUSES), None)
        why = (f"process {failing['process']}: {failing['reason']}" if failing else
               f"stopped after {done} of {wanted} processes")
        return (failing["status"] if failing else "failed"), why
    failing = next((e for e in entries if e["status"] in FAILING_STATUSES), None)
    if failing:
        return failing["status"], f"process {failing['process']}: {failing['reason']}"
    statuses = {e["status"] for e in entries}
    if len(statuses) == 1:
        return entries[0]["status"], entries[0]["reason"]
    said = ", ".join(f"process {e['process']} {e['status']}" for e in entries)
    return "failed", f"the processes disagree: {said}"


def merged_record(spec: RunSpec, folders: list[Path], attempt: int, uid: str) -> dict[str, Any]:
    """The run's record from its processes' (``processes``: one entry each)."""
    recs = [load_record(f) for f in folders]
    entries = [_process_entry(i, f, r) for i, (f, r) in enumerate(zip(folders, recs))]
    status, reason = _status(entries, spec.processes)
    base = next((r for r in recs if r and r.get("status") == "ok"),
                next((r for r in recs if r), None))
    rec: dict[str, Any] = dict(base) if base else {
        "key": spec.key, "family": spec.family, "experiment": spec.experiment,
        "variant": spec.variant, "metrics": {}, "tags": {}, "hardware": {}, "slurm": None,
        "duration_s": None}
    ok = [e["metrics"] for e in entries if e["status"] == "ok"]
    info = family_info(spec.family)
    rec.update({
        "attempt": attempt, RUN_UID: uid, "status": status, "reason": reason,
        "metrics": aggregate_samples(ok, stat_metrics(spec, info)) if ok else {},
        "processes": entries,
        "started_at": next((e.get("started_at") for e in entries if e.get("started_at")),
                           rec.get("started_at")),
        "finished_at": record_time()})
    tags = dict(rec.get("tags") or {})
    tags["processes"] = str(spec.processes)
    tags["process_nodes"] = ",".join(sorted({str(e["node"]) for e in entries if e["node"]}))
    rec["tags"] = tags
    return annotate_record(rec, spec)


def write_samples(run_dir: Path, folders: list[Path]) -> None:
    """``samples.jsonl`` of the run: every process's windows (its one measurement when it had
    no windows), each line naming its ``process``."""
    lines = []
    for i, folder in enumerate(folders):
        rec = load_record(folder)
        if rec is None or rec.get("status") != "ok":
            continue
        windows = read_samples(folder) or [process_median(folder, rec)]
        lines += [json.dumps({"process": i, "repeat": r, "metrics": m})
                  for r, m in enumerate(windows)]
    if lines:
        write_text_atomic(run_dir / record.SAMPLES_FILE, "\n".join(lines) + "\n")
