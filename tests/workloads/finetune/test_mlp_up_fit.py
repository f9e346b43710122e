"""How many layers keep their MLP's up-projection on a GPU (memory/mlp_up_fit.py, applied to the
sharded engine's Llama by sharded/memory_fit.py): the room above a
sizing step's peak, applied to the last layers, recorded; a compiled layer follows the new flag
at its next call (one more graph) and trains the same."""

from __future__ import annotations

import pytest

from hopperlab.memory import mlp_up_fit
from hopperlab.workloads.finetune.sharded import llama, memory_fit, engine as sharded

GIB = 2**30
SHAPE = llama.Shape(hidden=32, heads=4, ffn=64, vocab=64, layers=3)


def test_a_13b_layer_keeps_its_up_projection_and_its_input():
    shape = llama.Shape(hidden=5120, heads=40, ffn=13824, vocab=32000, layers=40)
    # 65,536 bf16 tokens: gate and up (27,648 wide) and the norm they came from (5,120)
    assert mlp_up_fit.layer_bytes(shape, 65536, 2) == 65536 * (27648 + 5120) * 2
    assert mlp_up_fit.layer_bytes(shape, 65536, 2) / GIB == pytest.approx(4.0)


@pytest.mark.parametrize("peak,most,want", [
    (60 * GIB, 40, 17),  # (139.8 - 11.2 - 60) / 4 = 17.2
    (60 * GIB, 10, 10),  # at most what was asked
    (129 * GIB, 40, 0),  # no room above the peak
    (139 * GIB, 40, 0),  # the peak inside the margin
])
def test_the_layers_that_fit_are_the_room_above_the_peak_less_the_margin(peak, most, want):
    capacity = int(139.8 * GIB)
    margin = mlp_up_fit.margin_for(capacity)
    assert margin == int(0.08 * capacity)
    assert mlp_up_fit.layers_that_fit(peak, capacity, 4 * GIB, most, margin) == want


def test_a_small_gpu_still_keeps_the_least_margin():
    assert mlp_up_fit.margin_for(16 * GIB) == mlp_up_fit.MARGIN_MIN_BYTES


def test_fitting_keeps_the_last_layers_and_says_why():
    import torch

    model = llama.build_model(SHAPE, torch.float32, "cpu", seed=5, checkpointing=True)
    per_layer = mlp_up_fit.layer_bytes(SHAPE, 18, 4)
    capacity = 100 * GIB
    peak = capacity - mlp_up_fit.margin_for(capacity) - 2 * per_layer + 1  # room for 1 layer
    fit = mlp_up_fit.fit(lambda n: llama.keep_mlp_up(model, n), 3, SHAPE, 3, 18, 4, peak,
                         capacity)
    assert fit.kept == 1 and fit.most == 3 and fit.layers == 3
    assert [layer.save_mlp_up for layer in model.layers] == [False, False, True]
    assert fit.describe().startswith("fitted after a sizing step: the last 1 of 3 decoder layers")
    assert memory_fit.model_shape(model) == SHAPE


class _Recorder:
    def __init__(self):
        self.metrics, self.tags = {}, {}

    def log_metric(self, key, value):
        self.metrics[key] = value

    def log_metrics(self, metrics=None, **kw):
        self.metrics.update(metrics or {}, **kw)

    def set_tag(self, key, value):
        self.tags[key] = value


def _plan(**kw):
    import torch

    return sharded.Plan(mode="fsdp2", shape=SHAPE, seq_len=9, micro_batch=2, global_batch=2,
                        steps=1, warmup=1, dtype=torch.float32, lr=1e-3, weight_decay=0.0,
                        seed=5, checkpointing=True, mlp_up_saved_layers=3, mlp_up_fit=True, **kw)


def test_the_second_sizing_step_adds_the_layers_that_fit_at_the_measured_rate():
    """The estimate (4 units a layer) kept 2; they added 3 units each, measured: at that rate
    the room left holds 1 more; never more than asked."""
    import torch

    model = llama.build_model(SHAPE, torch.float32, "cpu", seed=5, checkpointing=True)
    first = mlp_up_fit.Fit(kept=2, most=3, layers=3, peak_bytes=100, capacity_bytes=200,
                           layer_bytes=4, margin_bytes=10, estimate_gib=4 / GIB)
    llama.keep_mlp_up(model, 2)
    def keep(n):
        return llama.keep_mlp_up(model, n)

    refined = mlp_up_fit.refine(keep, first, 106)  # room: 200 - 10 - 106 = 84
    assert refined.kept == 3 and refined.layer_bytes == 3 and refined.first_kept == 2
    assert [layer.save_mlp_up for layer in model.layers] == [True, True, True]
    said = refined.describe()
    assert said.startswith("fitted after two sizing steps: the last 3 of 3 decoder layers")
    assert "with the 2 an estimate" in said
    none = mlp_up_fit.refine(keep, replace_kept(first, 0), 100)
    assert none.kept == 0 and none.second_peak_bytes == 100


def replace_kept(fit, kept):
    from dataclasses import replace

    return replace(fit, kept=kept)


