"""The next layer's offloaded shards staged ahead of FSDP2 at world size 1 (issue 35): FSDP2
reads every staged copy, the training is the same as without it, and the run's record says
what happened. On a CPU the copy is a plain one (no stream): what is tested is that FSDP2's
own path reads the staged tensor, and that nothing changes in the maths."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed import HashStore

from hopperlab.memory import h2d_prefetch
from hopperlab.workloads.finetune.sharded import llama, engine as sharded

SHAPE = llama.Shape(hidden=32, heads=4, ffn=64, vocab=64, layers=3)


@pytest.fixture
def one_rank():
    dist.init_process_group("gloo", store=HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _plan(**kw) -> sharded.Plan:
    base = dict(mode="fsdp2-cpu-offload", shape=SHAPE, seq_len=8, micro_batch=2, global_batch=2,
                steps=2, warmup=1, dtype=torch.float64, lr=1e-2, weight_decay=0.0, seed=5,
                checkpointing=True)
    return sharded.Plan(**{**base, **kw})


def _train(plan: sharded.Plan, steps: int = 3):
    """Losses of ``steps`` steps of ``plan``'s model at world size 1, the prefetcher where
    ``prefetch_h2d`` installs one, and the weights after."""
    model, _ = sharded.build_sharded(plan.shape, plan.dtype, plan.mode, plan.seed, "cpu",
                                     cuda=False, checkpointing=plan.checkpointing,
                                     reshard_after_forward=plan.reshard_after_forward)
    prefetch, why = sharded.prefetch_h2d(model, plan, 1, torch.device("cpu"))
    opt = sharded.make_optimizer(model, plan.mode, plan.lr, plan.weight_decay)
    losses = [sharded.train_step(model, opt, s, 1, 0, 1, plan.seq_len, plan.micro_batch,
                                 plan.shape.vocab, plan.seed, "cpu")[0] for s in range(steps)]
    weights = [p.detach().to_local().clone() if hasattr(p, "to_local") else p.detach().clone()
               for p in model.parameters()]
    return losses, weights, prefetch, why


def test_fsdp2_reads_every_staged_copy_and_trains_the_same(one_rank):
    """Each forward stages layers 0..L-1 (layer 0 during the root's pre-forward) and, the
    layers resharding after forward (the default), each backward stages them again (the last
    right after its forward, layer i-1 as layer i's backward begins); FSDP2's world-size-1
    path reads every parameter's staged copy, none is dropped, and losses and weights equal a
    run without the prefetcher exactly (the same float64 values copied)."""
    plain_losses, plain_weights, none, why_off = _train(_plan(h2d_prefetch=False))
    assert none is None and why_off.startswith("off")
    losses, weights, prefetch, _ = _train(_plan())
    assert prefetch is not None
    per_forward = 6 * SHAPE.layers  # each layer's two norms, qkv, o, gate_up and down
    assert prefetch.counts.staged == 3 * 2 * per_forward  # 3 steps, forward and backward
    assert prefetch.counts.backward and "in backward" in prefetch.counts.describe()
    assert prefetch.counts.read == prefetch.counts.staged and prefetch.counts.dropped == 0
    assert losses == plain_losses
    assert all(torch.equal(a, b) for a, b in zip(weights, plain_weights))


def test_layers_kept_gathered_from_forward_to_backward_train_the_same(one_rank):
    """``reshard_after_forward: false`` changes when FSDP2 frees the gathered weights, not the
    maths: the same losses and weights as the default, with the prefetcher on."""
    base_losses, base_weights, _, _ = _train(_plan(h2d_prefetch=False))
    losses, weights, prefetch, _ = _train(_plan(reshard_after_forward=False))
    assert losses == base_losses
    assert all(torch.equal(a, b) for a, b in zip(weights, base_weights))
    assert prefetch.counts.read == prefetch.counts.staged > 0
    # kept gathered, nothing is copied again in backward: the forward's staging only
    assert prefetch.counts.staged == 3 * 6 * SHAPE.layers and not prefetch.counts.backward


def test_a_copy_fsdp2_did_not_read_is_dropped_and_counted(one_rank):
    """A second stage of the same layer before FSDP2 read the first drops the first and says
    so: a torch whose path bypasses the property shows as read 0, never as a silent win."""
    model, _ = sharded.build_sharded(SHAPE, torch.float64, "fsdp2-cpu-offload", 5, "cpu",
                                     cuda=False)
    sharded.loss_of(model, sharded.batch(0, 0, 0, 1, 8, SHAPE.vocab, 5, "cpu"))  # lazy init
    prefetch = h2d_prefetch.NextLayerPrefetch(model, list(model.layers), "cpu")
    prefetch.stage(model.layers[1])
    prefetch.stage(model.layers[1])
    assert prefetch.counts.staged == 12 and prefetch.counts.dropped == 6
    assert prefetch.counts.read == 0
    # FSDP2's class gains one subclass, once, however often a parameter is staged
    (kind,) = {type(fp) for fp in h2d_prefetch._fsdp_params(model.layers[1])}
    assert [c.__name__ for c in kind.__mro__[:2]] == ["StagedFSDPParam", "FSDPParam"]
    assert "0 of 12 staged copies read" in prefetch.counts.describe()


@pytest.mark.parametrize("mode, world, why", [
    ("fsdp2", 1, "keeps no parameters in host memory"),
    ("torchao-cpu-offload", 1, "keeps no parameters in host memory"),
    ("fsdp2-cpu-offload", 2, "all-gather streams carry"),
])
def test_the_prefetcher_is_used_only_where_fsdp2_copies_on_the_compute_stream(mode, world, why):
    prefetch, reason = sharded.prefetch_h2d(None, _plan(mode=mode), world, "cpu")
    assert prefetch is None and why in reason


def test_reshard_after_forward_is_fsdp2s_option_only():
    from dataclasses import fields

    from hopperlab.workloads.finetune import FinetuneParams, ShardedParams

    with pytest.raises(ValueError, match="reshard_after_forward"):
        ShardedParams(sharding="torchao-cpu-offload", reshard_after_forward=False)
    assert "reshard_after_forward" not in {f.name for f in fields(FinetuneParams)}
    assert not ShardedParams(sharding="fsdp2-cpu-offload",
                             reshard_after_forward=False).reshard_after_forward
