"""The correctness verdict (issue 47) of runs already in MLflow, brought up to date.

A run is uploaded when it ends, often before the run it is compared with has finished: its
``correctness`` tag then reads ``not compared`` (or nothing), and a later page computes the
real verdict from the run directories. Wherever a verdict is decided for a whole results folder
(``hopperlab report``, ``check``, ``sync``) the tracked runs whose tags differ are set again:
the tag, ``correctness.detail`` and ``.against``, the metric ``correctness_deviation``; a tag
the run no longer has a verdict for is deleted. ``mlflow.json`` keeps the tags last set, so
that a folder whose verdicts did not change asks MLflow nothing (and imports no MLflow).
A run tracked in another store than this one (its ``mlflow.json``) is left alone.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from hopperlab.core.rundir import MLFLOW_FILE, read_json, write_json_atomic
from hopperlab.core.secrets import redact_uri
from hopperlab.results import correctness
from hopperlab.results.tracking.client import (mlflow_client, require_reachable, retry, scrub,
                                               sqlite_path, store_lock, translate_errors)
from hopperlab.results.tracking.layout import MAX_TAG_VALUE, safe_key

#: the key of ``mlflow.json`` holding the verdict tags MLflow was last given for the run
SET_KEY = "correctness_tags"


def verdict_tags(verdict: correctness.Verdict | None) -> dict[str, str]:
    """The run's verdict as MLflow tags, as the uploader writes them ({}: no verdict)."""
    if verdict is None:
        return {}
    tags = {correctness.MLFLOW_TAG: verdict.state,
            f"{correctness.MLFLOW_TAG}.detail": verdict.detail,
            f"{correctness.MLFLOW_TAG}.against": verdict.against or ""}
    return {safe_key(k): scrub(str(v))[:MAX_TAG_VALUE] for k, v in tags.items()}


def from_tags(tags: Mapping[str, str], metrics: Mapping[str, float] | None = None
              ) -> correctness.Verdict | None:
    """The verdict an MLflow run's tags hold (``verdict_tags`` read back; None: no tag, or one
    that is no verdict), for the pages read from MLflow (``machines --mlflow``, ``compare
    --mlflow``): they mark a DIFFERENT run as the folder pages do."""
    state = tags.get(correctness.MLFLOW_TAG)
    if state not in correctness.VERDICTS:
        return None
    dev = (metrics or {}).get(correctness.MLFLOW_METRIC)
    return correctness.Verdict(str(state), tags.get(f"{correctness.MLFLOW_TAG}.against") or None,
                               tags.get(f"{correctness.MLFLOW_TAG}.detail", ""),
                               float(dev) if isinstance(dev, (int, float)) else None)


def _deviation(verdict: correctness.Verdict | None) -> float | None:
    dev = verdict.deviation if verdict is not None else None
    return dev if dev is not None and math.isfinite(dev) else None


def _is_verdict_tag(key: str) -> bool:
    return key == correctness.MLFLOW_TAG or key.startswith(correctness.MLFLOW_TAG + ".")


@dataclass
class VerdictSync:
    """What one pass did: the runs whose tags were set, and why the others were not."""

    updated: list[str] = field(default_factory=list)
    #: (run key, why): left as they were, a line each
    left: list[tuple[str, str]] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [f"[hopperlab] correctness in MLflow: {len(self.updated)} run(s) set to their "
               f"verdict now ({', '.join(self.updated)})"] if self.updated else []
        by_why: dict[str, list[str]] = {}
        for key, why in self.left:  # MLflow down: one line, not one per run
            by_why.setdefault(why, []).append(key)
        out += [f"[hopperlab] correctness of {keys[0]}"
                + (f" and {len(keys) - 1} more run(s)" if len(keys) > 1 else "")
                + f" not set in MLflow: {why}" for why, keys in by_why.items()]
        return out


def _pending(rows: Sequence[Any], tracking_uri: str) -> list[tuple[Any, dict[str, Any]]]:
    """The tracked runs (in this store) whose ``mlflow.json`` does not say their verdict was
    set as it reads now."""
    out = []
    store = redact_uri(tracking_uri)
    for r in rows:
        path = Path(r.run_dir) / MLFLOW_FILE
        try:
            info = read_json(path) if path.is_file() else None
        except (OSError, ValueError):
            info = None
        if not isinstance(info, Mapping) or not info.get("run_id") \
                or info.get("tracking_uri") != store:
            continue
        if info.get(SET_KEY) != verdict_tags(r.correctness):
            out.append((r, dict(info)))
    return out


def sync_verdicts(rows: Sequence[Any], tracking_uri: str) -> VerdictSync:
    """Set each tracked run's verdict tags in MLflow where they differ from its verdict now
    (``rows``: ``results.rows`` rows, their ``correctness`` computed). MLflow unreachable: each
    run left with the reason (``hopperlab sync`` sets them later); never raises for a run."""
    report = VerdictSync()
    pending = _pending(rows, tracking_uri)
    if not pending:
        return report
    try:
        with translate_errors(tracking_uri):
            require_reachable(tracking_uri)
            sqlite = sqlite_path(tracking_uri) is not None
            with store_lock(tracking_uri) if sqlite else contextlib.nullcontext():
                client = mlflow_client(tracking_uri)
                for r, info in pending:
                    _set_one(client, r, info, report)
    except Exception as exc:  # noqa: BLE001 - MLflow trouble never fails the page or check
        done = set(report.updated) | {k for k, _ in report.left}
        why = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
        report.left += [(r.key, f"{scrub(why)}; `hopperlab sync` sets it")
                        for r, _ in pending if r.key not in done]
    return report


def _set_one(client: Any, row: Any, info: dict[str, Any], report: VerdictSync) -> None:
    """One run's tags made its verdict's; ``mlflow.json`` then says so."""
    want = verdict_tags(row.correctness)
    try:
        run = retry(client.get_run, str(info["run_id"]))
    except Exception as exc:  # noqa: BLE001 - a run deleted from the store: said, not fatal
        report.left.append((row.key, f"MLflow run {info['run_id']}: {type(exc).__name__}"))
        return
    have = {k: v for k, v in run.data.tags.items() if _is_verdict_tag(k)}
    if have != want:
        for key, value in want.items():
            if have.get(key) != value:
                retry(client.set_tag, run.info.run_id, key, value, synchronous=True)
        for key in set(have) - set(want):
            retry(client.delete_tag, run.info.run_id, key)
        dev = _deviation(row.correctness)
        if dev is not None:
            retry(client.log_metric, run.info.run_id, correctness.MLFLOW_METRIC, dev,
                  synchronous=True)
        report.updated.append(row.key)
    write_json_atomic(Path(row.run_dir) / MLFLOW_FILE, {**info, SET_KEY: want})
