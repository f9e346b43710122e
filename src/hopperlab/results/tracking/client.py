"""The MLflow client, hardened: one environment, reachability, retries on a busy store, a
lock for SQLite stores, and errors translated into ``TrackingUnavailable``/``TrackingError``
with credentials scrubbed from every message."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar
from urllib.parse import unquote

from hopperlab.core.errors import ResultsError
from hopperlab.core.secrets import redact_uri, scrub

log = logging.getLogger(__name__)


T = TypeVar("T")


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


class TrackingError(ResultsError):
    """An upload could not be done (bad run directory, MLflow refused the data...)."""


class TrackingUnavailable(TrackingError):
    """The tracking server cannot be reached (connection refused, timeout, 502/503...).

    The run directory is untouched: upload it later with ``hopperlab sync``.
    """

    def __init__(self, tracking_uri: str, detail: str = "") -> None:
        self.tracking_uri = redact_uri(tracking_uri)
        self.detail = scrub(detail)
        msg = f"MLflow unreachable at {self.tracking_uri}"
        if self.detail:
            msg += f" ({self.detail})"
        super().__init__(msg)


def is_http(uri: str) -> bool:
    return uri.startswith(("http://", "https://"))


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI (None for in-memory or other schemes)."""
    if not uri.startswith("sqlite:///"):
        return None
    path = unquote(uri[len("sqlite:///"):].split("?", 1)[0])
    if not path or path == ":memory:":
        return None
    return Path(path).absolute()


_env_lock = threading.RLock()


_env_depth = 0


_env_saved: dict[str, str | None] = {}


#: the thread that imports MLflow while a job runs (``warm_up_in_background``), if started
_warm_up: threading.Thread | None = None


def _await_warm_up() -> None:
    """Wait for the background import of MLflow, if one runs. Two threads importing MLflow at
    once is a race of this process, not of the server: the upload's ``from mlflow.entities
    import ...`` while the thread is half-way through ``import mlflow`` loads protobuf
    descriptors twice (``TypeError: Couldn't build proto file into descriptor pool``) or
    finds names not yet defined; a job that ends quickly (a skipped run) uploads while the
    import still runs, as 2 uploads of a 200-run load did (issue 46, D30)."""
    thread = _warm_up
    if thread is not None and thread is not threading.current_thread():
        thread.join()


@contextlib.contextmanager
def _mlflow_env() -> Iterator[None]:
    """MLFLOW_ENV in os.environ for the duration of our own calls (MLflow reads it per call),
    once no other thread of ours is importing MLflow."""
    global _env_depth
    _await_warm_up()
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
def translate_errors(tracking_uri: str) -> Iterator[None]:
    """Turn "cannot reach the server" into TrackingUnavailable, with short HTTP retries."""
    with _mlflow_env():
        try:
            yield
        except TrackingError:
            raise
        except Exception as exc:
            if is_http(tracking_uri) and _is_unreachable(exc):
                raise TrackingUnavailable(tracking_uri, f"{type(exc).__name__}: "
                                          f"{str(exc)[:300]}") from exc
            from mlflow.exceptions import MlflowException

            if sqlite_path(tracking_uri) is not None and _is_database_error(exc):
                raise TrackingError(f"the MLflow store {redact_uri(tracking_uri)} cannot be "
                                    f"used: {_first_line(exc)}") from exc
            if isinstance(exc, MlflowException):
                raise TrackingError(_mlflow_error(tracking_uri, exc)) from exc
            raise


def _mlflow_error(tracking_uri: str, exc: BaseException) -> str:
    """What an MLflow exception was: a server's answer (``RestException``: it refused) or, for
    a server, an error of MLflow's client in this process that no answer caused; a local
    store (SQLite) is the store itself refusing."""
    from mlflow.exceptions import RestException

    text = scrub(str(exc))[:1000]
    if is_http(tracking_uri) and not isinstance(exc, RestException):
        return (f"MLflow's client failed in this process (not an answer of the server at "
                f"{redact_uri(tracking_uri)}): {type(exc).__name__}: {text}")
    return f"MLflow at {redact_uri(tracking_uri)} refused: {text}"


def _is_database_error(exc: BaseException) -> bool:
    """A damaged or unusable database file (not valid SQLite, read-only, wrong schema...)."""
    import sqlite3

    from sqlalchemy.exc import SQLAlchemyError

    return any(isinstance(e, (sqlite3.Error, SQLAlchemyError)) for e in _causes(exc))


def _first_line(exc: BaseException) -> str:
    """The innermost cause's first line: "file is not a database", not SQLAlchemy's SQL."""
    inner = list(_causes(exc))[-1]
    text = (str(inner).strip().splitlines() or [""])[0]
    return scrub(f"{type(inner).__name__}: {text}"[:300])


