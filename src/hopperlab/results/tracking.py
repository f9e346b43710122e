"""Upload finished run directories to MLflow.

The job side never talks to MLflow: a workload writes its run directory (docs/run-directory.md)
and this module, running on the submitting side after the job or in ``hopperlab sync``, turns
that directory into MLflow runs.

Layout in MLflow::

    experiment  <family>                       e.g. "membench"
      parent run  <experiment>                 tags hopperlab.role=parent, hopperlab.family,
                                               hopperlab.experiment
        child run  <variant>  (or "<variant> #2" for attempt 2, ...)
                                               tags mlflow.parentRunId, hopperlab.run_key, ...

Every upload is idempotent: a child run is found again through its ``hopperlab.run_uid`` tag
(the id ``hopperlab submit`` made with the attempt, kept in the record), and counts as complete
only once its ``hopperlab.uploaded=true`` tag (set last) is there. The uid, not the run key
``{family}/{experiment}/{variant}#{attempt}``, is the identity: two results folders, or a store
copied from another folder, never share an MLflow run. ``mlflow.json`` in the run directory says
which attempt went where; ``sync`` asks the store, not ``mlflow.json``.

Credentials (``MLFLOW_TRACKING_USERNAME``/``PASSWORD``/``TOKEN``) are read by MLflow from the
environment; this module never logs them, and strips any ``user:password@`` from the tracking
URIs it writes or prints.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import posixpath
import random
import re
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, TypeVar
from urllib.parse import unquote

from hopperlab.core.rundir import (
    FAILING_STATUSES,
    RECORD_FILE,
    HARDWARE_FILE,
    METRICS_FILE,
    MLFLOW_FILE,
    RUN_UID,
    SPEC_FILE,
    TRACEBACK_FILE,
    load_record,
    read_json,
    read_steps,
    write_json_atomic,
)

from hopperlab.config.spec import redact_uri  # the one credential stripper (tracking.redact_uri)
from hopperlab.core.errors import ResultsError

log = logging.getLogger(__name__)

T = TypeVar("T")

# MLflow's limits (mlflow.utils.validation): per log_batch call and per value.
MAX_METRICS_PER_BATCH = 1000
MAX_PARAMS_PER_BATCH = 100
MAX_TAGS_PER_BATCH = 100
MAX_PARAM_VALUE = 6000
MAX_TAG_VALUE = 8000
MAX_KEY = 250

TAG_ROLE = "hopperlab.role"
TAG_FAMILY = "hopperlab.family"
TAG_EXPERIMENT = "hopperlab.experiment"
TAG_VARIANT = "hopperlab.variant"
TAG_ATTEMPT = "hopperlab.attempt"
TAG_STATUS = "hopperlab.status"
TAG_REASON = "hopperlab.reason"
TAG_RUN_KEY = "hopperlab.run_key"
TAG_RUN_UID = "hopperlab.run_uid"
TAG_UPLOADED = "hopperlab.uploaded"
TAG_PARENT = "mlflow.parentRunId"

#: MLflow settings while this module talks to a tracking store (set only inside our calls;
#: values the user set in the environment win). MLflow's HTTP defaults (7 retries, backoff
#: factor 2, 120 s timeout) keep a call to a dead server going for minutes; these give up after
#: a few seconds when the connection is refused. MLflow also prints "View run ... at <URL>" on
#: every set_terminated, which would flood `hopperlab sync` (and could show a URI's password).
MLFLOW_ENV: dict[str, str] = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER": "0.5",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "20",
    "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true",
}
HEALTH_TIMEOUT_S = 5.0


# -- errors -------------------------------------------------------------------------------------
class TrackingError(ResultsError):
    """An upload could not be done (bad run directory, MLflow refused the data...)."""


class TrackingUnavailable(TrackingError):
    """The tracking server cannot be reached (connection refused, timeout, 502/503...).

    The run directory is untouched: upload it later with ``hopperlab sync``.
    """

    def __init__(self, tracking_uri: str, detail: str = "") -> None:
        self.tracking_uri = redact_uri(tracking_uri)
        self.detail = _scrub(detail, tracking_uri)
        msg = f"MLflow unreachable at {self.tracking_uri}"
        if self.detail:
            msg += f" ({self.detail})"
        super().__init__(msg)


# -- small helpers ------------------------------------------------------------------------------
_USERINFO = re.compile(r"(?<=://)[^/@\s]+@")


def _scrub(text: str, uri: str = "") -> str:
    """``text`` without any ``user:password@`` of a URL in it."""
    return _USERINFO.sub("", str(text))


def _is_http(uri: str) -> bool:
    return uri.startswith(("http://", "https://"))


def _sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI (None for in-memory or other schemes)."""
    if not uri.startswith("sqlite:///"):
        return None
    path = unquote(uri[len("sqlite:///"):].split("?", 1)[0])
    if not path or path == ":memory:":
        return None
    return Path(path).absolute()


