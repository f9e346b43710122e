"""Run directories written by hand, shaped as the recorder writes them: a selftest run whose
``value`` (higher is better, judged) was measured in ``samples`` windows. Tests of what
``references update`` and ``check`` make of a folder break one file of such a run, and need
no job to have run."""

from __future__ import annotations

import itertools
import json
import uuid
from pathlib import Path
from typing import Any, Sequence

from hopperlab.core.stats import percentile

KEY = "selftest/noise/noisy"
#: each run written starts at a second of its own (an independent run is another start)
_STARTS = itertools.count()


def _start(n: int) -> str:
    return f"2026-12-01T{n // 3600 % 24:02d}:{n // 60 % 60:02d}:{n % 60:02d}.000+00:00"


def write_run(results: Path, key: str = KEY, samples: Sequence[float] = (10.0, 10.1, 9.9),
              machine: str = "m1", record: dict[str, Any] | None = None,
              spec: dict[str, Any] | None = None) -> Path:
    """``results/<key>/`` with spec.json, record.json, metrics.json and samples.jsonl; the
    record's and spec's keys updated with ``record``/``spec`` (a key set to None is removed)."""
    family, experiment, variant = key.split("/")
    run_dir = results / key
    run_dir.mkdir(parents=True)
    uid = uuid.uuid4().hex
    identity = {"key": key, "family": family, "experiment": experiment, "variant": variant}
    spec_data = {**identity, "scale": "smoke", "baseline": variant, "repeats": len(samples),
                 "headline_metrics": ["value"], "attempt": 1, "run_uid": uid}
    finite = [s for s in samples if isinstance(s, (int, float)) and s == s]
    rec = {**identity, "run_uid": uid, "attempt": 1, "status": "ok", "reason": None,
           "metrics": {"value": percentile(finite, 50)} if finite else {},
           "tags": {"repeats": str(len(samples)), "repeat_unit": "windows"},
           "started_at": _start(next(_STARTS)),
           "finished_at": "2026-12-01T10:00:05.000+00:00", "duration_s": 5.0,
           "hardware": {"hostname": "node-1", "cpu_model": "Xeon", "cpu_arch": "x86_64"},
           "slurm": None, "machine": machine}
    for data, changes in ((spec_data, spec), (rec, record)):
        for k, v in (changes or {}).items():
            if v is None:
                data.pop(k, None)
            else:
                data[k] = v
    (run_dir / "spec.json").write_text(json.dumps(spec_data))
    for name in ("record.json", "metrics.json"):
        (run_dir / name).write_text(json.dumps(rec))
    (run_dir / "samples.jsonl").write_text("".join(
        json.dumps({"repeat": i, "metrics": {"value": v}}) + "\n" for i, v in enumerate(samples)))
    return run_dir


def reference_file(refs: Path, machine: str = "m1", runs: Sequence[str] = (KEY,),
                   value: float = 10.0) -> Path:
    """``refs/<machine>.yaml`` with a measured reference of ``value`` for each run."""
    refs.mkdir(parents=True, exist_ok=True)
    path = refs / f"{machine}.yaml"
    path.write_text(f"machine: {machine}\nreferences:\n" + "".join(
        f"  {run}:\n    value: {{value: {value}, spread: 0.01, n: 5, min_effect: 0.05}}\n"
        for run in runs))
    return path
