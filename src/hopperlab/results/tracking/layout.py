"""hopperlab's layout in MLflow: an experiment per family, a parent run per experiment, a
child run per variant and attempt; the tags, names and limits it uses, and the UI's compare
addresses."""

from __future__ import annotations

import contextlib
import json
import posixpath
import re
from datetime import datetime
from typing import Any, Iterable, Iterator, Mapping, TypeVar

from hopperlab.core.secrets import redact_uri
from hopperlab.results.tracking.client import (
    TrackingError,
    is_http,
    mlflow_client,
    reading,
    require_reachable,
    retry,
    sqlite_path,
    store_lock,
    translate_errors,
)

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
#: set when an upload starts: ``host pid epoch-seconds`` of the uploader; a run without
#: ``TAG_UPLOADED`` is another uploader's work in progress while this is fresh
TAG_UPLOADING = "hopperlab.uploading"


def run_key(family: str, experiment: str, variant: str, attempt: int) -> str:
    return f"{family}/{experiment}/{variant}#{attempt}"


def run_name(variant: str, attempt: int) -> str:
    return variant if attempt <= 1 else f"{variant} #{attempt}"


def to_ms(value: Any) -> int | None:
    """Milliseconds since the epoch from unix seconds or an ISO-8601 string."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return int(float(value) * 1000)
    try:
        return int(datetime.fromisoformat(str(value)).timestamp() * 1000)
    except ValueError:
        return None


def end_ms(record: Mapping[str, Any]) -> int | None:
    """End time: start + duration_s when both are known (records before 2026-11-26 have
    whole-second ISO times)."""
    start, duration = to_ms(record.get("started_at")), record.get("duration_s")
    if start is not None and isinstance(duration, (int, float)) and duration >= 0:
        return start + int(duration * 1000)
    return to_ms(record.get("finished_at"))


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


def chunks(items: list[T], size: int) -> Iterator[list[T]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


def quote_filter_value(value: str) -> str:
    """A string literal for an MLflow search filter."""
    if "'" not in value:
        return f"'{value}'"
    if '"' not in value:
        return f'"{value}"'
    raise TrackingError(f"cannot search MLflow for a value with both quote kinds: {value!r}")


def _artifact_location(tracking_uri: str, family: str) -> str | None:
    """For a SQLite store, artifacts next to the database (MLflow's default is ./mlruns of
    whatever the current directory is); servers choose for themselves."""
    db = sqlite_path(tracking_uri)
    if db is None:
        return None
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in family)
    return (db.parent / "mlartifacts" / safe).as_uri()


def _get_or_create_experiment(client, tracking_uri: str, family: str) -> str:
    from mlflow.exceptions import MlflowException

    exp = retry(client.get_experiment_by_name, family)
    if exp is None:
        try:
            return retry(client.create_experiment, family,
                          artifact_location=_artifact_location(tracking_uri, family),
                          tags={"hopperlab.family": family})
        except MlflowException as exc:
            # Another host created it in the meantime.
            exp = retry(client.get_experiment_by_name, family)
            if exp is None:
                raise TrackingError(f"cannot create MLflow experiment {family!r}: {exc}") from exc
    if exp.lifecycle_stage == "deleted":
        retry(client.restore_experiment, exp.experiment_id)
    return exp.experiment_id


def _parent_runs(client, experiment_id: str, experiment: str) -> list:
    flt = f"tags.`{TAG_ROLE}` = 'parent' and tags.`{TAG_EXPERIMENT}` = {quote_filter_value(experiment)}"
    runs = retry(client.search_runs, [experiment_id], filter_string=flt, max_results=100)
    return sorted(runs, key=lambda r: (r.info.start_time or 0, r.info.run_id))


def _get_or_create_parent(client, experiment_id: str, family: str, experiment: str) -> str:
    from mlflow.exceptions import MlflowException

    runs = _parent_runs(client, experiment_id, experiment)
    if runs:
        return runs[0].info.run_id
    run = retry(client.create_run, experiment_id, run_name=experiment,
                 tags={TAG_ROLE: "parent", TAG_FAMILY: family, TAG_EXPERIMENT: experiment})
    try:
        retry(client.set_terminated, run.info.run_id, "FINISHED")
    except MlflowException:
        pass  # a racer on another host already deleted it as a duplicate (below)
    # Several hosts may have raced past the search: keep the oldest parent, drop the others.
    # Every racer sees the same list, so they all agree on the one kept.
    runs = _parent_runs(client, experiment_id, experiment)
    keep = runs[0].info.run_id if runs else run.info.run_id
    for other in runs[1:]:
        with contextlib.suppress(Exception):
            retry(client.delete_run, other.info.run_id)
    return keep


def ensure_parent(client, tracking_uri: str, family: str, experiment: str) -> tuple[str, str]:
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
    with translate_errors(tracking_uri):
        require_reachable(tracking_uri)
        with store_lock(tracking_uri):
            client = mlflow_client(tracking_uri)
            for family, experiment in keys:
                ensure_parent(client, tracking_uri, family, experiment)


def compare_url(tracking_uri: str, run_ids: Iterable[str], experiment_ids: Iterable[str]) -> str:
    """The MLflow UI's compare view of these runs (MLflow 3):
    ``{server}/#/compare-runs?runs=["id1","id2"]&experiments=["1"]`` (JSON lists, URL-quoted)."""
    from urllib.parse import quote

    def js(items: Iterable[str]) -> str:
        return quote(json.dumps([str(i) for i in items], separators=(",", ":")), safe="")

    return (f"{redact_uri(tracking_uri)}/#/compare-runs?runs={js(run_ids)}"
            f"&experiments={js(sorted(set(experiment_ids)))}")


