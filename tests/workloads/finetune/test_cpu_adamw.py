"""Issue 35 on CPU: the offloaded AdamW stepped per FSDP unit during backward gives torch's
reference AdamW update; the host triad runs on the threads the job was given and, across the
ranks of a node, with every rank streaming at once."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from hopperlab.node.host_bandwidth import triad_gbps
from hopperlab.memory import cpu_adamw
from hopperlab.workloads.finetune.sharded import llama, rates, engine as sharded
from tests.helpers import copy_project, edit_yaml, hopperlab
from tests.infra.mlflow_fixture import free_port

SHAPE = llama.Shape(hidden=32, heads=4, ffn=64, vocab=64, layers=3)
LR, WD, SEQ, GLOBAL, STEPS = 1e-2, 0.1, 8, 4, 3


def _sharded_steps(out: Path, overlap: bool, delayed: bool = False) -> None:
    """FSDP2 + CPU offload on this rank, ``STEPS`` steps of the run's own train_step."""
    rank, world = dist.get_rank(), dist.get_world_size()
    model, _ = sharded.build_sharded(SHAPE, torch.float64, "fsdp2-cpu-offload", 5, "cpu",
                                     cuda=False)
    opt = sharded.make_optimizer(model, "fsdp2-cpu-offload", LR, WD, "cpu", delayed=delayed)
    assert isinstance(opt, cpu_adamw.LayerwiseAdamW)
    exposed = []
    for step in range(STEPS):
        _, busy, waited = sharded.train_step(model, opt, step, 1, rank, world, SEQ,
                                             GLOBAL // world, SHAPE.vocab, 5, "cpu", overlap)
        assert busy > 0 and waited >= 0
        exposed.append(waited)
    weights = {n: p.detach().full_tensor().clone() for n, p in model.named_parameters()}
    if rank == 0:
        torch.save(weights, out / f"weights-{overlap}-{delayed}.pt")


def _reference_steps(delayed: bool = False) -> dict[str, torch.Tensor]:
    """The whole model in one process, torch's reference (single-tensor, unfused) AdamW;
    ``delayed``: ZeRO-Offload's delayed update, by hand: each step's gradients, taken at the
    weights of the step, update them at the next step (the first step updates nothing)."""
    model = llama.build_model(SHAPE, torch.float64, "cpu", seed=5)
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=LR, weight_decay=WD, foreach=False, fused=False)
    held = None
    for step in range(STEPS):
        sharded.accumulate(model, step, 1, 0, 1, SEQ, GLOBAL, SHAPE.vocab, 5, "cpu")
        if delayed:
            fresh = [p.grad.clone() for p in params]
            if held is not None:
                for p, grad in zip(params, held):
                    p.grad = grad
                opt.step()
            held = fresh
        else:
            opt.step()
        opt.zero_grad(set_to_none=True)
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _triad(out: Path) -> None:
    rank = dist.get_rank()
    got = rates.node_triad(share_bytes=256 * 2**20, threads=1, ranks_on_host=2)  # 64 MiB arrays
    (out / f"triad-{rank}.json").write_text(json.dumps({
        "node": got.node_gbps, "rank": got.rank_gbps, "threads": got.threads,
        "windows": got.windows}))


def _worker(rank: int, world: int, port: int, out: str, job: str, overlap: bool,
            delayed: bool) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        if job == "steps":
            _sharded_steps(Path(out), overlap, delayed)
        else:
            _triad(Path(out))
    finally:
        dist.destroy_process_group()


def _two(job: str, out: Path, overlap: bool = False, delayed: bool = False) -> None:
    mp.spawn(_worker, args=(2, free_port(), str(out), job, overlap, delayed), nprocs=2,
             join=True)


@pytest.mark.integration  # two gloo processes of FSDP2, 4-5 s each
@pytest.mark.parametrize(("overlap", "delayed"), [(True, False), (False, False), (True, True)],
                         ids=["during-backward", "after-backward", "delayed-during-backward"])
