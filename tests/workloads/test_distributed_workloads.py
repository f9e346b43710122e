"""The two distributed workloads on CPU over gloo, 2 processes against 1: the tensor-parallel
decoder gives the 1-process logits; FSDP2 (and FSDP2 with CPU offload) give the 1-process loss,
gradients and updated weights after a step. Plus both experiments at smoke scale through the
local launcher, in the default matrix."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from hopperlab.config.matrix import load_matrix
from tests.infra.mlflow_fixture import free_port
from hopperlab.workloads.finetune.sharded import llama, engine as sharded
from hopperlab.workloads.inference import tensor_parallel as tp
from tests.helpers import REPO, copy_project, hopperlab

TP_SHAPE = tp.Shape(hidden=64, heads=4, kv_heads=2, ffn=96, vocab=128, layers=2)
FT_SHAPE = llama.Shape(hidden=32, heads=4, ffn=64, vocab=64, layers=2)


def _tp_logits(out: Path) -> None:
    torch.manual_seed(0)
    tp._MIN_SLICE_TOKENS = 2  # prefill's all-reduces in slices, overlapped, as at 31k tokens
    model = tp.build(TP_SHAPE, seed=3, dtype=torch.float64, device="cpu", cuda=False)
    prompts = torch.randint(0, TP_SHAPE.vocab, (2, 12), generator=torch.Generator().manual_seed(1))
    cache = model.new_cache(2, 16)
    full = model.prefill(prompts, cache, last_only=False)
    nxt = full[:, -1:].argmax(-1)
    step = model.decode_step(nxt, cache, torch.tensor([12]))  # one step through the KV cache
    rank = dist.get_rank() if dist.is_initialized() else 0
    torch.save({"prefill": full, "decode": step}, out / f"tp-{rank}.pt")


def _ft_step(out: Path, tag: str, world: int) -> None:
    """One step from the model of seed 5: the whole model at world size 1, and at 2 the meta
    build that materialises only this rank's shard (``build_sharded``). ``tag``: the mode,
    with "+ckpt" for activation checkpointing (inside each layer, FSDP2's hooks outside it),
    "+compile" for each layer compiled (AOTAutograd's graphs, the ``aot_eager`` backend)."""
    mode, *flags = tag.split("+")
    ckpt = "ckpt" in flags
    if world > 1:
        # under offload, the shard is made in buffers of its own allocator (pinned on a GPU
        # node; here unregistered, but of the storage memory.pinned makes: NumPy-owned, not
        # resizable): the parameters must live in them, not in copies
        alloc = ((lambda n: torch.from_numpy(np.empty(n, dtype=np.uint8)))
                 if "offload" in mode else None)
        model, bases = sharded.build_sharded(FT_SHAPE, torch.float64, mode, 5, "cpu",
                                             cuda=False, checkpointing=ckpt, host_alloc=alloc)
        if alloc:
            from hopperlab.workloads.finetune.sharded.shard_init import share_in
            # uneven rows (world 3): FSDP2 pads those shards into tensors of its own
            assert share_in(model, bases) == 1.0 or world == 3
    else:
        model = llama.build_model(FT_SHAPE, torch.float64, "cpu", seed=5, checkpointing=ckpt)
    if "compile" in flags:
        llama.compile_layers(model, backend="aot_eager")
    rank = dist.get_rank() if dist.is_initialized() else 0
    full = lambda t: t.full_tensor() if hasattr(t, "full_tensor") else t  # noqa: E731
    local = lambda t: t.to_local() if hasattr(t, "to_local") else t  # noqa: E731
    init = {n: full(p.detach()).clone() for n, p in model.named_parameters()}
    held = sum(local(p).numel() for p in model.parameters())  # what this rank materialised
    micro = 12 // world  # global batch 12
    rows = [sharded.batch(0, i, rank, world, 8, FT_SHAPE.vocab, 5, "cpu") for i in range(micro)]
    loss = sharded.loss_of(model, torch.cat(rows))
    loss.backward()
    grads = {n: full(p.grad).clone() for n, p in model.named_parameters()}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    opt.step()
    if world == 2 and "offload" in mode:  # after FSDP2's lazy init and a step: still there
        from hopperlab.workloads.finetune.sharded.shard_init import share_in
        assert share_in(model, bases) == 1.0
    weights = {n: full(p.detach()).clone() for n, p in model.named_parameters()}
    total = loss.detach().clone()
    if world > 1:
        dist.all_reduce(total)
        total /= world
    if rank == 0:
        torch.save({"loss": total, "grads": grads, "weights": weights, "init": init,
                    "held": held}, out / f"ft-{tag}-{world}.pt")


def _worker(rank: int, world: int, port: int, out: str, job: str, mode: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        if job == "tp":
            _tp_logits(Path(out))
        else:
            _ft_step(Path(out), mode, world)
    finally:
        dist.destroy_process_group()


def _two(job: str, out: Path, mode: str = "", world: int = 2) -> None:
    mp.spawn(_worker, args=(world, free_port(), str(out), job, mode), nprocs=world, join=True)


@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
def test_tensor_parallel_logits_equal_one_process(tmp_path):
    _two("tp", tmp_path)
    one = tmp_path / "one"
    one.mkdir()
    _tp_logits(one)
    ref = torch.load(one / "tp-0.pt")
    for rank in (0, 1):
        got = torch.load(tmp_path / f"tp-{rank}.pt")
        torch.testing.assert_close(got["prefill"], ref["prefill"], rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(got["decode"], ref["decode"], rtol=1e-9, atol=1e-9)


@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
@pytest.mark.parametrize("mode", ["fsdp2", "fsdp2-cpu-offload", "fsdp2-cpu-offload+ckpt",
                                  "fsdp2+ckpt+compile"])
def test_sharded_fine_tune_step_equals_one_process(tmp_path, mode):
    """The meta-device build of 2 ranks holds the same model, bit for bit, as the whole model
    of one process (each rank only its half of it), and its step gives the same step."""
    _two("ft", tmp_path, mode)
    _ft_step(tmp_path, mode, 1)
    ref = torch.load(tmp_path / f"ft-{mode}-1.pt")
    got = torch.load(tmp_path / f"ft-{mode}-2.pt")
    for name in ref["init"]:
        assert torch.equal(got["init"][name], ref["init"][name]), name
    assert got["held"] == ref["held"] // 2  # FT_SHAPE's rows split evenly over 2
    torch.testing.assert_close(got["loss"], ref["loss"], rtol=1e-10, atol=1e-12)
    for name in ref["grads"]:
        torch.testing.assert_close(got["grads"][name], ref["grads"][name], rtol=1e-8, atol=1e-12)
        torch.testing.assert_close(got["weights"][name], ref["weights"][name], rtol=1e-8,
                                   atol=1e-12)


@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
def test_three_ranks_of_uneven_rows_hold_the_same_model(tmp_path):
    """Rows that 3 ranks cannot split evenly (FSDP2 pads them): still the one-process model."""
    mode = "fsdp2-cpu-offload"
    _two("ft", tmp_path, mode, world=3)
    _ft_step(tmp_path, mode, 1)
    ref = torch.load(tmp_path / f"ft-{mode}-1.pt")
    got = torch.load(tmp_path / f"ft-{mode}-3.pt")
    for name in ref["init"]:
        assert torch.equal(got["init"][name], ref["init"][name]), name
    torch.testing.assert_close(got["loss"], ref["loss"], rtol=1e-10, atol=1e-12)
    for name in ref["grads"]:
        torch.testing.assert_close(got["grads"][name], ref["grads"][name], rtol=1e-8,
                                   atol=1e-12)
        torch.testing.assert_close(got["weights"][name], ref["weights"][name], rtol=1e-8,
                                   atol=1e-12)


@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
def test_a_shard_is_drawn_without_the_whole_tensor():
    """A rank's rows of a parameter are the same values as those rows of the whole parameter,
    drawn from the blocks they touch only (block edges inside the shard and across it)."""
    from hopperlab.workloads.finetune.sharded import shard_init

    numel, cols = 3 * shard_init.BLOCK // 2 + 40, 8
    whole = torch.empty(numel)
    shard_init.fill_normal_(whole, 0, numel, seed=7, index=3, device="cpu")
    for start, length in ((0, 16), (shard_init.BLOCK - 8, 24), (numel - 40, 40)):
        part = torch.empty(length)
        shard_init.fill_normal_(part, start, numel, seed=7, index=3, device="cpu")
        assert torch.equal(part, whole[start:start + length])
    assert not torch.equal(whole[:cols], torch.empty(cols).copy_(whole[cols:2 * cols]))
    other = torch.empty(16)
    shard_init.fill_normal_(other, 0, numel, seed=7, index=4, device="cpu")
    assert not torch.equal(other, whole[:16])  # each parameter its own values
    assert abs(float(whole.std()) - shard_init.STD) < 1e-3


SMOKE_RUNS = ("inference/tp-long-context/prompt-31k-c1", "inference/tp-long-context/prompt-3k-c8",
              "finetune/full-llama2-13b-sharded/fsdp2", "finetune/full-llama2-13b-sharded/fsdp2-offload")


def test_both_experiments_in_the_default_matrix_with_two_tasks():
    m = load_matrix(REPO)
    for key in SMOKE_RUNS:
        assert m.get(key).resources.world_size == 2 and m.get(key).resources.gpus == 0


@pytest.mark.integration
@pytest.mark.parametrize("key", [SMOKE_RUNS[0], SMOKE_RUNS[3]])
def test_smoke_runs_through_the_local_launcher(tmp_path, key):
    project = copy_project(tmp_path / "project")
    out = hopperlab(["submit", key, "--no-upload", "--config", f"results_dir={tmp_path}/r"],
                    project, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    rec = json.loads((tmp_path / "r" / key / "metrics.json").read_text())
    assert rec["status"] == "ok" and rec["world_size"] == 2
    headline = "decode_tokens_per_s" if key.startswith("inference") else "tokens_per_s"
    assert rec["metrics"][headline] > 0 and rec["metrics"]["slowest_rank_step_s"] > 0
    ranks = [json.loads((tmp_path / "r" / key / "ranks" / str(r) / "metrics.json").read_text())
             for r in (0, 1)]  # the run is set up when its last rank is
    assert rec["metrics"]["setup_s"] == max(r["metrics"]["setup_s"] for r in ranks) > 0


def test_the_compute_probe_leaves_the_model_as_it_was():
    """The floor's compute part is measured on the model the run then trains: the probe must
    not move a weight nor leave a gradient behind."""
    model = llama.build_model(FT_SHAPE, torch.float32, "cpu", seed=3)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    plan = sharded.Plan(mode="fsdp2-cpu-offload", shape=FT_SHAPE, seq_len=8, micro_batch=2,
                        global_batch=4, steps=2, warmup=0, dtype=torch.float32, lr=1e-3,
                        weight_decay=0.0, seed=3, checkpointing=False)
    assert sharded.measure_compute(model, plan, torch.device("cpu"), accum=2) > 0
    assert all(p.grad is None for p in model.parameters())
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k


@pytest.mark.integration
def test_one_process_offload_run_reports_its_compute_and_optimizer_parts(tmp_path):
    key = "finetune/full-llama2-13b-sharded/fsdp2-offload-1gpu"
    project = copy_project(tmp_path / "project")
    out = hopperlab(["submit", key, "--no-upload", "--config", f"results_dir={tmp_path}/r"],
                    project, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    rec = json.loads((tmp_path / "r" / key / "metrics.json").read_text())
    assert rec["status"] == "ok"
    m = rec["metrics"]
    assert m["compute_measured_s"] > 0 and m["optimizer_step_s"] > 0  # diagnostics
    # no GPU: no link in the floor; compute = FLOPs at the CPU's measured matmul rate, plus the
    # AdamW bytes at the host triad (after backward: accumulation of 2), never the run's parts
    assert m["floor_compute_s"] == pytest.approx(m["step_tflop"] / m["matmul_tflops"])
    assert m["floor_optimizer_s"] == pytest.approx(
        m["optimizer_host_gb_per_step"] / m["host_triad_gbps"])
    assert m["floor_overlapped"] == 0 and m["optimizer_overlapped"] == 0
    assert m["step_floor_s"] == pytest.approx(m["floor_compute_s"] + m["floor_optimizer_s"])
    assert m["step_over_floor"] == pytest.approx(m["s_per_iter"] / m["step_floor_s"])
    assert 0 < m["build_s"] < m["setup_s"] < rec["duration_s"] + 60


def test_the_probe_of_a_deep_model_holds_four_layers_at_most(monkeypatch):
    """A model of more than 4 layers is probed with 2 and 4 and extrapolated: the probe never
    needs the whole model beside the run."""
    built = []
    real = llama.build_model
    monkeypatch.setattr(sharded, "build_model",
                        lambda shape, *a, **k: built.append(shape.layers) or real(shape, *a, **k))
    deep = llama.Shape(hidden=32, heads=4, ffn=64, vocab=64, layers=40)
    plan = sharded.Plan(mode="fsdp2-cpu-offload", shape=deep, seq_len=8, micro_batch=2,
                        global_batch=4, steps=1, warmup=0, dtype=torch.float32, lr=1e-3,
                        weight_decay=0.0, seed=3, checkpointing=False)
    assert sharded.probe_compute(plan, torch.device("cpu"), accum=2, saved=0) > 0
    assert built == [2, 4]
