"""The run directory on disk: steps, final metrics, status, artifacts.

Everything a run produces lands here before anything is uploaded (see docs/run-directory.md),
so an unreachable MLflow or a dead job never loses a result. Every file is replaced atomically:
Snakemake watches ``metrics.json`` and must never see half of it.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Literal, Mapping, Sequence

from hopperlab.core.errors import HopperlabError, SpecError

Status = Literal["ok", "oom", "failed", "timeout", "skipped"]
STATUSES: tuple[str, ...] = ("ok", "oom", "failed", "timeout", "skipped")
#: Statuses that make the Snakemake rule fail (the others are results).
FAILING_STATUSES: frozenset[str] = frozenset({"failed", "timeout"})
#: how a record's reason begins when its own submitter was told to stop while the job ran
#: (run/launch.py writes it; the check reads such a run as not measured, never a regression)
STOPPED_BY_SUBMITTER = "the submitting process got"

METRICS_FILE = "metrics.json"
#: the record under a name Snakemake does not own: it deletes ``metrics.json`` of a failed job
#: and before a forced rerun; ``record.json`` stays (and moves to ``attempts/<n>/`` with the rest).
RECORD_FILE = "record.json"
STEPS_FILE = "steps.jsonl"
#: one line per repeat of a run measured several times (``repeats``): that repeat's metrics
SAMPLES_FILE = "samples.jsonl"
SPEC_FILE = "spec.json"
HARDWARE_FILE = "hardware.json"
TRACEBACK_FILE = "traceback.txt"
HISTORY_FILE = "history.jsonl"
MLFLOW_FILE = "mlflow.json"
#: key of the attempt's unique id in spec.json and the record: its identity in MLflow, so that
#: runs of the same key in two results folders are never taken for one another
RUN_UID = "run_uid"
#: the metric every record with a step carries: seconds from job start to the first step
SETUP_METRIC = "setup_s"


def new_run_uid() -> str:
    """A fresh id for one attempt of one run directory."""
    return uuid.uuid4().hex


def utc_now() -> str:
    """Now, as ISO-8601 in UTC to the second (history lines, pages' stamps)."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def record_time() -> str:
    """Now, as a run record's ``started_at``/``finished_at``: ISO-8601 in UTC to the
    millisecond. Runs started within one second would otherwise tie, and a history ordered by
    start time could put them either way round (a change point then vanishes)."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` through a temporary file in the same folder, fsync, then ``os.replace``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; results are shared with colleagues
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, data: Any) -> None:
    write_text_atomic(path, json.dumps(data, indent=2, default=str) + "\n")


def read_json(path: Path) -> Any:
    with open(path) as fh:
        return json.load(fh)


def process_started_at() -> float | None:
    """When this process started (epoch seconds), from the kernel: the job's start as its task
    sees it, imports and process-group set-up included. None where /proc cannot say."""
    try:
        after_name = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        ticks = int(after_name[19])  # field 22, starttime: clock ticks after boot
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return time.time() - age if age >= 0 else None


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"metric {name!r} must be a number, got {type(value).__name__}: {value!r}")
    return float(value)


class Recorder:
    """Collects one run's step metrics, final metrics and tags, and writes the record.

    Workloads receive a Recorder and never touch MLflow: ``log_step`` appends to
    ``steps.jsonl`` at once (a crash keeps the steps so far), ``finish`` writes ``metrics.json``.
    Every record with a step says ``setup_s``: seconds from ``job_started`` (the runner gives
    the process's start; default: now) to where the workload's first step began
    (``mark_setup_done``) or, for a workload that does not say, its first recorded step ended.
    """

    def __init__(self, run_dir: Path | str, *, identity: Mapping[str, Any] | None = None,
                 attempt: int = 1, job_started: float | None = None,
                 may_write: Callable[[], bool] | None = None) -> None:
        self.run_dir = Path(run_dir)
        #: asked before the record is written: False when the run directory no longer holds
        #: this attempt (a later one replaced it), whose files this job must not overwrite
        self.may_write = may_write or (lambda: True)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.identity = dict(identity or {})
        self.attempt = attempt
        self.metrics: dict[str, float] = {}
        self.tags: dict[str, str] = {}
        self.hardware: dict[str, Any] = {}
        self.slurm: dict[str, Any] | None = None
        self.started_at = record_time()
        self._t0 = time.monotonic()
        self.job_started = time.time() if job_started is None else job_started
        self._setup_done: float | None = None
        self._steps = open(self.run_dir / STEPS_FILE, "a")
        #: the repeat being measured (``repeats`` > 1): step lines carry it
        self.repeat: int | None = None
        #: each repeat's metrics, in order (``add_sample``)
        self.samples: list[dict[str, float]] = []

    # -- during the run -------------------------------------------------------------------
    def mark_setup_done(self) -> None:
        """The workload's first step begins now: its set-up ends here (the first call counts)."""
        if self._setup_done is None:
            self._setup_done = time.time()

    def log_step(self, step: int, **metrics: float) -> None:
        """Append one step's metrics to ``steps.jsonl`` (flushed: survives a crash)."""
        clean = {k: _number(k, v) for k, v in metrics.items()}
        self.mark_setup_done()  # a no-op once the workload has said where its steps begin
        entry: dict[str, Any] = {"step": int(step), "time": time.time(), "metrics": clean}
        if self.repeat is not None:
            entry["repeat"] = self.repeat
        line = json.dumps(entry)
        self._steps.write(line + "\n")
        self._steps.flush()

    def log_metric(self, name: str, value: float) -> None:
        self.metrics[name] = _number(name, value)

    def log_metrics(self, metrics: Mapping[str, float] | None = None, **kw: float) -> None:
        for k, v in {**(metrics or {}), **kw}.items():
            self.log_metric(k, v)

    def add_sample(self, metrics: Mapping[str, float]) -> None:
        """Record one repeat's metrics (a window after warm-up, or a rerun): appended to
        ``samples.jsonl`` at once, so that a killed run keeps the repeats it finished."""
        clean = {k: _number(k, v) for k, v in metrics.items()}
        self.samples.append(clean)
        finite = {k: v for k, v in clean.items() if math.isfinite(v)}
        with open(self.run_dir / SAMPLES_FILE, "a") as fh:
            fh.write(json.dumps({"repeat": len(self.samples) - 1, "metrics": finite}) + "\n")

    def set_tag(self, name: str, value: Any) -> None:
        self.tags[name] = str(value)

    def artifact_path(self, name: str) -> Path:
        """Where a workload should write an artifact called ``name`` (folders are made)."""
        path = self.run_dir / "artifacts" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    # -- the end --------------------------------------------------------------------------
    def record(self, status: Status, reason: str | None = None) -> dict[str, Any]:
        if status not in STATUSES:
            raise ValueError(f"unknown status {status!r}; expected one of {', '.join(STATUSES)}")
        finite = {k: v for k, v in self.metrics.items() if math.isfinite(v)}
        if self._setup_done is not None:
            finite.setdefault(SETUP_METRIC, round(max(0.0, self._setup_done - self.job_started), 3))
        return {
            **self.identity,
            "attempt": self.attempt,
            "status": status,
            "reason": reason,
            "metrics": finite,
            "tags": dict(self.tags),
            "started_at": self.started_at,
            "finished_at": record_time(),
            "duration_s": round(time.monotonic() - self._t0, 3),
            "hardware": self.hardware,
            "slurm": self.slurm,
        }

    def finish(self, status: Status, reason: str | None = None) -> dict[str, Any]:
        """Write ``record.json`` and (for a result) ``metrics.json``, unless ``may_write`` says
        the directory is another attempt's now; return the record."""
        self._steps.close()
        rec = self.record(status, reason)
        if self.may_write():
            write_record(self.run_dir, rec)
        return rec


def write_record(run_dir: Path, record: Mapping[str, Any]) -> None:
    """Write the record twice: ``record.json`` (kept) and ``metrics.json`` (Snakemake's output).

    A failing status writes no ``metrics.json`` (and removes an older one): Snakemake must never
    take a failed run for a done one, however its job ended (killed, ``--keep-incomplete``), so
    that the next plain call retries it.
    """
    run_dir = Path(run_dir)
    write_json_atomic(run_dir / RECORD_FILE, record)
    if record.get("status") in FAILING_STATUSES:
        (run_dir / METRICS_FILE).unlink(missing_ok=True)
    else:
        write_json_atomic(run_dir / METRICS_FILE, record)


class BadRecord(HopperlabError, ValueError):
    """A record file that is JSON but not an object (``null``, a list, a number...)."""


def load_record(run_dir: Path) -> dict[str, Any] | None:
    """The run's record: ``record.json``, else ``metrics.json``, else None. A file that parses
    to anything but an object raises ``BadRecord`` naming it: such a run is shown as broken,
    never taken for a run without a record."""
    for name in (RECORD_FILE, METRICS_FILE):
        path = Path(run_dir) / name
        if path.exists():
            data = read_json(path)
            if not isinstance(data, dict):
                raise BadRecord(f"{path}: a run record must be a JSON object, not "
                                f"{type(data).__name__ if data is not None else 'null'}")
            return data
    return None


def read_samples(run_dir: Path) -> list[dict[str, float]]:
    """Each repeat's metrics from ``samples.jsonl`` (empty: the run was measured once); a torn
    last line (a killed job) is skipped."""
    path = Path(run_dir) / SAMPLES_FILE
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(dict(json.loads(line)["metrics"]))
        except (json.JSONDecodeError, KeyError, TypeError):
            continue
    return out


def read_process_samples(run_dir: Path) -> list[list[dict[str, float]]]:
    """The windows of each independent process of a run measured with ``processes`` (the
    ``process`` of each line of ``samples.jsonl``), in process order; empty for a run of one
    process (its lines name none)."""
    path = Path(run_dir) / SAMPLES_FILE
    if not path.exists():
        return []
    groups: dict[int, list[dict[str, float]]] = {}
    for line in path.read_text().splitlines():
        try:
            data = json.loads(line)
            process, metrics = data["process"], dict(data["metrics"])
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            continue
        if isinstance(process, int) and not isinstance(process, bool):
            groups.setdefault(process, []).append(metrics)
    return [groups[p] for p in sorted(groups)]


def finite_samples(run_dir: Path, samples: Sequence[Mapping[str, Any]], metric: str
                   ) -> list[float]:
    """``metric`` in each of ``samples`` that has it; a value that is not a finite number (NaN,
    inf, text: a broken run or a hand edit) is one line naming the file and key, never a
    traceback nor a hole a verdict would silently rest on."""
    out = []
    for i, sample in enumerate(samples, 1):
        if metric not in sample:
            continue
        value = sample[metric]
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value):
            raise SpecError(f"{Path(run_dir) / SAMPLES_FILE}: sample {i}: {metric} is "
                            f"{value!r}, not a finite number")
        out.append(float(value))
    return out


def read_steps(run_dir: Path) -> list[dict[str, Any]]:
    """All step lines of ``steps.jsonl``; a torn last line (a killed job) is skipped."""
    path = Path(run_dir) / STEPS_FILE
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


class SkipRun(HopperlabError):
    """Raised by a workload when the node cannot run the variant (e.g. no CUDA device).

    The runner records ``status: skipped`` with the message as the reason: a result, not a bug.
    """