def run_key(family: str, experiment: str, variant: str, attempt: int) -> str:
    return f"{family}/{experiment}/{variant}#{attempt}"


def run_name(variant: str, attempt: int) -> str:
    return variant if attempt <= 1 else f"{variant} #{attempt}"


def _ms(value: Any) -> int | None:
    """Milliseconds since the epoch from unix seconds or an ISO-8601 string."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return int(float(value) * 1000)
    try:
        return int(datetime.fromisoformat(str(value)).timestamp() * 1000)
    except ValueError:
        return None


def _end_ms(record: Mapping[str, Any]) -> int | None:
    """End time: start + duration_s when both are known (the ISO times have 1 s resolution)."""
    start, duration = _ms(record.get("started_at")), record.get("duration_s")
    if start is not None and isinstance(duration, (int, float)) and duration >= 0:
        return start + int(duration * 1000)
    return _ms(record.get("finished_at"))


def _stringify(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, default=str)


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """``{"knobs": {"memory": "pinned"}}`` → ``{"knobs.memory": "pinned"}``; lists as JSON."""
    out: dict[str, str] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, name + "."))
        else:
            out[name] = _stringify(value)
    return out


_BAD_KEY_CHARS = re.compile(r"[^/\w.\- :]")


def safe_key(name: Any) -> str:
    """A metric/param/tag name MLflow accepts: alphanumerics, ``_ - . : / space``, at most
    250 characters, no path tricks (``a/../b``, leading ``/``); other characters become ``_``."""
    key = _BAD_KEY_CHARS.sub("_", str(name))[:MAX_KEY] or "_"
    norm = posixpath.normpath(key)
    if norm != key or norm == "." or norm.startswith(("..", "/")):
        key = key.replace("/", "_")
        if key in (".", ".."):
            key = "_" * len(key)
    return key


def _chunks(items: list[T], size: int) -> Iterator[list[T]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


def _quote(value: str) -> str:
    """A string literal for an MLflow search filter."""
    if "'" not in value:
        return f"'{value}'"
    if '"' not in value:
        return f'"{value}"'
    raise TrackingError(f"cannot search MLflow for a value with both quote kinds: {value!r}")


# -- MLflow HTTP settings, error translation, retries -------------------------------------------
_env_lock = threading.RLock()
_env_depth = 0
_env_saved: dict[str, str | None] = {}


@contextlib.contextmanager
def _mlflow_env() -> Iterator[None]:
    """MLFLOW_ENV in os.environ for the duration of our own calls (MLflow reads it per call)."""
    global _env_depth
    with _env_lock:
        if _env_depth == 0:
            _env_saved.clear()
            for name, value in MLFLOW_ENV.items():
                _env_saved[name] = os.environ.get(name)
                if _env_saved[name] is None:
                    os.environ[name] = value
        _env_depth += 1
    try:
        yield
    finally:
        with _env_lock:
            _env_depth -= 1
            if _env_depth == 0:
                for name, old in _env_saved.items():
                    if old is None:
                        os.environ.pop(name, None)
                    else:
                        os.environ[name] = old
                _env_saved.clear()


_UNREACHABLE_TEXT = (
    "connection refused", "failed to establish a new connection", "connection aborted",
    "connection reset", "timed out", "name or service not known",
    "temporary failure in name resolution", "remotedisconnected",
    "too many 502", "too many 503", "too many 504",
)
_LOCKED_TEXT = ("database is locked", "database table is locked", "database schema is locked")


def _causes(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        yield cur
        cur = cur.__cause__ or cur.__context__


def _is_unreachable(exc: BaseException) -> bool:
    import requests

    for e in _causes(exc):
        if isinstance(e, (requests.exceptions.ConnectionError, requests.exceptions.Timeout,
                          ConnectionError, TimeoutError)):
            return True
        text = str(e).lower()
        if any(t in text for t in _UNREACHABLE_TEXT):
            return True
    return False


def _is_locked(exc: BaseException) -> bool:
    return any(any(t in str(e).lower() for t in _LOCKED_TEXT) for e in _causes(exc))


@contextlib.contextmanager
def _translate(tracking_uri: str) -> Iterator[None]:
    """Turn "cannot reach the server" into TrackingUnavailable, with short HTTP retries."""
    with _mlflow_env():
        try:
            yield
        except TrackingError:
            raise
        except Exception as exc:
            if _is_http(tracking_uri) and _is_unreachable(exc):
                raise TrackingUnavailable(tracking_uri, f"{type(exc).__name__}: "
                                          f"{str(exc)[:300]}") from exc
            from mlflow.exceptions import MlflowException

            if _sqlite_path(tracking_uri) is not None and _is_database_error(exc):
                raise TrackingError(f"the MLflow store {redact_uri(tracking_uri)} cannot be "
                                    f"used: {_first_line(exc)}") from exc
            if isinstance(exc, MlflowException):
                raise TrackingError(f"MLflow at {redact_uri(tracking_uri)} refused: "
                                    f"{_scrub(str(exc))[:1000]}") from exc
            raise


def _is_database_error(exc: BaseException) -> bool:
    """A damaged or unusable database file (not valid SQLite, read-only, wrong schema...)."""
    import sqlite3

    from sqlalchemy.exc import SQLAlchemyError

    return any(isinstance(e, (sqlite3.Error, SQLAlchemyError)) for e in _causes(exc))


def _first_line(exc: BaseException) -> str:
    """The innermost cause's first line: "file is not a database", not SQLAlchemy's SQL."""
    inner = list(_causes(exc))[-1]
    text = (str(inner).strip().splitlines() or [""])[0]
    return _scrub(f"{type(inner).__name__}: {text}"[:300])


def _retry(fn: Callable[..., T], *args: Any, attempts: int = 8, **kw: Any) -> T:
    """Call ``fn``, retrying "database is locked" style errors with exponential backoff."""
    delay = 0.1
    for i in range(attempts):
        try:
            return fn(*args, **kw)
        except Exception as exc:
            if i == attempts - 1 or not _is_locked(exc):
                raise
            log.debug("MLflow store busy (%s); retrying in %.1fs", exc, delay)
            time.sleep(delay * (1 + random.random()))
            delay = min(delay * 2, 5.0)
    raise AssertionError("unreachable")


@contextlib.contextmanager
def _store_lock(tracking_uri: str) -> Iterator[None]:
    """A cross-process lock for one tracking store on this host.

    For SQLite it sits next to the database (MLflow's first-open schema migration is not safe
    to run from several processes, and concurrent writers get "database is locked"); for a
    server it only serialises our own get-or-create of experiments and parent runs.
    """
    db = _sqlite_path(tracking_uri)
    if db is not None:
        with contextlib.suppress(OSError):  # a folder that cannot be made: the lock says so
            db.parent.mkdir(parents=True, exist_ok=True)
        lock_path = db.with_name(db.name + ".hopperlab.lock")
    else:
        digest = hashlib.sha256(redact_uri(tracking_uri).encode()).hexdigest()[:16]
        lock_path = Path(tempfile.gettempdir()) / f"hopperlab-mlflow-{digest}.lock"
    try:
        fh = open(lock_path, "a")
    except OSError as exc:  # a read-only store folder: the upload waits for `hopperlab sync`
        raise TrackingUnavailable(tracking_uri, f"cannot open the lock file {lock_path}: "
                                  f"{exc.strerror or exc}") from exc
    with fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _client(tracking_uri: str):
    import mlflow

    return _retry(mlflow.MlflowClient, tracking_uri)


def is_reachable(tracking_uri: str, timeout: float = HEALTH_TIMEOUT_S) -> bool:
    """Quick check: ``GET /health`` for an http(s) server; True for local stores."""
    if not _is_http(tracking_uri):
        return True
    import requests

    try:
        r = requests.get(redact_uri(tracking_uri) + "/health", timeout=timeout)
    except requests.RequestException:
        return False
    # Any answer but a gateway error means something is there (a proxy may want auth for
    # /health, or not route it): the real calls will tell the rest.
    return r.status_code not in (502, 503, 504)


def _require_reachable(tracking_uri: str) -> None:
    if not is_reachable(tracking_uri):
        raise TrackingUnavailable(tracking_uri, "no answer on /health")


# -- experiments and parent runs ----------------------------------------------------------------
def _artifact_location(tracking_uri: str, family: str) -> str | None:
    """For a SQLite store, artifacts next to the database (MLflow's default is ./mlruns of
    whatever the current directory is); servers choose for themselves."""
    db = _sqlite_path(tracking_uri)
    if db is None:
        return None
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in family)
    return (db.parent / "mlartifacts" / safe).as_uri()


def _get_or_create_experiment(client, tracking_uri: str, family: str) -> str:
    from mlflow.exceptions import MlflowException

    exp = _retry(client.get_experiment_by_name, family)
    if exp is None:
        try:
            return _retry(client.create_experiment, family,
                          artifact_location=_artifact_location(tracking_uri, family),
                          tags={"hopperlab.family": family})
        except MlflowException as exc:
            # Another host created it in the meantime.
            exp = _retry(client.get_experiment_by_name, family)
            if exp is None:
                raise TrackingError(f"cannot create MLflow experiment {family!r}: {exc}") from exc
    if exp.lifecycle_stage == "deleted":
        _retry(client.restore_experiment, exp.experiment_id)
    return exp.experiment_id


def _parent_runs(client, experiment_id: str, experiment: str) -> list:
    flt = f"tags.`{TAG_ROLE}` = 'parent' and tags.`{TAG_EXPERIMENT}` = {_quote(experiment)}"
    runs = _retry(client.search_runs, [experiment_id], filter_string=flt, max_results=100)
    return sorted(runs, key=lambda r: (r.info.start_time or 0, r.info.run_id))


def _get_or_create_parent(client, experiment_id: str, family: str, experiment: str) -> str:
    from mlflow.exceptions import MlflowException

    runs = _parent_runs(client, experiment_id, experiment)
    if runs:
        return runs[0].info.run_id
    run = _retry(client.create_run, experiment_id, run_name=experiment,
                 tags={TAG_ROLE: "parent", TAG_FAMILY: family, TAG_EXPERIMENT: experiment})
    try:
        _retry(client.set_terminated, run.info.run_id, "FINISHED")
    except MlflowException:
        pass  # a racer on another host already deleted it as a duplicate (below)
    # Several hosts may have raced past the search: keep the oldest parent, drop the others.
    # Every racer sees the same list, so they all agree on the one kept.
    runs = _parent_runs(client, experiment_id, experiment)
    keep = runs[0].info.run_id if runs else run.info.run_id
    for other in runs[1:]:
        with contextlib.suppress(Exception):
            _retry(client.delete_run, other.info.run_id)
    return keep


def _ensure(client, tracking_uri: str, family: str, experiment: str) -> tuple[str, str]:
    """(experiment_id, parent_run_id), made if missing; callers hold the store lock."""
    experiment_id = _get_or_create_experiment(client, tracking_uri, family)
    return experiment_id, _get_or_create_parent(client, experiment_id, family, experiment)


def prepare(tracking_uri: str, keys: Iterable[tuple[str, str]]) -> None:
    """Create the store, the family experiments and the parent runs, once, before any child.

    Call it before several processes upload at once: a fresh SQLite database opened by several
    processes fails its schema migration, and racing get-or-creates duplicate parents.
    Idempotent: a second call creates nothing.
    """
    keys = sorted(set((str(f), str(e)) for f, e in keys))
    with _translate(tracking_uri):
        _require_reachable(tracking_uri)
        with _store_lock(tracking_uri):
            client = _client(tracking_uri)
            for family, experiment in keys:
                _ensure(client, tracking_uri, family, experiment)


# -- one run directory --------------------------------------------------------------------------
@dataclass
class _Run:
    run_dir: Path
    record: dict[str, Any]
    spec: dict[str, Any]
    family: str
    experiment: str
    variant: str
    attempt: int
    #: the attempt's identity in MLflow (see run_uid)
    uid: str

    @property
    def key(self) -> str:
        return run_key(self.family, self.experiment, self.variant, self.attempt)


def run_uid(record: Mapping[str, Any], spec: Mapping[str, Any]) -> str:
    """The identity of one attempt: the id made with it (record, else its own spec.json).

    Records from before that id existed get a hash of the record itself: stable for the same
    files, different for another folder's run (another start time, status, metrics...).
    """
    attempt = int(record.get("attempt") or 1)
    uid = record.get(RUN_UID) or (spec.get(RUN_UID)
                                  if int(spec.get("attempt") or 1) == attempt else None)
    if uid:
        return str(uid)
    text = json.dumps(record, sort_keys=True, default=str)
    return "record-" + hashlib.sha256(text.encode()).hexdigest()[:32]


def _find_spec(run_dir: Path) -> dict[str, Any]:
    candidates = [run_dir / SPEC_FILE]
    if run_dir.parent.name == "attempts":  # an archived attempt: <run_dir>/attempts/<n>/
        candidates.append(run_dir.parent.parent / SPEC_FILE)
    for path in candidates:
        if path.exists():
            return read_json(path)
    return {}


def _read_run(run_dir: Path) -> _Run:
    run_dir = Path(run_dir)
    record = load_record(run_dir)
    if record is None:
        raise TrackingError(f"{run_dir}: no {METRICS_FILE} or {RECORD_FILE}: nothing to upload")
    spec = _find_spec(run_dir)
    ident: dict[str, str] = {}
    for name in ("family", "experiment", "variant"):
        value = record.get(name) or spec.get(name)
        if not value:
            raise TrackingError(f"{run_dir}: the record names no {name}")
        ident[name] = str(value)
    attempt = int(record.get("attempt") or 1)
    return _Run(run_dir, record, spec, ident["family"], ident["experiment"], ident["variant"],
                attempt, run_uid(record, spec))


def _hardware(run: _Run) -> dict[str, Any]:
    hw = run.record.get("hardware") or {}
    if not hw and (run.run_dir / HARDWARE_FILE).exists():
        with contextlib.suppress(Exception):
            hw = read_json(run.run_dir / HARDWARE_FILE)
    return hw if isinstance(hw, dict) else {}


def _tags(run: _Run, parent_id: str) -> dict[str, str]:
    rec = run.record
    hw = _hardware(run)
    slurm = rec.get("slurm") or {}
    tags: dict[str, Any] = dict(rec.get("tags") or {})
    tags.update({
        TAG_FAMILY: run.family,
        TAG_EXPERIMENT: run.experiment,
        TAG_VARIANT: run.variant,
        TAG_ATTEMPT: run.attempt,
        TAG_STATUS: rec.get("status"),
        TAG_RUN_KEY: run.key,
        TAG_RUN_UID: run.uid,
        "hostname": hw.get("hostname"),
        "gpu_model": hw.get("gpu_model") or ("none" if hw else None),
        "cpu_arch": hw.get("cpu_arch"),
        "git_commit": run.spec.get("git_commit", rec.get("git_commit")),
        "slurm_job_id": slurm.get("job_id") if isinstance(slurm, dict) else None,
    })
    if rec.get("reason"):
        tags[TAG_REASON] = rec["reason"]
    out = {safe_key(k): _scrub(str(v))[:MAX_TAG_VALUE] for k, v in tags.items() if v is not None}
    out[TAG_PARENT] = parent_id
    return out


def _metrics(run: _Run) -> list:
    from mlflow.entities import Metric

    out = []
    last_step: dict[str, int] = {}
    last_ts = 0
    for line in read_steps(run.run_dir):
        try:
            step = int(line.get("step", 0))
            ts = _ms(line.get("time")) or 0
            values = line.get("metrics") or {}
        except (TypeError, ValueError, AttributeError):
            continue
        last_ts = max(last_ts, ts)
        for name, value in values.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            out.append(Metric(safe_key(name), float(value), ts, step))
            last_step[name] = max(step, last_step.get(name, step))
    # Final metrics: at the last step of a same-named step metric, else at step 0; timestamped
    # when the run finished, and after every step: at equal steps MLflow's "latest value" (what
    # its UI shows) is the later one, and finished_at has whole seconds only, so the last step,
    # logged within that second, would otherwise win (tokens_per_s: the last step's rate
    # instead of the median).
    finished = _ms(run.record.get("finished_at")) or int(time.time() * 1000)
    finished = max(finished, last_ts + 1)
    for name, value in (run.record.get("metrics") or {}).items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        out.append(Metric(safe_key(name), float(value), finished, last_step.get(name, 0)))
    return out


def _params(run: _Run) -> list:
    from mlflow.entities import Param

    params: dict[str, str] = {}
    for key, value in flatten(run.spec).items():
        # no duplicate keys in a batch; no credentials (a spec.json written before they were
        # stripped at the source)
        params.setdefault(safe_key(key), _scrub(value)[:MAX_PARAM_VALUE])
    return [Param(k, v) for k, v in params.items()]


def _log_artifacts(client, run_id: str, run_dir: Path) -> None:
    for name in ("logs", "artifacts"):
        folder = run_dir / name
        if folder.is_dir() and any(folder.iterdir()):
            client.log_artifacts(run_id, str(folder), artifact_path=name)
    for name in (TRACEBACK_FILE, SPEC_FILE, RECORD_FILE, HARDWARE_FILE):
        path = run_dir / name
        if path.is_file():
            _log_scrubbed(client, run_id, path)


def _log_scrubbed(client, run_id: str, path: Path) -> None:
    """Log ``path`` as an artifact, through a copy without credentials when it holds a URI's."""
    text = path.read_text(errors="replace")
    clean = _scrub(text)
    if clean == text:
        client.log_artifact(run_id, str(path))
        return
    with tempfile.TemporaryDirectory(prefix="hopperlab-artifact-") as tmp:
        copy = Path(tmp) / path.name
        copy.write_text(clean)
        client.log_artifact(run_id, str(copy))


