"""``--config processes=N``: how many independent jobs measure each selected run.

Why a level of its own beside ``repeats``: windows inside one process agree more closely than
processes do (docs/benchmarks/noise.md: TPC-H host-pinned q6 within 0.14 % between windows,
+5.5 % in the next process), so a reference that holds is made from the spread between
processes. The value comes from this invocation's config only: a variant never asks for it.
"""

from __future__ import annotations

from typing import Any, Mapping

from hopperlab.core.errors import SpecError, shown

WHERE = "configs/config.yaml (with --config overrides): processes"


def resolve_processes(config: Mapping[str, Any]) -> int:
    """``processes`` of the config (null: 1), an integer >= 1, else one line naming the key."""
    value = config.get("processes")
    if value is None:
        return 1
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise SpecError(f"{WHERE}: {shown(value)} is not an integer >= 1") from None
    if n < 1 or isinstance(value, bool) or str(n) != str(value).strip():
        raise SpecError(f"{WHERE}: {shown(value)} is not an integer >= 1")
    return n
