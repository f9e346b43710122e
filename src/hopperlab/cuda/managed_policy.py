"""The free-memory rule for managed (unified) memory, shared by every family (ARCHITECTURE.md).

Asking a discrete GPU for more managed memory than it has free can hang it for everyone on the
node, so a run checks its request here first. Grace Hopper (coherent NVLink-C2C: the CPU's memory
backs the GPU's) and a site that says ``allow_oversubscription: true`` are the exceptions.
"""

from __future__ import annotations

#: Managed memory may take at most this share of the GPU's free memory (unless Grace Hopper or
#: the site allows oversubscription): a program that asks for more can hang the GPU.
MANAGED_FREE_FRACTION = 0.5


def managed_bytes_allowed(request: int, free: int | None, is_grace_hopper: bool,
                          allow_oversubscription: bool) -> bool:
    """Whether ``request`` bytes of managed memory may be asked for on this node.

    Always on Grace Hopper (coherent NVLink-C2C: the CPU's memory backs the GPU's) or where the
    site says ``allow_oversubscription: true``; otherwise only up to ``MANAGED_FREE_FRACTION`` of
    the GPU's free memory, and never when the free memory is unknown.
    """
    if request < 0:
        raise ValueError(f"request must be 0 or more bytes, got {request}")
    if is_grace_hopper or allow_oversubscription:
        return True
    if free is None:
        return False
    return request <= MANAGED_FREE_FRACTION * free


def oversubscription_refusal(is_grace_hopper: bool, allow_oversubscription: bool, *,
                             node: str, site: str) -> str | None:
    """Why a run that asks for more managed memory than the GPU has may not run here (None: it
    may). Decided on the node, before any allocation: whether the node is a Grace Hopper is a
    fact of the node the job landed on, not of the spec (a site's GPU nodes may differ)."""
    if is_grace_hopper or allow_oversubscription:
        return None
    return (f"oversubscription refused before any allocation: this variant asks for more "
            f"managed memory than the GPU has, which only a Grace Hopper node (coherent "
            f"NVLink-C2C) or a site with allow_oversubscription: true may do; this node is "
            f"{node} and site {site} does not set allow_oversubscription: true")
