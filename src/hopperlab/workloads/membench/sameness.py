"""What "the same bytes" means for a membench variant against the run it is compared with.

Not compared across variants: a copy run checks every destination against the source pattern
inside the run (a wrong byte fails the run, ``copies.py``), and an allocation or a collective
times buffers whose contents no variant reads back. A checksum of what each copy moved, compared
between variants, is the open item of docs/correctness.md.
"""

from __future__ import annotations

from typing import Any, Mapping

from hopperlab.workloads.sameness import Sameness, not_comparable


def rule(variant: Mapping[str, Any], reference: Mapping[str, Any]) -> Sameness:
    """The declaration of ``variant`` against ``reference`` (both spec.json)."""
    tests = {(s.get("params") or {}).get("test") for s in (variant, reference)}
    if tests == {"copy"}:
        return not_comparable("each copy run checks its destination against the source "
                              "pattern itself (a wrong byte fails the run)")
    return not_comparable("allocation and collective runs time buffers whose contents no "
                          "variant reads back")
