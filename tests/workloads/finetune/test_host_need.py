"""The host memory an offloading sharded run needs, per tensor as PyTorch's pinned allocator
rounds it: the 13B's figures, and the node that cannot hold them skips with them."""

from __future__ import annotations

import torch

from hopperlab.workloads.finetune.sharded import host_need as hn
from hopperlab.workloads.finetune.sharded import llama, engine as sharded

LLAMA_13B = llama.Shape(5120, 40, 13824, 32000, 40)


def _local(world: int) -> list[int]:
    model = llama.Llama(LLAMA_13B, torch.bfloat16, "meta")
    return [-(-p.shape[0] // world) * (p.numel() // p.shape[0]) * 2 for p in model.parameters()]


def test_pinned_blocks_round_to_powers_of_two():
    assert [hn.pow2(n) for n in (0, 1, 4096, 4097, 157_286_400)] == [0, 1, 4096, 8192, 1 << 28]


def test_forty_layers_of_13b_on_one_gpu():
    sizes = _local(1)
    params = sum(sizes)
    assert 26.0e9 < params < 26.1e9  # 13.0 B bf16 parameters
    exact = hn.host_bytes("fsdp2-cpu-offload", sizes, exact_params=True)
    rounded = hn.host_bytes("fsdp2-cpu-offload", sizes, exact_params=False)
    # exact-size parameter shards save what the rounding costs them (qkv 157 MB -> 268 MB ...)
    assert rounded - exact == sum(hn.pow2(n) for n in sizes) - params > 14e9
    assert 125e9 < exact < 135e9  # too much for a 128 GiB node's free memory, fine on 256 GiB
    torchao = hn.host_bytes("torchao-cpu-offload", sizes, exact_params=True)
    assert torchao > exact  # torchao pins a rounded copy of every parameter too


def test_two_ranks_each_hold_half():
    one, two = hn.host_bytes("fsdp2-cpu-offload", _local(1), True), \
        hn.host_bytes("fsdp2-cpu-offload", _local(2), True)
    assert abs((two - hn.PROCESS_BYTES) * 2 - (one - hn.PROCESS_BYTES)) < 0.02 * one
    assert hn.host_bytes("fsdp2", _local(2), True) == hn.PROCESS_BYTES


def test_available_memory_from_meminfo():
    text = "MemTotal:       131072000 kB\nMemFree: 1 kB\nMemAvailable:   125000000 kB\n"
    assert hn.available_bytes(text) == 125_000_000 * 1024
    assert hn.available_bytes("MemTotal: 1 kB\n") is None


def test_a_node_without_the_memory_skips_with_the_figures(tmp_path):
    import pytest

    from hopperlab.core.rundir import Recorder, SkipRun

    plan = sharded.Plan(mode="fsdp2-cpu-offload", shape=LLAMA_13B, seq_len=512, micro_batch=128,
                        global_batch=128, steps=1, warmup=0, dtype=torch.bfloat16, lr=1e-4,
                        weight_decay=0.0, seed=0, checkpointing=True)
    rec = Recorder(tmp_path / "run")
    node_128gib = "MemTotal: 131000000 kB\nMemAvailable:   125000000 kB\n"
    with pytest.raises(SkipRun, match=r"needs about 131 GB .* 128 GB available"):
        sharded.check_host_memory(plan, 1, rec, "cpu", node_128gib)
    assert 130 < rec.metrics["host_need_gb"] < 132
    node_256gib = "MemAvailable:   250000000 kB\n"
    sharded.check_host_memory(plan, 1, rec, "cpu", node_256gib)  # fits: no skip


def test_the_delayed_update_holds_a_second_set_of_pinned_gradients():
    sizes = _local(1)
    plain = hn.host_bytes("fsdp2-cpu-offload", sizes, exact_params=True)
    delayed = hn.host_bytes("fsdp2-cpu-offload", sizes, exact_params=True, delayed=True)
    assert delayed - plain == sum(hn.pow2(n) for n in sizes)  # 47 GB more at 13B on one GPU