def _existing(client, experiment_id: str, uid: str) -> list:
    flt = f"tags.`{TAG_RUN_UID}` = {_quote(uid)}"
    return _retry(client.search_runs, [experiment_id], filter_string=flt, max_results=100)


def _legacy_upload(client, run: _Run, experiment_id: str) -> str | None:
    """The run id of this attempt's upload from before run uids, if this run directory's
    ``mlflow.json`` names one (complete, same key, no uid yet): it is tagged with the uid and
    kept, so that upgrading does not upload every old run twice."""
    try:
        info = read_json(run.run_dir / MLFLOW_FILE)
        if int(info.get("attempt", -1)) != run.attempt or info.get(RUN_UID):
            return None
        old = _retry(client.get_run, str(info["run_id"]))
    except Exception:  # noqa: BLE001 - no usable mlflow.json or no such run: upload anew
        return None
    tags = old.data.tags
    if (old.info.experiment_id != experiment_id or old.info.lifecycle_stage != "active"
            or tags.get(TAG_RUN_KEY) != run.key or tags.get(TAG_UPLOADED) != "true"
            or TAG_RUN_UID in tags):
        return None
    _retry(client.set_tag, old.info.run_id, TAG_RUN_UID, run.uid, synchronous=True)
    return old.info.run_id