def test_the_offloaded_adamw_gives_torchs_reference_update(tmp_path, overlap, delayed):
    """Two ranks of FSDP2 + CPU offload, each unit's fused AdamW stepped during backward (or
    after it): after 3 steps, the same weights as torch's reference AdamW on the whole model
    in one process (delayed: the reference delays each update by one step too). float64: the
    two ranks' gradients differ from one process's in their last bits (summation order), which
    AdamW's normalisation blows up where a gradient is near 0; the float32 check of the update
    itself is the fixed-sample tests."""
    _two("steps", tmp_path, overlap, delayed)
    got = torch.load(tmp_path / f"weights-{overlap}-{delayed}.pt")
    ref = _reference_steps(delayed)
    other = _reference_steps(not delayed)
    start = llama.build_model(SHAPE, torch.float64, "cpu", seed=5)
    for name, value in ref.items():
        torch.testing.assert_close(got[name], value, rtol=1e-9, atol=1e-11)
        assert not torch.equal(value, dict(start.named_parameters())[name].detach()), name
    assert any(not torch.allclose(got[n], other[n], rtol=1e-6, atol=1e-8) for n in ref)


def _fixed_sample(seed: int, steps: int, delayed: bool = False) -> tuple:
    """Fixed float32 parameters, a set of gradients for each of ``steps`` steps (spanning 4
    orders of magnitude), torch's reference AdamW on one copy and ours (2 units) on another."""
    g = torch.Generator().manual_seed(seed)
    shapes = [(64, 32), (32,), (128, 16), (7,)]
    start = [torch.randn(s, generator=g) for s in shapes]
    grads = [[torch.randn(s, generator=g) * 10.0 ** -k for k, s in enumerate(shapes)]
             for _ in range(steps)]
    ref = [torch.nn.Parameter(t.clone()) for t in start]
    ours = [torch.nn.Parameter(t.clone()) for t in start]
    ref_opt = torch.optim.AdamW(ref, lr=LR, weight_decay=WD, foreach=False, fused=False)
    opt = cpu_adamw.LayerwiseAdamW([ours[:2], ours[2:]], LR, WD, "cpu", threads=2,
                                   delayed=delayed)
    return start, grads, ref, ours, ref_opt, opt


def _give(params: list, grads: list) -> None:
    for p, grad in zip(params, grads):
        p.grad = grad.clone()


def _same(ours: list, ref: list) -> None:
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=1.3e-6, atol=1e-7)


def test_a_fixed_sample_gets_the_reference_update_in_float32_with_units_landing_late():
    """Fixed float32 parameters and gradients: the units stepped by the worker as their
    gradients arrive (after it started waiting) give torch's reference AdamW update."""
    _, (grads,), ref, ours, ref_opt, opt = _fixed_sample(7, 1)
    for _ in range(STEPS):
        _give(ref, grads)
        ref_opt.step()
        opt.begin()
        _give(ours, grads)  # the gradients land while the worker waits
        opt.finish()
        ref_opt.zero_grad()
        opt.zero_grad()
    _same(ours, ref)


@pytest.mark.parametrize("during_backward", [True, False], ids=["worker", "after-backward"])
def test_the_delayed_update_applies_each_steps_gradients_one_step_later(during_backward):
    """ZeRO-Offload's delayed update on fixed float32 parameters and a new gradient every
    step: step 0 changes nothing, step t applies torch's reference AdamW update of step
    t-1's gradients (a reference that delays by hand, to float32 tolerance), and the
    gradients the step got stay in ``.grad`` until zero_grad."""
    start, grads, ref, ours, ref_opt, opt = _fixed_sample(11, STEPS + 1, delayed=True)
    for step in range(STEPS + 1):
        if during_backward:
            opt.begin()
        _give(ours, grads[step])
        opt.finish() if during_backward else opt.step()
        assert all(torch.equal(p.grad, grad) for p, grad in zip(ours, grads[step]))
        if step == 0:
            assert all(torch.equal(p.detach(), t) for p, t in zip(ours, start))
        else:
            _give(ref, grads[step - 1])
            ref_opt.step()
            ref_opt.zero_grad()
        opt.zero_grad()
        _same(ours, ref)
    assert ref_opt.state[ref[0]]["step"] == STEPS  # STEPS updates in STEPS + 1 steps


