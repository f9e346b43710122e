"""What "the same answers" means for a database variant: every query's answer equals DuckDB's.

The run checks its own answers against DuckDB on the same tables (``all_correct``,
``artifacts/answers.json``), a stronger reference than another variant: a placement, an
encoding or fused kernels that answer otherwise read DIFFERENT.
"""

from __future__ import annotations

from typing import Any, Mapping

from hopperlab.workloads.sameness import Sameness, exact


def rule(variant: Mapping[str, Any], reference: Mapping[str, Any]) -> Sameness:
    """Every variant: its answers against DuckDB's (the reference run is not read)."""
    return exact("answers", "checked against DuckDB inside the run")