def _write_mlflow_json(run: _Run, run_id: str, experiment_id: str, tracking_uri: str) -> None:
    write_json_atomic(run.run_dir / MLFLOW_FILE, {
        "attempt": run.attempt,
        RUN_UID: run.uid,
        "run_id": run_id,
        "experiment_id": experiment_id,
        "tracking_uri": redact_uri(tracking_uri),
    })


def upload_run(run_dir: Path, tracking_uri: str) -> str:
    """Upload one finished run directory (or archived attempt) as a child run; its MLflow id.

    Creates the family experiment and the parent run when missing (under a lock: no marker
    or earlier step is needed). Idempotent: a complete earlier upload of the same attempt
    (the same run uid) is reused, a half-done one is deleted and done again; a run of the same
    key from another folder is never reused. Writes ``mlflow.json`` on success.
    Raises TrackingUnavailable when the server cannot be reached (the run dir is untouched).
    """
    run_id, _ = _upload_run(_read_run(Path(run_dir)), tracking_uri)
    return run_id


def _upload_run(run: _Run, tracking_uri: str) -> tuple[str, bool]:
    """(run id, whether it was made now rather than found complete)."""
    with _translate(tracking_uri):
        _require_reachable(tracking_uri)
        sqlite = _sqlite_path(tracking_uri) is not None
        # SQLite: one writer at a time on this host. Server: only the get-or-create is locked.
        with _store_lock(tracking_uri) if sqlite else contextlib.nullcontext():
            client = _client(tracking_uri)
            with contextlib.nullcontext() if sqlite else _store_lock(tracking_uri):
                experiment_id, parent_id = _ensure(client, tracking_uri, run.family,
                                                   run.experiment)
            run_id, created = _upload(client, run, experiment_id, parent_id)
    _write_mlflow_json(run, run_id, experiment_id, tracking_uri)
    return run_id, created