def test_the_delayed_update_is_fsdp2_offloads_only():
    from hopperlab.workloads.finetune import ShardedParams

    with pytest.raises(ValueError, match="delayed_update: only with sharding fsdp2-cpu-offload"):
        ShardedParams(sharding="torchao-cpu-offload", delayed_update=True)
    model = llama.build_model(SHAPE, torch.float32, "cpu", seed=5)
    with pytest.raises(ValueError, match="delayed update is FSDP2 offload's"):
        sharded.make_optimizer(model, "fsdp2", LR, WD, delayed=True)


def test_a_unit_steps_only_once_its_gradients_are_there():
    """The worker waits for a unit's gradients; finish re-raises what the worker raised."""
    w = torch.nn.Parameter(torch.ones(4))
    opt = cpu_adamw.LayerwiseAdamW([[w]], lr=0.1, weight_decay=0.0, device="cpu")
    opt.begin()
    assert torch.equal(w.detach(), torch.ones(4))  # no gradient yet: not stepped
    (w * 2).sum().backward()
    opt.finish()
    assert (w.detach() < 1).all() and opt.busy_s > 0
    opt.zero_grad()

    def broken() -> None:
        raise ValueError("a step that fails")

    opt.optimizers[0].step = broken
    (w * 2).sum().backward()
    opt.begin()
    with pytest.raises(ValueError, match="a step that fails"):
        opt.finish()


def test_the_triad_runs_on_the_threads_it_is_given_and_puts_the_pool_back():
    before = torch.get_num_threads()
    seen: list[int] = []
    rate = triad_gbps(mib_per_array=4, repeats=2, threads=2,
                      start=lambda: seen.append(torch.get_num_threads()))
    assert rate > 0 and seen == [2, 2] and torch.get_num_threads() == before
    with pytest.raises(ValueError, match="thread count"):
        triad_gbps(mib_per_array=4, threads=0)


@pytest.mark.integration  # two processes streaming, 4 s
def test_two_ranks_stream_at_once_and_the_node_rate_is_their_sum(tmp_path):
    _two("triad", tmp_path)
    a, b = (json.loads((tmp_path / f"triad-{r}.json").read_text()) for r in (0, 1))
    assert len(a["windows"]) == len(b["windows"]) == 5
    for (s0, e0), (s1, e1) in zip(a["windows"], b["windows"]):
        assert max(s0, s1) < min(e0, e1)  # each timed pass: both ranks streaming
    assert a["rank"] == b["rank"]  # both counted at the slowest rank's time
    assert a["node"] == pytest.approx(2 * a["rank"]) and a["threads"] == 1


