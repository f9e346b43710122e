"""The job's energy as Slurm's accounting saw it (``sacct ConsumedEnergyRaw``), when it does.

Slurm fills it only where the site runs an energy-gathering plugin (``AcctGatherEnergyType``:
ipmi, rapl, gpu, pm_counters); without one it reads 0 or nothing, which here is "not collected",
never 0 J. It covers the whole job on all its nodes (start-up included), so it stands beside the
measured window's figures, not in place of them. Asked once, by the submitting side.
"""

from __future__ import annotations

import shutil
import subprocess

SACCT_TIMEOUT_S = 10.0
METRIC = "energy_slurm_job_j"
TAG = "energy.slurm"


def parse_consumed_energy(text: str) -> float | None:
    """Joules from ``sacct -n -P -X -o ConsumedEnergyRaw`` output (None: not collected)."""
    for line in text.splitlines():
        value = line.strip()
        if not value:
            continue
        try:
            joules = float(value)
        except ValueError:
            return None
        return joules if joules > 0 else None
    return None


def consumed_energy(job_id: str) -> tuple[float | None, str]:
    """The job's joules and what the record says of them."""
    exe = shutil.which("sacct")
    if exe is None:
        return None, "not collected: no sacct on this node"
    try:
        out = subprocess.run([exe, "-j", str(job_id), "-n", "-P", "-X", "-o",
                              "ConsumedEnergyRaw"], capture_output=True, text=True,
                             timeout=SACCT_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"not collected: sacct failed ({type(exc).__name__})"
    joules = parse_consumed_energy(out.stdout) if out.returncode == 0 else None
    if joules is None:
        return None, ("not collected: the site's accounting gathers no energy "
                      "(AcctGatherEnergyType)")
    return joules, "sacct ConsumedEnergyRaw: the whole job, all its nodes"