def experiment_compare_url(tracking_uri: str, family: str, experiment: str,
                           ui_uri: str | None = None,
                           run_uids: Iterable[str] | None = None) -> str:
    """Compare view of one experiment's variants, the latest attempt of each.

    ``ui_uri`` is where a person opens the UI (``mlflow ui`` on a SQLite store serves
    http://127.0.0.1:5000); it defaults to the tracking URI when that is a server.
    ``run_uids`` (the attempts one results folder's records name) keeps out the runs other
    folders uploaded to a shared server.
    """
    wanted = set(run_uids) if run_uids is not None else None
    with reading(tracking_uri) as client:
        exp = retry(client.get_experiment_by_name, family)
        if exp is None:
            raise TrackingError(f"no MLflow experiment {family!r} at {redact_uri(tracking_uri)}")
        flt = f"tags.`{TAG_EXPERIMENT}` = {quote_filter_value(experiment)}"
        runs = retry(client.search_runs, [exp.experiment_id], filter_string=flt,
                      max_results=5000)
    latest: dict[str, Any] = {}
    for run in runs:
        tags = run.data.tags
        if tags.get(TAG_ROLE) == "parent" or TAG_VARIANT not in tags:
            continue
        if wanted is not None and tags.get(TAG_RUN_UID) not in wanted:
            continue  # another results folder's run
        variant = tags[TAG_VARIANT]
        attempt = int(tags.get(TAG_ATTEMPT, 0))
        if variant not in latest or attempt > int(latest[variant].data.tags.get(TAG_ATTEMPT, 0)):
            latest[variant] = run
    if not latest:
        mine = " from this results folder (`hopperlab sync` uploads them)" \
            if wanted is not None else ""
        raise TrackingError(f"no runs of {family}/{experiment}{mine} at "
                            f"{redact_uri(tracking_uri)}")
    base = ui_uri or (tracking_uri if is_http(tracking_uri) else "http://127.0.0.1:5000")
    return compare_url(base, [latest[v].info.run_id for v in sorted(latest)],
                       [exp.experiment_id])
