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
from hopperlab.run.distributed import free_port


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
