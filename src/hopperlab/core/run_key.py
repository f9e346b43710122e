"""A run's key, ``family/experiment/variant``, as a run directory and its records state it.

A record is data a job (or anyone who can write to a results folder) wrote; its key becomes a
references file's section, a glob ``check`` matches, a folder name. A part with a path
separator, a newline or a glob character would plant a reference of the record's choosing
(issue 46, D18), so each part is a plain name, the same the matrix's schema allows and a
little wider (upper case, ``+``): what Snakemake's paths of the matrix hold always passes.
"""

from __future__ import annotations

import re
from typing import Any

#: one part of a key: a letter or digit, then letters, digits and ``. _ + -``
PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")
_CHAR = re.compile(r"[A-Za-z0-9._+-]")
#: the record fields that name the run, in the key's order
PARTS = ("family", "experiment", "variant")


def part_problem(value: Any) -> str | None:
    """Why ``value`` is not a part of a key (None: it is one)."""
    if not isinstance(value, str):
        return f"{value!r} is not a name (a string)"
    if not value:
        return "is empty"
    if PART.fullmatch(value):
        return None
    odd = next((c for c in value if not _CHAR.fullmatch(c)), value[0])
    return (f"{value!r} is not a name: {odd!r} (a name is letters, digits and . _ + -, "
            f"starting with a letter or digit)")


def key_problem(key: Any) -> str | None:
    """Why ``key`` is not ``family/experiment/variant`` of names (None: it is)."""
    parts = key.split("/") if isinstance(key, str) else []
    if len(parts) != len(PARTS):
        return f"{key!r} is not family/experiment/variant"
    return next((f"{name} {why}" for name, part in zip(PARTS, parts)
                 if (why := part_problem(part))), None)
