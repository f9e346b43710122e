"""What a run records to be compared with another run (issue 47): ``artifacts/evidence.json``.

One small JSON object per run, name -> value (greedy token ids, each fixed query's top-n, a
checksum of the bytes a copy moved), written by the workload as part of its normal work and
read by ``hopperlab.results.correctness``. Per-step figures (finetune's losses and gradient
norms) stay in ``steps.jsonl``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hopperlab.core.rundir import write_json_atomic

EVIDENCE_FILE = "evidence.json"


def add_evidence(recorder: Any, name: str, value: Any) -> None:
    """Put ``value`` (JSON: numbers, strings, lists) under ``name`` in the run's evidence file,
    keeping what earlier calls put there."""
    path = Path(recorder.artifact_path(EVIDENCE_FILE))
    data = read_evidence_file(path) or {}
    data[name] = value
    write_json_atomic(path, data)


def read_evidence_file(path: Path) -> dict[str, Any] | None:
    """The evidence object at ``path``; None where there is none or it is not an object."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
