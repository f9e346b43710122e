"""GPU lanes and isolation on one node, without CUDA (``HOPPERLAB_GPU_SLOTS=2`` stands in for
two GPUs): ``snakemake --resources gpus=2`` runs two 1-GPU jobs side by side, each on its own
slot, a 2-GPU job takes both, and the host-bound run overlaps no other job (the jobs' own start
and end times in their records show it) and says so in its record."""

from __future__ import annotations

import json
import os
from datetime import datetime
from pathlib import Path

import pytest

from hopperlab.backends.local import slots

from tests.helpers import copy_project, snakemake

pytestmark = pytest.mark.timeout(600)


def _span(rec: dict) -> tuple[datetime, datetime]:
    return datetime.fromisoformat(rec["started_at"]), datetime.fromisoformat(rec["finished_at"])


def _overlap(a: tuple[datetime, datetime], b: tuple[datetime, datetime]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


@pytest.mark.integration
def test_gpu_jobs_take_their_own_slots_and_a_host_bound_run_runs_alone(tmp_path):
    project = copy_project(tmp_path / "project")
    env = {**os.environ, slots.SLOTS_ENV: "2", slots.DIR_ENV: str(tmp_path / "slots")}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    out = snakemake(["--cores", "3", "--resources", "gpus=2", "--scheduler", "greedy",
                     "--config", "families=selftest", "only=selftest/lanes"], project, env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    recs = {p.parent.name: json.loads((p.parent / "record.json").read_text())
            for p in Path(project / "results/selftest/lanes").glob("*/metrics.json")}
    assert set(recs) == {"one-gpu-a", "one-gpu-b", "two-gpu", "host"}
    assert all(r["status"] == "ok" for r in recs.values()), recs
    a, b = recs["one-gpu-a"], recs["one-gpu-b"]
    assert {a["hardware"]["gpu_index"], b["hardware"]["gpu_index"]} == {"0", "1"}
    assert _overlap(_span(a), _span(b)), (a["started_at"], b["started_at"])  # side by side
    assert recs["two-gpu"]["hardware"]["gpu_index"] == "0,1"
    host = recs["host"]
    for name, other in recs.items():
        if name != "host":
            assert not _overlap(_span(host), _span(other)), (name, host["started_at"],
                                                             other["started_at"])
    assert host["isolation"]["isolated"] is True and "all 3" in host["isolation"]["how"]
    assert "isolation" not in a  # not host-bound: nothing to say
