"""Scale decided once, in the experiments' ``scales:`` (issue 31): database's ``settings`` and
membench's ``plan_for`` chose sizes and repeats again by the scale's name. A workload reads its
params only; the experiments file holds every scale's numbers."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from hopperlab.config.matrix import load_matrix
from hopperlab.workloads.membench import MembenchParams

ROOT = Path(__file__).resolve().parents[2]
WORKLOADS = ROOT / "src" / "hopperlab" / "workloads"


@pytest.mark.parametrize("family", ["database", "membench"])
def test_no_workload_module_reads_the_scale(family):
    """``spec.scale`` is for the record; the numbers come from the params."""
    for path in sorted((WORKLOADS / family).glob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        reads = [n.lineno for n in ast.walk(tree)
                 if isinstance(n, ast.Attribute) and n.attr == "scale"
                 and isinstance(n.value, ast.Name) and n.value.id == "spec"]
        names = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Name)
                 and n.id.startswith("DEFAULT_") and n.id.endswith(
                     ("_REPEATS", "_WARMUP", "_SIZES_MB", "_MAX_BYTES", "_CHUNK_ROWS"))]
        assert not reads and not names, f"{path.name}: scale read at lines {reads + names}"


def test_full_scale_numbers_are_in_the_experiments_file():
    full = load_matrix(ROOT, {"families": ["membench", "database"], "scale": "full"})
    copy = full.runs["membench/copy/h2d-pinned"].params
    assert (max(copy.sizes_mb), copy.repeats, copy.warmup, copy.sample_mb) == (1024, 20, 3, 256)
    alloc = full.runs["membench/alloc/device"].params
    assert (max(alloc.sizes_mb), alloc.repeats, alloc.warmup) == (4096, 10, 2)
    assert full.runs["membench/collective/all-reduce"].params.max_bytes == 1 << 30
    tpch = full.runs["database/tpch/device"].params
    assert (tpch.repeats, tpch.warmup, tpch.chunk_rows) == (10, 2, 16 * 2**20)


def test_smoke_scale_keeps_its_numbers():
    """The smoke matrix runs what it ran before (the params' defaults are its numbers)."""
    smoke = load_matrix(ROOT, {"families": ["membench", "database"], "scale": "smoke"})
    copy = smoke.runs["membench/copy/h2d-pinned"].params
    assert (copy.sizes_mb, copy.repeats, copy.warmup, copy.sample_mb) == ((1, 8, 32), 3, 1, 16)
    assert smoke.runs["membench/collective/all-reduce"].params.max_bytes == 1 << 20
    tpch = smoke.runs["database/tpch/device"].params
    assert (tpch.repeats, tpch.warmup, tpch.chunk_rows) == (1, 1, 16_384)
    defaults = MembenchParams()
    assert dataclasses.replace(copy, direction=defaults.direction,
                               host_memory=defaults.host_memory) == defaults
