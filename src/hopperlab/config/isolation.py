"""Which runs are host-bound: judged on a host link or host CPU figure, so that another job on
the node moves it (2026-11-28: a false bidir-pinned regression came from a host-heavy run
beside it). An experiment declares it with the reason (``host_bound: <why>``), a variant may
say otherwise (``host_bound: false``) or give its own reason. The workflow runs such a run
alone on its node: locally it takes every Snakemake core, on Slurm an exclusive allocation
(``run/isolation.py`` says which in the record)."""

from __future__ import annotations

from typing import Any, Mapping

from hopperlab.core.errors import SpecError, shown


def host_bound(exp: Mapping[str, Any], var: Mapping[str, Any], where: str) -> str | None:
    """The reason the run is host-bound, or None; the variant's word over the experiment's."""
    value = var.get("host_bound", exp.get("host_bound"))
    if value is None or value is False:
        return None
    if not isinstance(value, str) or not value.strip():
        raise SpecError(f"{where}: host_bound: {shown(value)} is not a reason (a sentence "
                        f"saying which host figure the run is judged on) nor false")
    return value.strip()