@pytest.mark.integration
def test_a_job_given_two_cpus_measures_on_two_threads_whatever_its_launcher_said(tmp_path):
    """Snakemake's shell: exports OMP_NUM_THREADS=1 to every job: the 13B runs' triad and CPU
    AdamW ran on one thread while the record said 16. A job given 2 CPUs measures on 2."""
    project = copy_project(tmp_path / "project")
    key = "finetune/full-llama2-13b-sharded/fsdp2-offload-1gpu"
    edit_yaml(project / "experiments/finetune.yaml", lambda d: d["experiments"][
        "full-llama2-13b-sharded"]["scales"]["smoke"]["resources"].update(cpus=2))
    out = hopperlab(["run", key, "--no-upload", "--config", "families=finetune"], project,
                    env={"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    rec = json.loads((project / "results" / key / "metrics.json").read_text())
    m = rec["metrics"]
    assert m["host_triad_threads"] == 2 and m["torch_threads"] == 2, m
    assert rec["hardware"]["threads"]["inherited_dropped"]["OMP_NUM_THREADS"] == "1"
    assert m["optimizer_floor_s"] == pytest.approx(
        m["optimizer_host_gb_per_step"] * m["host_triad_ranks"] / m["host_triad_gbps"])


@pytest.mark.integration
def test_a_run_with_the_delayed_update_names_it_in_its_record(tmp_path):
    project = copy_project(tmp_path / "project")
    key = "finetune/full-llama2-13b-sharded/fsdp2-offload-1gpu"
    edit_yaml(project / "experiments/finetune.yaml", lambda d: d["experiments"][
        "full-llama2-13b-sharded"]["variants"]["fsdp2-offload-1gpu"]["params"].update(
            delayed_update=True))
    out = hopperlab(["run", key, "--no-upload", "--config", "families=finetune"], project)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    rec = json.loads((project / "results" / key / "metrics.json").read_text())
    assert rec["metrics"]["optimizer_delayed"] == 1.0
    assert "delayed by one step" in rec["tags"]["finetune.cpu_optimizer"]


def test_pinning_says_what_it_got_when_the_allocator_refuses(monkeypatch):
    """The pinned allocator's settings are a speed-up, never a failure: a torch without them
    leaves cudaHostAlloc, and the record says so."""
    def refuse(_settings: str) -> None:
        raise RuntimeError("Unrecognized key")

    monkeypatch.setattr(torch.cuda.memory, "_set_allocator_settings", refuse)
    assert sharded.fast_pinning().startswith("cudaHostAlloc (the settings were refused")
    seen = []
    monkeypatch.setattr(torch.cuda.memory, "_set_allocator_settings", seen.append)
    assert "cudaHostRegister" in sharded.fast_pinning()
    assert seen == [sharded.PINNED_ALLOC_SETTINGS]


def test_beside_backward_the_optimizer_leaves_cpus_of_the_rank_to_the_training_thread():
    """Stepping during backward, the AdamW takes the rank's CPUs minus what the training
    thread (kernel launches) and the driver's helpers need, whatever else the host has; after
    backward it takes them all."""
    assert cpu_adamw.optimizer_threads(16, True) == 16 - cpu_adamw.RESERVED_CPUS
    assert cpu_adamw.optimizer_threads(16, False) == 16  # after backward: nothing else runs
    assert cpu_adamw.optimizer_threads(3, True) == 3  # too few to give any away


def test_the_worker_waits_on_the_units_own_gradient_copies(monkeypatch):
    """FSDP2 records an event after each gradient's device-to-host copy: the wait of a unit
    synchronises its own parameters' events (none of another unit's), and skips those FSDP2
    already waited for (None). A model without FSDP2 has none: None (device synchronize)."""
    from torch.distributed import HashStore

    dist.init_process_group("gloo", store=HashStore(), rank=0, world_size=1)
    try:
        model, _ = sharded.build_sharded(SHAPE, torch.float32, "fsdp2-cpu-offload", 5, "cpu",
                                         cuda=False)
        units = cpu_adamw.fsdp_units(model)
        waits = cpu_adamw.copy_waits(model, units)
        assert waits is not None and len(waits) == len(units) == SHAPE.layers + 1
        seen: list[str] = []

        class Event:
            def __init__(self, name: str) -> None:
                self.name = name

            def synchronize(self) -> None:
                seen.append(self.name)

        by_id = {}
        for module in model.modules():
            if hasattr(module, "_get_fsdp_state"):
                group = module._get_fsdp_state()._fsdp_param_group
                for fp in group.fsdp_params:
                    by_id[id(fp.sharded_param)] = fp
        for i, unit in enumerate(units):
            for j, p in enumerate(unit):
                by_id[id(p)].grad_offload_event = Event(f"{i}.{j}") if j else None
        waits[1]()
        assert seen == [f"1.{j}" for j in range(1, len(units[1]))]
    finally:
        dist.destroy_process_group()
    plain = llama.build_model(SHAPE, torch.float32, "cpu", seed=5)
    assert cpu_adamw.copy_waits(plain, cpu_adamw.fsdp_units(plain)) is None
