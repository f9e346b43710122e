"""One run directory into one MLflow child run, idempotently: the run is found again by its
``hopperlab.run_uid`` tag and counts as complete only once ``hopperlab.uploaded`` is set."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import socket
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from hopperlab.core.rundir import (
    FAILING_STATUSES,
    HARDWARE_FILE,
    METRICS_FILE,
    MLFLOW_FILE,
    RECORD_FILE,
    RUN_UID,
    SPEC_FILE,
    TRACEBACK_FILE,
    load_record,
    read_json,
    read_steps,
    write_json_atomic,
)
from hopperlab.core.secrets import redact_uri
from hopperlab.core.stats import half_width, plus_minus
from hopperlab.results import correctness
from hopperlab.results.tracking.client import (
    TrackingError,
    TrackingUnavailable,
    mlflow_client,
    require_reachable,
    retry,
    run_upload_lock,
    scrub,
    sqlite_path,
    store_lock,
    translate_errors,
)
from hopperlab.results.tracking.verdicts import SET_KEY, verdict_tags
from hopperlab.results.tracking.layout import (
    MAX_METRICS_PER_BATCH,
    MAX_PARAM_VALUE,
    MAX_PARAMS_PER_BATCH,
    MAX_TAG_VALUE,
    MAX_TAGS_PER_BATCH,
    TAG_ATTEMPT,
    TAG_EXPERIMENT,
    TAG_FAMILY,
    TAG_PARENT,
    TAG_REASON,
    TAG_RUN_KEY,
    TAG_RUN_UID,
    TAG_STATUS,
    TAG_UPLOADED,
    TAG_UPLOADING,
    TAG_VARIANT,
    chunks,
    end_ms,
    ensure_parent,
    flatten,
    quote_filter_value,
    run_key,
    run_name,
    safe_key,
    to_ms,
)

log = logging.getLogger(__name__)


@dataclass
class RunFiles:
    run_dir: Path
    record: dict[str, Any]
    spec: dict[str, Any]
    family: str
    experiment: str
    variant: str
    attempt: int
    #: the attempt's identity in MLflow (see run_uid)
    uid: str
    #: the correctness tags this upload gave the run (``verdicts``; None: not uploaded now),
    #: kept in ``mlflow.json`` so that a later verdict is set only where it differs
    verdict_set: dict[str, str] | None = None

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


def find_spec(run_dir: Path) -> dict[str, Any]:
    candidates = [run_dir / SPEC_FILE]
    if run_dir.parent.name == "attempts":  # an archived attempt: <run_dir>/attempts/<n>/
        candidates.append(run_dir.parent.parent / SPEC_FILE)
    for path in candidates:
        if path.exists():
            return read_json(path)
    return {}


def read_run(run_dir: Path) -> RunFiles:
    run_dir = Path(run_dir)
    record = load_record(run_dir)
    if record is None:
        raise TrackingError(f"{run_dir}: no {METRICS_FILE} or {RECORD_FILE}: nothing to upload")
    spec = find_spec(run_dir)
    ident: dict[str, str] = {}
    for name in ("family", "experiment", "variant"):
        value = record.get(name) or spec.get(name)
        if not value:
            raise TrackingError(f"{run_dir}: the record names no {name}")
        ident[name] = str(value)
    attempt = int(record.get("attempt") or 1)
    return RunFiles(run_dir, record, spec, ident["family"], ident["experiment"], ident["variant"],
                attempt, run_uid(record, spec))


def _hardware(run: RunFiles) -> dict[str, Any]:
    hw = run.record.get("hardware") or {}
    if not hw and (run.run_dir / HARDWARE_FILE).exists():
        with contextlib.suppress(Exception):
            hw = read_json(run.run_dir / HARDWARE_FILE)
    return hw if isinstance(hw, dict) else {}


def _tags(run: RunFiles, parent_id: str) -> dict[str, str]:
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
    metrics = {k: v for k, v in (rec.get("metrics") or {}).items() if isinstance(v, (int, float))}
    for name, value in metrics.items():  # repeated runs: "value ± half-width" beside the metric
        half = half_width(metrics, name)
        if half is not None:
            tags[f"pm.{name}"] = plus_minus(value, half)
    out = {safe_key(k): scrub(str(v))[:MAX_TAG_VALUE] for k, v in tags.items() if v is not None}
    run.verdict_set = verdict_tags(correctness.of_run_dir(run.run_dir))  # beside the speed
    out.update(run.verdict_set)
    out[TAG_PARENT] = parent_id
    return out


def _metrics(run: RunFiles) -> list:
    from mlflow.entities import Metric

    out = []
    last_step: dict[str, int] = {}
    last_ts = 0
    for line in read_steps(run.run_dir):
        try:
            step = int(line.get("step", 0))
            ts = to_ms(line.get("time")) or 0
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
    # its UI shows) is the later one, and finished_at had whole seconds in records before
    # 2026-11-26, so the last step, logged within that second, would otherwise win
    # (tokens_per_s: the last step's rate instead of the median).
    finished = to_ms(run.record.get("finished_at")) or int(time.time() * 1000)
    finished = max(finished, last_ts + 1)
    for name, value in (run.record.get("metrics") or {}).items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        out.append(Metric(safe_key(name), float(value), finished, last_step.get(name, 0)))
    for name, value in correctness.mlflow_fields(run.run_dir)[1].items():
        out.append(Metric(safe_key(name), float(value), finished, 0))
    return out


def _params(run: RunFiles) -> list:
    from mlflow.entities import Param

    params: dict[str, str] = {}
    for key, value in flatten(run.spec).items():
        # no duplicate keys in a batch; no credentials (a spec.json written before they were
        # stripped at the source)
        params.setdefault(safe_key(key), scrub(value)[:MAX_PARAM_VALUE])
    params.update(axis_params(run.variant, params))
    return [Param(k, v) for k, v in params.items()]


def axis_params(variant: str, params: dict[str, str]) -> dict[str, str]:
    """A sweep point's axes as ``axis.<name>`` params (config/sweeps.py names a point
    ``<technique>.<axis>-<value>...``), and its technique, so that MLflow's parallel
    coordinates view has one column per axis; {} for a variant of no sweep."""
    technique, *parts = variant.split(".")
    out = {"axis.technique": technique} if parts else {}
    for part in parts:
        axis = part.split("-", 1)[0]
        value = params.get(f"params.{axis}", params.get(f"knobs.{axis}"))
        if value is not None:
            out[f"axis.{axis}"] = value
    return out


def _log_artifacts(client, run_id: str, run_dir: Path) -> None:
    for name in ("logs", "artifacts", "ranks"):  # ranks/<r>/: each rank's own files
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
    clean = scrub(text)
    if clean == text:
        client.log_artifact(run_id, str(path))
        return
    with tempfile.TemporaryDirectory(prefix="hopperlab-artifact-") as tmp:
        copy = Path(tmp) / path.name
        copy.write_text(clean)
        client.log_artifact(run_id, str(copy))


def _existing(client, experiment_id: str, uid: str) -> list:
    flt = f"tags.`{TAG_RUN_UID}` = {quote_filter_value(uid)}"
    return retry(client.search_runs, [experiment_id], filter_string=flt, max_results=100)


def _legacy_upload(client, run: RunFiles, experiment_id: str) -> str | None:
    """The run id of this attempt's upload from before run uids, if this run directory's
    ``mlflow.json`` names one (complete, same key, no uid yet): it is tagged with the uid and
    kept, so that upgrading does not upload every old run twice."""
    try:
        info = read_json(run.run_dir / MLFLOW_FILE)
        if int(info.get("attempt", -1)) != run.attempt or info.get(RUN_UID):
            return None
        old = retry(client.get_run, str(info["run_id"]))
    except Exception:  # noqa: BLE001 - no usable mlflow.json or no such run: upload anew
        return None
    tags = old.data.tags
    if (old.info.experiment_id != experiment_id or old.info.lifecycle_stage != "active"
            or tags.get(TAG_RUN_KEY) != run.key or tags.get(TAG_UPLOADED) != "true"
            or TAG_RUN_UID in tags):
        return None
    retry(client.set_tag, old.info.run_id, TAG_RUN_UID, run.uid, synchronous=True)
    return old.info.run_id


def write_mlflow_json(run: RunFiles, run_id: str, experiment_id: str, tracking_uri: str) -> None:
    write_json_atomic(run.run_dir / MLFLOW_FILE, {
        "attempt": run.attempt,
        RUN_UID: run.uid,
        "run_id": run_id,
        "experiment_id": experiment_id,
        "tracking_uri": redact_uri(tracking_uri),
        **({SET_KEY: run.verdict_set} if run.verdict_set is not None else {}),
    })


def upload_run(run_dir: Path, tracking_uri: str) -> str:
    """Upload one finished run directory (or archived attempt) as a child run; its MLflow id.

    Creates the family experiment and the parent run when missing (under a lock: no marker
    or earlier step is needed). Idempotent: a complete earlier upload of the same attempt
    (the same run uid) is reused, a half-done one is deleted and done again; a run of the same
    key from another folder is never reused. Writes ``mlflow.json`` on success.
    Raises TrackingUnavailable when the server cannot be reached (the run dir is untouched).
    """
    run_id, _ = upload_run_files(read_run(Path(run_dir)), tracking_uri)
    return run_id


def upload_run_files(run: RunFiles, tracking_uri: str) -> tuple[str, bool]:
    """(run id, whether it was made now rather than found complete)."""
    with translate_errors(tracking_uri):
        require_reachable(tracking_uri)
        sqlite = sqlite_path(tracking_uri) is not None
        # SQLite: one writer at a time on this host. Server: only the get-or-create is locked.
        with store_lock(tracking_uri) if sqlite else contextlib.nullcontext():
            client = mlflow_client(tracking_uri)
            with contextlib.nullcontext() if sqlite else store_lock(tracking_uri):
                experiment_id, parent_id = ensure_parent(client, tracking_uri, run.family,
                                                   run.experiment)
            # a server: the run's own lock for the whole upload (SQLite: the store's, above)
            with contextlib.nullcontext() if sqlite else run_upload_lock(tracking_uri, run.uid):
                run_id, created = _upload(client, run, experiment_id, parent_id)
    write_mlflow_json(run, run_id, experiment_id, tracking_uri)
    return run_id, created


#: a half-done upload younger than this is another uploader's work in progress (another
#: host's: this host's are kept apart by ``run_upload_lock``), never deleted
FRESH_UPLOAD_S = 900.0


class UploadInProgress(TrackingError):
    """Another uploader is uploading this run now: left to it (``sync`` looks again later)."""


def _uploader_mark() -> str:
    return f"{socket.gethostname()} {os.getpid()} {time.time():.0f}"


def _fresh_elsewhere(tags: Mapping[str, str]) -> str | None:
    """Who uploads a half-done run now, if it is fresh and not this host's (whose uploads of
    one run never overlap: ``run_upload_lock``)."""
    host, _, rest = (tags.get(TAG_UPLOADING) or "").partition(" ")
    pid, _, since = rest.partition(" ")
    try:
        age = time.time() - float(since)
    except ValueError:
        return None
    if host == socket.gethostname() or age > FRESH_UPLOAD_S:
        return None
    return f"pid {pid} on host {host}, {max(0.0, age):.0f} s ago"


def _upload(client, run: RunFiles, experiment_id: str, parent_id: str) -> tuple[str, bool]:
    for old in _existing(client, experiment_id, run.uid):
        if old.data.tags.get(TAG_UPLOADED) == "true":
            log.debug("%s already in MLflow as %s", run.key, old.info.run_id)
            return old.info.run_id, False
    for old in _existing(client, experiment_id, run.uid):
        who = _fresh_elsewhere(old.data.tags)
        if who:
            raise UploadInProgress(f"{run.key}: being uploaded by {who} (MLflow run "
                                   f"{old.info.run_id}); left to it")
        log.info("%s: deleting half-uploaded MLflow run %s", run.key, old.info.run_id)
        retry(client.delete_run, old.info.run_id)
    legacy = _legacy_upload(client, run, experiment_id)
    if legacy is not None:
        return legacy, False

    tags = _tags(run, parent_id)
    created = retry(client.create_run, experiment_id,
                     start_time=to_ms(run.record.get("started_at")),
                     tags={TAG_PARENT: parent_id, TAG_RUN_KEY: run.key, TAG_RUN_UID: run.uid,
                           TAG_UPLOADING: _uploader_mark()},
                     run_name=run_name(run.variant, run.attempt))
    run_id = created.info.run_id

    for chunk in chunks(_params(run), MAX_PARAMS_PER_BATCH):
        retry(client.log_batch, run_id, params=chunk, synchronous=True)
    from mlflow.entities import RunTag

    tag_list = [RunTag(k, v) for k, v in tags.items()]
    for chunk in chunks(tag_list, MAX_TAGS_PER_BATCH):
        retry(client.log_batch, run_id, tags=chunk, synchronous=True)
    for chunk in chunks(_metrics(run), MAX_METRICS_PER_BATCH):
        retry(client.log_batch, run_id, metrics=chunk, synchronous=True)
    _log_artifacts(client, run_id, run.run_dir)

    status = "FAILED" if run.record.get("status") in FAILING_STATUSES else "FINISHED"
    retry(client.set_terminated, run_id, status, end_time=end_ms(run.record))
    retry(client.set_tag, run_id, TAG_UPLOADED, "true", synchronous=True)
    return run_id, True


def upload_quietly(run_dir: Path, tracking_uri: str, log=print) -> bool:
    """Upload a run; on any tracking trouble say so and keep going (``hopperlab sync`` later)."""
    try:
        upload_run(run_dir, tracking_uri)
        return True
    except UploadInProgress as exc:
        log(f"[hopperlab] {exc}")
    except TrackingUnavailable as exc:
        log(f"[hopperlab] {exc}; the run is on disk in {run_dir}; "
            f"run `hopperlab sync` once MLflow is back")
    except Exception as exc:  # noqa: BLE001 - tracking trouble never loses the run
        text = " ".join(str(exc).split())[:500]  # one line, without a URI's credentials
        log(f"[hopperlab] upload of {run_dir} failed: {type(exc).__name__}: "
            f"{scrub(text)}; `hopperlab sync` retries it")
    return False
