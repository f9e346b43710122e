"""What the smoke matrix's results must say of correctness (issue 47), shared by the tests that
run the matrix (tests/platform/test_workflow_local.py): every ok variant with a reference has a
verdict; every exact-class one reads ``same``, every bounded one ``within bound``; ``not
compared`` only where its family declares the pair not comparable."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

from hopperlab.results import correctness
from hopperlab.results.rows import read_runs
from hopperlab.workloads import family_info
from hopperlab.workloads.sameness import BOUNDED, EXACT


def _spec(run_dir: Path) -> dict:
    return json.loads((Path(run_dir) / "spec.json").read_text())


def check_smoke_verdicts(results: Path, keys: Iterable[str]) -> dict[str, str]:
    """Assert the verdicts of the runs ``keys`` in ``results``; return key -> verdict."""
    keys = set(keys)
    runs, refused = read_runs(results)
    assert not refused, refused
    by_variant = {(r.family, r.experiment, r.variant): r for r in runs}
    out = {}
    for r in runs:
        if r.key not in keys or r.status != "ok":
            continue
        ref_name = r.compare_to or r.baseline
        if ref_name is None or ref_name == r.variant:
            assert r.correctness is None, r.key
            continue
        ref = by_variant.get((r.family, r.experiment, ref_name))
        v = r.correctness
        assert v is not None, r.key
        out[r.key] = v.state
        if ref is None or ref.status != "ok":
            assert v.state == correctness.NOT_COMPARED, (r.key, v)
            continue
        rule = family_info(r.family).load_sameness()
        declared = rule(_spec(r.run_dir), _spec(ref.run_dir)) if rule else None
        want = {EXACT: correctness.SAME, BOUNDED: correctness.WITHIN}.get(
            declared.kind if declared else "", correctness.NOT_COMPARED)
        assert v.state == want, (r.key, declared, v)
    return out
