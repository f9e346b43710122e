"""Asking Slurm, on the submitting side, whether it can take a job and whether one still runs.

Before anything in a run directory is moved or submitted, ``check_scheduler`` makes sure that
``sbatch`` can reach a controller: a Slurm profile on a node whose Slurm is stopped must end in
one line naming the site file, not in a traceback per run and a results folder taken apart.
``job_active``, ``cancel`` and ``wait_until_gone`` keep two attempts of one run from ever
running side by side.
"""

from __future__ import annotations

import shutil
import subprocess
import time

from hopperlab.backends.base import CANCEL_WAIT_S, SchedulerDown

#: squeue states of a job that still holds, or will hold, the run directory
ACTIVE_STATES = frozenset({
    "PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED",
    "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED",
    "RESV_DEL_HOLD",
})


def check_scheduler(site_file: str) -> None:
    """Refuse, in one line naming ``site_file``, a Slurm site whose controller ``sbatch`` cannot
    reach from here (``scontrol ping`` answers at once, even when the controller is down)."""
    missing = [tool for tool in ("sbatch", "scontrol", "squeue") if shutil.which(tool) is None]
    if missing:
        raise SchedulerDown(f"{site_file}: executor: slurm, but {', '.join(missing)} "
                            f"{'is' if len(missing) == 1 else 'are'} not on this machine's PATH; "
                            f"run from a Slurm login node or choose another site "
                            f"(--config site=...)")
    try:
        out = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=60,
                             check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        raise SchedulerDown(f"{site_file}: executor: slurm, but `scontrol ping` failed "
                            f"({type(exc).__name__}); sbatch cannot reach a controller") from None
    said = " ".join((out.stdout + " " + out.stderr).split())
    if out.returncode != 0 or "DOWN" in said:
        first = said.split(" *")[0][:200] or f"exit status {out.returncode}"
        raise SchedulerDown(f"{site_file}: executor: slurm, but sbatch cannot reach a Slurm "
                            f"controller (`scontrol ping`: {first}); start Slurm, or choose "
                            f"another site (--config site=...); nothing was moved or submitted")


def partitions() -> list[str] | None:
    """The cluster's partitions (``sinfo``; None when it cannot be asked)."""
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%R"], capture_output=True, text=True,
                             timeout=60, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return sorted({ln.strip() for ln in out.stdout.splitlines() if ln.strip()})


def check_partition(site_file: str, partition: str | None) -> None:
    """Refuse, in one line naming ``site_file``, a ``slurm.partition`` the cluster does not
    have (sbatch would refuse every job of the workflow, one by one)."""
    if not partition:
        return
    known = partitions()
    if known is None or partition in known:
        return
    raise SchedulerDown(f"{site_file}: slurm.partition: {partition} is not a partition of this "
                        f"cluster (sinfo lists {', '.join(known) or 'none'}); set it to one of "
                        f"them, or remove it for the cluster's default; nothing was submitted")


def job_state(job_id: str) -> str | None:
    """The controller's state of ``job_id`` ("" when it no longer knows the job; None when
    squeue cannot be asked)."""
    try:
        out = subprocess.run(["squeue", "-h", "--states=all", "-o", "%T", "-j", job_id],
                             capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        # an id the controller forgot: "Invalid job id specified"
        return "" if "Invalid job id" in out.stderr else None
    states = [ln.strip() for ln in out.stdout.splitlines() if ln.strip()]
    return states[0] if states else ""


def pending_reason(job_id: str) -> tuple[str | None, str | None]:
    """(state, reason) of a queued job, as squeue says them ((None, None): squeue cannot tell)."""
    try:
        out = subprocess.run(["squeue", "-h", "-o", "%T|%r", "-j", job_id], capture_output=True,
                             text=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError):
        return None, None
    line = next((ln for ln in out.stdout.splitlines() if "|" in ln), "")
    if not line:
        return None, None
    state, _, reason = line.partition("|")
    return state.strip() or None, reason.strip() or None


def job_active(job_id: str) -> bool:
    """Whether the scheduler still runs (or will run) ``job_id``; unknown counts as active."""
    state = job_state(job_id)
    if state is None:
        return True
    return bool(state) and state.split()[0] in ACTIVE_STATES


def cancel(job_id: str) -> None:
    subprocess.run(["scancel", job_id], capture_output=True, text=True, timeout=60, check=False)


def wait_until_gone(job_id: str, poll_s: float, limit_s: float = CANCEL_WAIT_S) -> bool:
    """Poll until ``job_id`` has left the active states; False if it had not after ``limit_s``."""
    deadline = time.monotonic() + limit_s
    while True:
        state = job_state(job_id)
        if state is not None and (not state or state.split()[0] not in ACTIVE_STATES):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(max(0.2, poll_s))
