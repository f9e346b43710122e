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

from hopperlab.config.spec import redact_uri
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
