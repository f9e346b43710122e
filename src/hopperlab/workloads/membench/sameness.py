"""What "the same bytes" means for a membench variant against the run it is compared with.

A copy variant moves the same pattern at the same sizes whatever its direction or host memory,
so the checksum of what arrived (``artifacts/evidence.json`` ``checksum``, ``moved.py``) must
be the very same. An allocation or a collective times buffers whose contents no variant reads
back: not comparable.
"""

from __future__ import annotations

from typing import Any, Mapping

from hopperlab.workloads.sameness import Sameness, exact, not_comparable


def rule(variant: Mapping[str, Any], reference: Mapping[str, Any]) -> Sameness:
    """The declaration of ``variant`` against ``reference`` (both spec.json)."""
    params = [s.get("params") or {} for s in (variant, reference)]
    if {p.get("test") for p in params} != {"copy"}:
        return not_comparable("allocation and collective runs time buffers whose contents no "
                              "variant reads back")
    if params[0].get("sizes_mb") != params[1].get("sizes_mb"):
        return not_comparable("copies of other sizes")
    return exact("checksum")