def retry(fn: Callable[..., T], *args: Any, attempts: int = 8, **kw: Any) -> T:
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
def store_lock(tracking_uri: str) -> Iterator[None]:
    """A cross-process lock for one tracking store on this host.

    For SQLite it sits next to the database (MLflow's first-open schema migration is not safe
    to run from several processes, and concurrent writers get "database is locked"); for a
    server it only serialises our own get-or-create of experiments and parent runs.
    """
    db = sqlite_path(tracking_uri)
    if db is not None:
        with contextlib.suppress(OSError):  # a folder that cannot be made: the lock says so
            db.parent.mkdir(parents=True, exist_ok=True)
        lock_path = db.with_name(db.name + ".hopperlab.lock")
    else:
        digest = hashlib.sha256(redact_uri(tracking_uri).encode()).hexdigest()[:16]
        lock_path = Path(tempfile.gettempdir()) / f"hopperlab-mlflow-{digest}.lock"
    with _held(lock_path, tracking_uri):
        yield


@contextlib.contextmanager
def _held(path: Path, tracking_uri: str) -> Iterator[None]:
    """An exclusive flock on ``path`` for the block; a file that cannot be opened (a read-only
    store folder) makes the upload wait for `hopperlab sync`."""
    try:
        fh = open(path, "a")
    except OSError as exc:
        raise TrackingUnavailable(tracking_uri, f"cannot open the lock file {path}: "
                                  f"{exc.strerror or exc}") from exc
    with fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


#: the run locks of one tracking server on a host: a run's uid picks one (bounded files)
RUN_LOCK_BUCKETS = 64


@contextlib.contextmanager
def run_upload_lock(tracking_uri: str, uid: str) -> Iterator[None]:
    """Held for the whole upload of one run to a server, by every uploader on this host (each
    `hopperlab sync`, each job's upload): two never upload, or delete, the same run at once."""
    digest = hashlib.sha256(redact_uri(tracking_uri).encode()).hexdigest()[:16]
    bucket = int(hashlib.sha256(uid.encode()).hexdigest(), 16) % RUN_LOCK_BUCKETS
    path = Path(tempfile.gettempdir()) / f"hopperlab-mlflow-{digest}-run{bucket}.lock"
    with _held(path, tracking_uri):
        yield


def mlflow_client(tracking_uri: str):
    """MLflow's client of ``tracking_uri``. A Python without MLflow (a lent node that carries
    only what its runs need) is ``TrackingUnavailable``, as a store that does not answer: the
    runs stay on disk and ``hopperlab sync`` uploads them from where MLflow is."""
    _await_warm_up()
    try:
        import mlflow
    except ImportError as exc:
        raise TrackingUnavailable(tracking_uri, f"mlflow is not installed in {sys.executable}: "
                                  f"{exc}") from exc
    return retry(mlflow.MlflowClient, tracking_uri)


@contextlib.contextmanager
def reading(tracking_uri: str) -> Iterator[Any]:
    """The client of every verb that reads a store (``compare --mlflow``, ``compare
    family/experiment``, ``history``, ``machines --mlflow``): a server that does not answer
    ``/health`` within ``HEALTH_TIMEOUT_S`` is ``TrackingUnavailable`` at once (one line, no
    password), never minutes of MLflow's own retries ending in a traceback; every later
    failure inside the block is translated the same way."""
    with translate_errors(tracking_uri):
        require_reachable(tracking_uri)
        yield mlflow_client(tracking_uri)


def is_reachable(tracking_uri: str, timeout: float = HEALTH_TIMEOUT_S) -> bool:
    """Quick check: ``GET /health`` for an http(s) server; True for local stores."""
    if not is_http(tracking_uri):
        return True
    import requests

    try:
        r = requests.get(redact_uri(tracking_uri) + "/health", timeout=timeout)
    except requests.RequestException:
        return False
    # Any answer but a gateway error means something is there (a proxy may want auth for
    # /health, or not route it): the real calls will tell the rest.
    return r.status_code not in (502, 503, 504)


def require_reachable(tracking_uri: str) -> None:
    if not is_reachable(tracking_uri):
        raise TrackingUnavailable(tracking_uri, "no answer on /health")


def warm_up_in_background() -> None:
    """Import MLflow in a thread: it takes about 2 s of CPU, better spent while a job runs than
    after it, when the upload waits for it."""
    global _warm_up
    if _warm_up is not None:
        return
    _warm_up = threading.Thread(target=_import_mlflow, name="hopperlab-mlflow-import",
                                daemon=True)
    _warm_up.start()


def _import_mlflow() -> None:
    with contextlib.suppress(ImportError):  # no MLflow here: the upload says so, once
        import mlflow  # noqa: F401