def test_on_a_gpu_the_record_holds_what_the_sizing_steps_measured(monkeypatch):
    """The GPU branch with torch.cuda's memory readings stood in: what torch can hold is the
    free memory plus what its allocator already reserved; the first step's estimate keeps 1
    layer, which the second step measures at half the estimate: the room left holds 1 more at
    that rate."""
    import torch

    model = llama.build_model(SHAPE, torch.float32, "cpu", seed=5, checkpointing=True)
    per_layer = mlp_up_fit.layer_bytes(SHAPE, 18, 4)
    reserved, peaks = 10 * GIB, [8 * GIB, 8 * GIB + per_layer // 2]
    free = per_layer + per_layer // 2 - 1  # with what is reserved: room for just under 1.5
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (free, 200 * GIB))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: reserved)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: peaks[0])
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device: peaks.pop(0))
    monkeypatch.setattr(mlp_up_fit, "MARGIN_SHARE", 0.0)
    monkeypatch.setattr(mlp_up_fit, "MARGIN_MIN_BYTES", reserved - 8 * GIB)
    rec = _Recorder()
    fitting = sharded.MlpUpFitting(model, _plan(), rec, True, "cpu", 1)
    fitting.after_step(0)
    assert [layer.save_mlp_up for layer in model.layers] == [False, False, True]
    assert "finetune.mlp_up_saved" not in rec.tags  # said once, after the second step
    fitting.after_step(1)
    fitting.after_step(2)  # later warm-up steps change nothing
    assert [layer.save_mlp_up for layer in model.layers] == [False, True, True]
    assert rec.metrics["mlp_up_saved_layers"] == 2
    assert rec.metrics["mlp_up_fit_peak_gib"] == pytest.approx(8.0)
    assert rec.metrics["mlp_up_layer_gib"] * GIB == pytest.approx(per_layer // 2, abs=1)
    assert rec.tags["finetune.mlp_up_saved"].startswith("fitted after two sizing steps: the last 2")


def test_a_cpu_run_keeps_what_was_asked_and_says_it_was_not_fitted():
    import torch

    model = llama.build_model(SHAPE, torch.float32, "cpu", seed=5, checkpointing=True)
    rec = _Recorder()
    sharded.MlpUpFitting(model, _plan(), rec, False, "cpu", 1).after_step(0)
    assert all(layer.save_mlp_up for layer in model.layers)
    assert rec.metrics["mlp_up_saved_layers"] == 3
    assert "not fitted" in rec.tags["finetune.mlp_up_saved"]


def test_a_compiled_layer_follows_the_flag_set_after_its_first_step():
    """The sizing step runs the layers compiled with none kept; fitting then sets the flag:
    the next call compiles the keeping kind (one more graph) and the gradients stay those of
    the uncompiled model."""
    import torch
    from torch._dynamo.utils import counters

    tokens = torch.randint(0, SHAPE.vocab, (2, 9), generator=torch.Generator().manual_seed(3))
    reference = llama.build_model(SHAPE, torch.float64, "cpu", seed=5, checkpointing=True)
    sharded.loss_of(reference, tokens).backward()
    torch._dynamo.reset()
    model = llama.build_model(SHAPE, torch.float64, "cpu", seed=5, checkpointing=True)
    llama.compile_layers(model, backend=llama.CPU_COMPILE_BACKEND)
    before = counters["stats"]["unique_graphs"]
    sharded.loss_of(model, tokens).backward()
    assert counters["stats"]["unique_graphs"] - before == 1  # one kind of layer so far
    model.zero_grad(set_to_none=True)
    llama.keep_mlp_up(model, 2)
    sharded.loss_of(model, tokens).backward()
    assert counters["stats"]["unique_graphs"] - before == 2  # the keeping kind, traced now
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-10, atol=1e-12)


def test_fitting_needs_the_most_it_may_keep():
    from hopperlab.workloads.finetune import ShardedParams

    with pytest.raises(ValueError, match="mlp_up_fit"):
        ShardedParams(checkpointing=True, mlp_up_fit=True)
    params = ShardedParams(checkpointing=True, mlp_up_saved_layers=4, mlp_up_fit=True)
    assert params.mlp_up_fit


def test_ranks_keep_the_fewest_layers_any_of_them_fits(monkeypatch):
    """Two ranks: this one fits 2 layers, the other 1 (the all-reduce's MIN stood in); both
    keep 1, and the second step measures a layer by the 1 kept."""
    import torch

    model = llama.build_model(SHAPE, torch.float32, "cpu", seed=5, checkpointing=True)
    per_layer = mlp_up_fit.layer_bytes(SHAPE, 18, 4)
    peaks = [8 * GIB, 8 * GIB + per_layer]
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (2 * per_layer, 200 * GIB))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: 10 * GIB)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: peaks[0])
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device: peaks.pop(0))
    monkeypatch.setattr(mlp_up_fit, "MARGIN_SHARE", 0.0)
    monkeypatch.setattr(mlp_up_fit, "MARGIN_MIN_BYTES", 2 * GIB)
    monkeypatch.setattr(sharded.dist, "all_reduce", lambda t, op=None: t.fill_(min(int(t), 1)))
    rec = _Recorder()
    fitting = sharded.MlpUpFitting(model, _plan(), rec, True, "cpu", 2)
    fitting.after_step(0)
    assert fitting.first.kept == 1
    assert [layer.save_mlp_up for layer in model.layers] == [False, False, True]
    fitting.after_step(1)
    assert rec.metrics["mlp_up_layer_gib"] * GIB == pytest.approx(per_layer, abs=1)
    assert rec.metrics["mlp_up_saved_layers"] == 1

