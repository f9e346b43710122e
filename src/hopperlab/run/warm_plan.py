"""Warm or cold, decided once: whether a job is forked by the workflow's warm starter
(run/warm.py, through run/warm_client.py) or starts as a fresh python, and why.

The submitting side builds the job's command from it (``launch.job_python``), the workflow asks
it whether a starter is worth starting at all (``could_be_warm``), and a job it plans cold while
a starter runs carries the reason to its record (``warm_client.COLD_ENV``, which the runner
writes into hardware.json as the starter's own refusals are).
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from hopperlab.run.warm_client import COLD_ENV, SOCKET_ENV, serves

#: the reason of a job the starter forks
WARM = "forked by the workflow's warm starter"


def warm_plan(spec: Any, environ: Mapping[str, str] | None = None) -> tuple[str | None, str]:
    """(the starter's socket, why) for a job to fork, (None, why it starts cold) otherwise."""
    environ = os.environ if environ is None else environ
    socket = environ.get(SOCKET_ENV) or None
    backend = spec.site.backend
    if socket is None:
        return None, "no warm starter runs (a workflow starts one for the jobs it can fork)"
    if backend.in_process or backend.job_handle != "process":
        return None, (f"the {spec.site.executor} executor does not start the job as a process "
                      f"of this host")
    if not serves(backend, spec.resources.gpus):
        return None, (f"the run holds {spec.resources.gpus} GPU(s): CUDA never starts in the "
                      f"starter, so that forking it stays safe")
    if spec.site.container.image:
        return None, f"the job runs in the site's container image {spec.site.container.image!r}"
    if spec.knobs.profiler != "none":
        return None, f"the job runs under the profiler ({spec.knobs.profiler})"
    return socket, WARM


def could_be_warm(spec: Any) -> bool:
    """Whether a starter, if one ran, would fork this job (the workflow starts one only then)."""
    return warm_plan(spec, {SOCKET_ENV: "starter"})[0] is not None


def cold_env(spec: Any, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """What a job planned cold while a starter runs carries in its environment: the reason,
    for its record (empty where it is forked, or where no starter runs at all)."""
    environ = os.environ if environ is None else environ
    socket, why = warm_plan(spec, environ)
    return {COLD_ENV: why} if socket is None and environ.get(SOCKET_ENV) else {}
