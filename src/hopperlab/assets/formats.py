"""Structural checks of the files an asset holds, for sources that give no checksums.

A local copy of a model has no Hub checksums to compare with, but a truncated safetensors file
or a cut-off JSON file can still be told apart from a whole one. These checks read headers only.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Iterable

_MAX_HEADER = 100 << 20
_MAX_JSON = 64 << 20


def check_safetensors(path: Path) -> str | None:
    """None when the header parses and the file is exactly as long as its tensors need."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        raw = fh.read(8)
        if len(raw) < 8:
            return f"{size} bytes: too short for a safetensors header (partial)"
        (n,) = struct.unpack("<Q", raw)
        if n > _MAX_HEADER or 8 + n > size:
            return (f"safetensors header of {n} bytes does not fit in {size} bytes "
                    f"(partial or corrupted)")
        try:
            header = json.loads(fh.read(n))
        except (UnicodeDecodeError, ValueError):
            return "safetensors header is not valid JSON (corrupted)"
    end = 0
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        try:
            begin, stop = entry["data_offsets"]
        except (TypeError, KeyError, ValueError):
            return f"safetensors header entry {key!r} has no data_offsets (corrupted)"
        end = max(end, int(stop))
    if 8 + n + end != size:
        return f"{size} bytes, its header says {8 + n + end} (partial or corrupted)"
    return None


def check_json(path: Path) -> str | None:
    if path.stat().st_size > _MAX_JSON:
        return None
    try:
        json.loads(path.read_bytes())
    except (UnicodeDecodeError, ValueError) as exc:
        return f"not valid JSON ({exc.__class__.__name__}: partial or corrupted)"
    return None


def check_safetensors_index(folder: Path, path: Path) -> str | None:
    """A sharded checkpoint's index must name only shards that are there."""
    try:
        shards = set(json.loads(path.read_text()).get("weight_map", {}).values())
    except (OSError, ValueError, AttributeError):
        return None  # check_json reports it
    missing = sorted(s for s in shards if not (folder / s).is_file())
    return f"names shards that are missing: {', '.join(missing)}" if missing else None


def check_tree(folder: Path, files: Iterable[str]) -> list[str]:
    """Problems of known file formats under ``folder`` (``path: what``)."""
    folder = Path(folder)
    problems = []
    for rel in files:
        path = folder / rel
        why = None
        if rel.endswith(".safetensors"):
            why = check_safetensors(path)
        elif rel.endswith(".json"):
            why = check_json(path)
            if why is None and rel.endswith(".safetensors.index.json"):
                why = check_safetensors_index(folder, path)
        if why:
            problems.append(f"{rel}: {why}")
    return problems
