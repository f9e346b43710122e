"""The GPU-GPU link measurement on CPU over gloo (2 real processes): nccl-tests' bandwidth
definitions on numbers, and ``collective_latency`` / ``time_collective`` giving every rank the
same positive figure for the message it was asked about."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from hopperlab.cuda import collectives
from tests.infra.mlflow_fixture import free_port


def test_bus_factors_are_nccl_tests():
    assert collectives.bus_factor("all_reduce", 4) == 1.5  # 2(n-1)/n
    assert collectives.bus_factor("all_gather", 4) == 0.75  # (n-1)/n
    assert collectives.bus_factor("all_reduce", 1) == 0.0
    alg, bus = collectives.bandwidths("all_reduce", 2 * 10**9, 0.01, 2)
    assert (alg, bus) == (200.0, 200.0)
    alg, bus = collectives.bandwidths("all_gather", 10**9, 0.01, 8)
    assert alg == 100.0 and bus == pytest.approx(87.5)
    with pytest.raises(ValueError, match="op"):
        collectives.bus_factor("broadcast", 2)


def _worker(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        lat = collectives.collective_latency(8192 * 2 * 4, 5)
        ag = collectives.time_collective("all_gather", 1000, 3, warmup=1)
        Path(out, f"{rank}.json").write_text(json.dumps(
            {"lat": lat, "ag_bytes": ag.nbytes, "ag_s": ag.seconds, "backend": ag.backend,
             "ag_bus": ag.busbw_gbps, "ag_alg": ag.algbw_gbps}))
    finally:
        dist.destroy_process_group()


@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
def test_latency_over_two_gloo_processes_is_the_same_on_every_rank(tmp_path):
    mp.spawn(_worker, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    got = [json.loads((tmp_path / f"{r}.json").read_text()) for r in (0, 1)]
    assert got[0] == got[1]  # the slowest rank's figure, everywhere
    g = got[0]
    assert g["backend"] == "gloo" and g["lat"] > 0 and g["ag_s"] > 0
    assert g["ag_bytes"] == 2 * 125 * 4  # 1000 B over 2 ranks: 125 float32 each, whole output
    assert g["ag_bus"] == pytest.approx(g["ag_alg"] / 2)


def test_without_a_process_group_it_says_so():
    with pytest.raises(RuntimeError, match="torch.distributed"):
        collectives.collective_latency(1024, 2)


# --------------------------------------------------------------------------- the experiment
def test_collective_params_sizes_and_the_decode_message():
    from hopperlab.workloads.membench import COLLECTIVE_HEADLINES, MembenchParams, headline_metrics
    from hopperlab.workloads.membench import collective as coll

    p = MembenchParams(test="collective", min_bytes=8, max_bytes=2048, factor=4)
    assert coll.sizes(p) == [8, 32, 128, 512, 2048]
    assert coll.sizes(MembenchParams(test="collective", max_bytes=1 << 30))[-1] == 1 << 30
    assert coll.decode_message_bytes(8192, 8) == 131072  # 70B hidden, bf16, batch 8
    assert headline_metrics("collective") == COLLECTIVE_HEADLINES
    for bad in ({"op": "broadcast"}, {"factor": 1}, {"min_bytes": 0},
                {"min_bytes": 64, "max_bytes": 8}, {"decode_batches": (0,)}):
        with pytest.raises(ValueError):
            MembenchParams(test="collective", **bad)


def test_collective_without_a_process_group_is_skipped_with_the_reason():
    from hopperlab.core.rundir import SkipRun
    from hopperlab.workloads.membench import MembenchParams
    from hopperlab.workloads.membench import collective as coll

    with pytest.raises(SkipRun, match="several tasks"):
        coll.check(MembenchParams(test="collective"))


def test_collective_chart_draws_the_sweep_of_each_variant():
    from types import SimpleNamespace

    from hopperlab.workloads.membench.charts import charts, curve

    m = {"busbw_gbps_8b": 0.01, "busbw_gbps_1024b": 1.5, "time_us_8b": 9.0,
         "time_us_1024b": 12.0, "busbw_gbps_peak": 1.5}
    assert curve(m, "busbw_gbps") == [(8, 0.01), (1024, 1.5)]
    runs = [SimpleNamespace(variant="all-reduce", metrics=m),
            SimpleNamespace(variant="all-gather", metrics=m),
            SimpleNamespace(variant="h2d-pinned", metrics={"gbps_peak": 50.0})]
    drawn = charts(runs)
    assert [c.title for c in drawn] == ["collectives over message size"]
    assert len(drawn[0].figure.axes[0].lines) == 2
    assert charts(runs[2:]) == []


@pytest.mark.integration
def test_collective_smoke_run_through_the_local_launcher(tmp_path):
    from tests.helpers import copy_project, hopperlab

    project = copy_project(tmp_path / "project")
    key = "membench/collective/all-reduce"
    out = hopperlab(["submit", key, "--no-upload", "--config", f"results_dir={tmp_path}/r"],
                    project, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    run_dir = tmp_path / "r" / key
    rec = json.loads((run_dir / "metrics.json").read_text())
    assert rec["status"] == "ok" and rec["world_size"] == 2, rec.get("reason")
    m = rec["metrics"]
    assert m["correct"] == 1.0
    for name in ("busbw_gbps_peak", "latency_us_small", "latency_us_decode_b1",
                 "latency_us_decode_b8", "time_us_8b", "busbw_gbps_524288b"):
        assert m[name] > 0, name
    assert rec["tags"]["membench.backend"] == "gloo" and rec["tags"]["membench.op"] == "all_reduce"
    sweep = (run_dir / "ranks/0/artifacts/sweep.csv").read_text().splitlines()
    assert sweep[0] == "size_bytes,time_us,algbw_gbps,busbw_gbps" and len(sweep) == 1 + 9