def _upload(client, run: _Run, experiment_id: str, parent_id: str) -> tuple[str, bool]:
    for old in _existing(client, experiment_id, run.uid):
        if old.data.tags.get(TAG_UPLOADED) == "true":
            log.debug("%s already in MLflow as %s", run.key, old.info.run_id)
            return old.info.run_id, False
        log.info("%s: deleting half-uploaded MLflow run %s", run.key, old.info.run_id)
        _retry(client.delete_run, old.info.run_id)
    legacy = _legacy_upload(client, run, experiment_id)
    if legacy is not None:
        return legacy, False

    tags = _tags(run, parent_id)
    created = _retry(client.create_run, experiment_id,
                     start_time=_ms(run.record.get("started_at")),
                     tags={TAG_PARENT: parent_id, TAG_RUN_KEY: run.key, TAG_RUN_UID: run.uid},
                     run_name=run_name(run.variant, run.attempt))
    run_id = created.info.run_id

    for chunk in _chunks(_params(run), MAX_PARAMS_PER_BATCH):
        _retry(client.log_batch, run_id, params=chunk, synchronous=True)
    from mlflow.entities import RunTag

    tag_list = [RunTag(k, v) for k, v in tags.items()]
    for chunk in _chunks(tag_list, MAX_TAGS_PER_BATCH):
        _retry(client.log_batch, run_id, tags=chunk, synchronous=True)
    for chunk in _chunks(_metrics(run), MAX_METRICS_PER_BATCH):
        _retry(client.log_batch, run_id, metrics=chunk, synchronous=True)
    _log_artifacts(client, run_id, run.run_dir)

    status = "FAILED" if run.record.get("status") in FAILING_STATUSES else "FINISHED"
    _retry(client.set_terminated, run_id, status, end_time=_end_ms(run.record))
    _retry(client.set_tag, run_id, TAG_UPLOADED, "true", synchronous=True)
    return run_id, True


