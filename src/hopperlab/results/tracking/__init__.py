"""Upload finished run directories to MLflow, on the submitting side (the job never talks to
MLflow): an experiment per family, a parent run per experiment, a child run per variant and
attempt, found again by its ``hopperlab.run_uid`` tag, so that an upload is idempotent and two
results folders never share a run. ``client`` hardens the connection, ``layout`` names what goes
where, ``upload`` and ``sync`` move the runs. The layout and its rules: docs/tracking.md.
"""

from hopperlab.core.secrets import redact_uri
from hopperlab.results.tracking.client import (TrackingError, TrackingUnavailable, is_reachable,
                                               scrub, warm_up_in_background)
from hopperlab.results.tracking.layout import (TAG_ATTEMPT, TAG_EXPERIMENT, TAG_FAMILY, TAG_REASON,
                                               TAG_ROLE, TAG_RUN_KEY, TAG_RUN_UID, TAG_STATUS,
                                               TAG_UPLOADED, TAG_VARIANT, compare_url,
                                               experiment_compare_url, flatten, prepare, safe_key)
from hopperlab.results.tracking.sync import SyncReport, find_run_dirs, is_synced, sync
from hopperlab.results.tracking.upload import run_uid, upload_quietly, upload_run

__all__ = [
    "TAG_ATTEMPT", "TAG_EXPERIMENT", "TAG_FAMILY", "TAG_REASON", "TAG_ROLE", "TAG_RUN_KEY",
    "TAG_RUN_UID", "TAG_STATUS", "TAG_UPLOADED", "TAG_VARIANT", "SyncReport", "TrackingError",
    "TrackingUnavailable", "compare_url", "experiment_compare_url", "find_run_dirs", "flatten",
    "is_reachable", "is_synced", "prepare", "redact_uri", "run_uid", "safe_key", "scrub", "sync",
    "upload_quietly", "upload_run", "warm_up_in_background",
]
