"""The nodes of a Slurm partition: what ``hopperlab check --every-node`` fans out over (one job
per node and run, ``--nodelist``)."""

from __future__ import annotations

import subprocess

from hopperlab.core.errors import HopperlabError

#: node states (sinfo %t, without the flags after them) a job can be placed on
USABLE = ("idle", "mix", "alloc", "comp", "resv", "plnd")


def partition_nodes(partition: str | None) -> list[str]:
    """The usable nodes of ``partition`` (None: the default one), sorted; raises with sinfo's
    words when Slurm cannot be asked."""
    cmd = ["sinfo", "-h", "-N", "-o", "%N %t"] + (["-p", partition] if partition else [])
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise HopperlabError(f"{' '.join(cmd)}: {exc}") from None
    if out.returncode != 0:
        raise HopperlabError(f"{' '.join(cmd)}: {out.stderr.strip() or out.returncode}")
    nodes = set()
    for line in out.stdout.splitlines():
        name, _, state = line.strip().partition(" ")
        if name and state.rstrip("*~#!%$@^-+") in USABLE:
            nodes.add(name)
    if not nodes:
        raise HopperlabError(f"partition {partition or '(default)'}: no usable node "
                             f"(sinfo: {out.stdout.strip() or 'nothing'})")
    return sorted(nodes)