def compare_url(tracking_uri: str, run_ids: Iterable[str], experiment_ids: Iterable[str]) -> str:
    """The MLflow UI's compare view of these runs (MLflow 3):
    ``{server}/#/compare-runs?runs=["id1","id2"]&experiments=["1"]`` (JSON lists, URL-quoted)."""
    from urllib.parse import quote

    def js(items: Iterable[str]) -> str:
        return quote(json.dumps([str(i) for i in items], separators=(",", ":")), safe="")

    return (f"{redact_uri(tracking_uri)}/#/compare-runs?runs={js(run_ids)}"
            f"&experiments={js(sorted(set(experiment_ids)))}")


def experiment_compare_url(tracking_uri: str, family: str, experiment: str,
                           ui_uri: str | None = None) -> str:
    """Compare view of one experiment's variants, the latest attempt of each.

    ``ui_uri`` is where a person opens the UI (``mlflow ui`` on a SQLite store serves
    http://127.0.0.1:5000); it defaults to the tracking URI when that is a server.
    """
    with _translate(tracking_uri):
        client = _client(tracking_uri)
        exp = _retry(client.get_experiment_by_name, family)
        if exp is None:
            raise TrackingError(f"no MLflow experiment {family!r} at {redact_uri(tracking_uri)}")
        flt = f"tags.`{TAG_EXPERIMENT}` = {_quote(experiment)}"
        runs = _retry(client.search_runs, [exp.experiment_id], filter_string=flt,
                      max_results=5000)
    latest: dict[str, Any] = {}
    for run in runs:
        tags = run.data.tags
        if tags.get(TAG_ROLE) == "parent" or TAG_VARIANT not in tags:
            continue
        variant = tags[TAG_VARIANT]
        attempt = int(tags.get(TAG_ATTEMPT, 0))
        if variant not in latest or attempt > int(latest[variant].data.tags.get(TAG_ATTEMPT, 0)):
            latest[variant] = run
    if not latest:
        raise TrackingError(f"no runs of {family}/{experiment} at {redact_uri(tracking_uri)}")
    base = ui_uri or (tracking_uri if _is_http(tracking_uri) else "http://127.0.0.1:5000")
    return compare_url(base, [latest[v].info.run_id for v in sorted(latest)],
                       [exp.experiment_id])


# -- sync -----------------------------------------------------------------------------------------
@dataclass
class SyncReport:
    uploaded: list[str] = field(default_factory=list)  # run keys
    already: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)  # (run dir or key, why)
    unavailable: bool = False  # the server went away part-way; the rest was not tried

    @property
    def counts(self) -> dict[str, int]:
        return {"uploaded": len(self.uploaded), "already": len(self.already),
                "failed": len(self.failed)}

    def __str__(self) -> str:
        c = self.counts
        text = f"{c['uploaded']} uploaded, {c['already']} already in MLflow, {c['failed']} failed"
        return text + (" (MLflow became unreachable)" if self.unavailable else "")


_SKIP_PARTS = {"artifacts", "logs"}


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
    uid = run_uid(record, _find_spec(Path(run_dir)))
    return (int(info.get("attempt", -1)) == int(record.get("attempt") or 1)
            and info.get(RUN_UID) == uid
            and info.get("tracking_uri") == redact_uri(tracking_uri)
            and bool(info.get("run_id")) and info.get("run_id") == (run_id or info["run_id"]))


def stored_uploads(tracking_uri: str, families: Iterable[str]) -> dict[str, tuple[str, str]]:
    """run uid -> (MLflow run id, experiment id) of every complete upload of these families in
    the store: what ``sync`` compares the run directories with."""
    out: dict[str, tuple[str, str]] = {}
    flt = f"tags.`{TAG_UPLOADED}` = 'true'"
    with _translate(tracking_uri):
        _require_reachable(tracking_uri)
        sqlite = _sqlite_path(tracking_uri) is not None
        with _store_lock(tracking_uri) if sqlite else contextlib.nullcontext():
            client = _client(tracking_uri)
            for family in sorted(set(families)):
                exp = _retry(client.get_experiment_by_name, family)
                if exp is None or exp.lifecycle_stage == "deleted":
                    continue
                token = None
                while True:
                    page = _retry(client.search_runs, [exp.experiment_id], filter_string=flt,
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
    runs: list[_Run] = []
    for run_dir in find_run_dirs(results_dir):
        try:
            runs.append(_read_run(run_dir))
        except Exception as exc:  # a broken record must not stop the others
            report.failed.append((str(run_dir), str(exc)))
    if not runs:
        return report
    stored = stored_uploads(tracking_uri, {r.family for r in runs})
    todo: list[_Run] = []
    for run in runs:
        if run.uid not in stored:
            todo.append(run)
            continue
        run_id, experiment_id = stored[run.uid]
        if not is_synced(run.run_dir, tracking_uri, run.record, run_id):
            _write_mlflow_json(run, run_id, experiment_id, tracking_uri)
            report.already.append(run.key)
    if not todo:
        return report

    prepare(tracking_uri, {(r.family, r.experiment) for r in todo})
    if progress is None:
        progress = len(todo) >= 20 and sys.stderr.isatty()
    for run in _progress(todo, progress, f"uploading to {redact_uri(tracking_uri)}"):
        try:
            _, created = _upload_run(run, tracking_uri)
        except TrackingUnavailable as exc:
            report.unavailable = True
            report.failed.append((run.key, str(exc)))
            break
        except Exception as exc:
            log.warning("cannot upload %s: %s", run.run_dir, _scrub(str(exc), tracking_uri))
            report.failed.append((run.key, _scrub(str(exc), tracking_uri)))
            continue
        (report.uploaded if created else report.already).append(run.key)
    return report


def _progress(items: list[T], show: bool, description: str) -> Iterable[T]:
    if not show:
        return items
    try:
        from rich.progress import track
    except ImportError:  # pragma: no cover
        return items
    return track(items, description=description, transient=True)
