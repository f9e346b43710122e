"""The sharded family's model made faster on the GPU without other maths (issue 35): RoPE
tables made once, each decoder layer compiled with its checkpoint inside."""

from __future__ import annotations

import pytest

from hopperlab.workloads.finetune.sharded import llama, rates, engine as sharded

SHAPE = llama.Shape(hidden=32, heads=4, ffn=64, vocab=64, layers=3)


def _rope_as_before(x):
    """The rotary embedding as sharded.py computed it in every layer before (tables each call,
    strided slices)."""
    import torch

    seq, dim = x.shape[-2], x.shape[-1]
    inv = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    ang = torch.outer(torch.arange(seq, dtype=torch.float32), inv)
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


def test_rope_from_kept_tables_is_the_same_rotation():
    import torch

    for dtype in (torch.float64, torch.float32, torch.bfloat16):
        x = torch.randn(2, 4, 7, 8, generator=torch.Generator().manual_seed(1)).to(dtype)
        cos, sin = llama.rope_tables(7, 8, x.device, dtype)
        assert torch.equal(llama.rope(x, cos, sin), _rope_as_before(x))
        assert torch.equal(llama.rope(x), _rope_as_before(x))
        assert llama.rope_tables(7, 8, x.device, dtype)[0] is cos  # made once


def test_a_run_without_compile_says_so_and_keeps_eager_layers():
    import torch

    model = llama.build_model(SHAPE, torch.float32, "cpu", seed=5)
    plan = sharded.Plan(mode="fsdp2", shape=SHAPE, seq_len=8, micro_batch=2, global_batch=2,
                        steps=1, warmup=0, dtype=torch.float32, lr=1e-3, weight_decay=0.0,
                        seed=5, checkpointing=True)
    assert sharded.compile_model(model, plan, cuda=False) == {"finetune.compile": "false"}
    assert all("forward" not in vars(layer) for layer in model.layers)


@pytest.mark.integration  # dynamo + AOTAutograd tracing of a layer, ~5 s
@pytest.mark.parametrize("checkpointing", [True, False], ids=["checkpointed", "plain"])
def test_compiled_layers_give_eagers_loss_and_gradients_from_one_graph(checkpointing):
    """Each layer compiled (AOTAutograd's partitioner, the checkpoint in the graph; the
    ``aot_eager`` backend: inductor's kernels are the GPU's matter) gives eager's loss and
    gradients at float64, and the three layers share one graph (no recompilation per layer)."""
    import torch
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    eager = llama.build_model(SHAPE, torch.float64, "cpu", seed=5, checkpointing=checkpointing)
    compiled = llama.build_model(SHAPE, torch.float64, "cpu", seed=5,
                                   checkpointing=checkpointing)
    assert llama.compile_layers(compiled, backend="aot_eager") == SHAPE.layers
    tokens = torch.randint(0, SHAPE.vocab, (2, 9), generator=torch.Generator().manual_seed(3))
    for model in (eager, compiled):
        sharded.loss_of(model, tokens).backward()
    torch.testing.assert_close(sharded.loss_of(compiled, tokens), sharded.loss_of(eager, tokens),
                               rtol=1e-12, atol=1e-12)
    for (name, a), b in zip(compiled.named_parameters(), eager.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-10, atol=1e-12, msg=name)
    assert counters["stats"]["unique_graphs"] == 1
    torch._dynamo.reset()


def test_a_cpu_run_with_compile_traces_with_the_eager_backend_and_says_so(monkeypatch):
    import torch

    seen = []
    monkeypatch.setattr(sharded, "compile_layers",
                        lambda model, backend: seen.append(backend) or len(model.layers))
    model = llama.build_model(SHAPE, torch.float32, "cpu", seed=5)
    plan = sharded.Plan(mode="fsdp2", shape=SHAPE, seq_len=8, micro_batch=2, global_batch=2,
                        steps=1, warmup=0, dtype=torch.float32, lr=1e-3, weight_decay=0.0,
                        seed=5, checkpointing=True, compile=True)
    tags = sharded.compile_model(model, plan, cuda=False)
    assert seen == ["eager"] and "eager" in tags["finetune.compile"]
    assert "no kernels" in tags["finetune.compile_skipped"]
    assert "inductor" in sharded.compile_model(model, plan, cuda=True)["finetune.compile"]
    assert seen == ["eager", "inductor"]


@pytest.mark.integration  # a job through the runner, ~15 s
def test_a_cpu_run_with_compile_and_the_profiled_step_says_what_it_left_out(tmp_path):
    """Smoke scale with the full scale's compile and checkpointing and the profiled step: the
    layers traced by dynamo's eager backend (one graph per kind of layer), said in the record; the
    profiled step is the GPU's and is skipped on a CPU, with the reason."""
    import json

    from tests.helpers import copy_project, edit_yaml, hopperlab

    project = copy_project(tmp_path / "project")
    key = "finetune/full-llama2-13b-sharded/fsdp2-offload-1gpu"
    edit_yaml(project / "experiments/finetune.yaml", lambda d: d["experiments"][
        "full-llama2-13b-sharded"]["scales"]["smoke"]["params"].update(
            compile=True, checkpointing=True, diagnose_step=True))
    out = hopperlab(["run", key, "--no-upload", "--config", "families=finetune"], project)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    rec = json.loads((project / "results" / key / "metrics.json").read_text())
    assert rec["status"] == "ok", rec.get("reason")
    tags, m = rec["tags"], rec["metrics"]
    assert tags["finetune.compile"].startswith("each decoder layer (2, eager")
    assert "no kernels" in tags["finetune.compile_skipped"]
    assert tags["finetune.step_profile"].startswith("skipped")
    # the variant's last layer keeps its up-projection: a recomputing and a keeping graph
    assert tags["finetune.mlp_up_saved"].startswith("the last 1 of 2 decoder layers keep")
    assert "not fitted" in tags["finetune.mlp_up_saved"]  # mlp_up_fit: no GPU memory to fit
    assert m["compile_graphs"] == 2 and m["mlp_up_saved_layers"] == 1 and m["warmup_s"] > 0
    assert not any(k.startswith("diag_") for k in m)


def _grads_of(model, tokens):
    loss = sharded.loss_of(model, tokens)
    loss.backward()
    return float(loss.detach()), [p.grad.clone() for p in model.parameters()]


def test_layers_keeping_their_mlp_up_projection_train_the_same():
    """The last 2 of 3 layers keep their up-projection (two checkpoints around it): loss and
    gradients equal the all-recomputed and the not-checkpointed model's at float64, and the
    flag is set only where the model recomputes."""
    import torch

    tokens = torch.randint(0, SHAPE.vocab, (2, 9), generator=torch.Generator().manual_seed(3))
    plain = llama.build_model(SHAPE, torch.float64, "cpu", seed=5)
    assert llama.keep_mlp_up(plain, 2) == 0  # nothing is recomputed: nothing to keep
    ref_loss, ref_grads = _grads_of(plain, tokens)
    kept = llama.build_model(SHAPE, torch.float64, "cpu", seed=5, checkpointing=True)
    assert llama.keep_mlp_up(kept, 2) == 2
    assert [layer.save_mlp_up for layer in kept.layers] == [False, True, True]
    loss, grads = _grads_of(kept, tokens)
    assert loss == pytest.approx(ref_loss, rel=1e-12)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_a_kept_up_projection_is_not_recomputed_in_backward():
    """What the layer runs in backward: a checkpointed layer calls gate_up twice per step
    (forward and its recomputation); a keeping layer once."""
    import torch

    calls = {"kept": 0, "recomputed": 0}
    model = llama.build_model(SHAPE, torch.float64, "cpu", seed=5, checkpointing=True)
    llama.keep_mlp_up(model, 1)
    model.layers[2].gate_up.register_forward_hook(
        lambda *_: calls.__setitem__("kept", calls["kept"] + 1))
    model.layers[0].gate_up.register_forward_hook(
        lambda *_: calls.__setitem__("recomputed", calls["recomputed"] + 1))
    tokens = torch.randint(0, SHAPE.vocab, (2, 9), generator=torch.Generator().manual_seed(3))
    sharded.loss_of(model, tokens).backward()
    assert calls == {"kept": 1, "recomputed": 2}


@pytest.mark.integration  # dynamo + AOTAutograd tracing of two kinds of layer, ~8 s
def test_compiled_keeping_layers_give_eagers_gradients_from_two_graphs():
    import torch
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    tokens = torch.randint(0, SHAPE.vocab, (2, 9), generator=torch.Generator().manual_seed(3))
    eager = llama.build_model(SHAPE, torch.float64, "cpu", seed=5, checkpointing=True)
    compiled = llama.build_model(SHAPE, torch.float64, "cpu", seed=5, checkpointing=True)
    for model in (eager, compiled):
        llama.keep_mlp_up(model, 2)
    llama.compile_layers(compiled, backend="aot_eager")
    loss, grads = _grads_of(compiled, tokens)
    ref_loss, ref_grads = _grads_of(eager, tokens)
    assert loss == pytest.approx(ref_loss, rel=1e-12)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    assert counters["stats"]["unique_graphs"] == 2  # a recomputing layer and a keeping one
    torch._dynamo.reset()


def test_the_floor_counts_no_recomputation_of_a_kept_up_projection():
    import torch

    plan = sharded.Plan(mode="fsdp2", shape=SHAPE, seq_len=8, micro_batch=2, global_batch=2,
                        steps=1, warmup=0, dtype=torch.float32, lr=1e-3, weight_decay=0.0,
                        seed=5, checkpointing=True)
    model = llama.build_model(SHAPE, torch.float32, "cpu", seed=5, checkpointing=True)
    all_recomputed = rates.step_flops_of(model, plan, 1)
    llama.keep_mlp_up(model, 2)
    up = model.layers[0].gate_up.weight.numel()
    assert all_recomputed - rates.step_flops_of(model, plan, 1) == pytest.approx(
        2 * 2 * up * plan.global_batch * plan.seq_len)  # 2 FLOPs per parameter per token


def test_the_compute_probe_prices_the_keeping_layers_with_a_probe_of_their_own(monkeypatch):
    """Beyond 4 layers the compute is extrapolated from probes of 2 and 4 recomputing layers;
    with keeping layers a third probe of 2 such layers adds each one's difference."""
    import torch

    seen = []

    def fake_measure(model, plan, device, accum):
        kept = sum(layer.save_mlp_up for layer in model.layers)
        seen.append((len(model.layers), kept))
        return 1.0 + 0.5 * len(model.layers) - 0.1 * kept

    monkeypatch.setattr(sharded, "measure_compute", fake_measure)
    shape = llama.Shape(hidden=32, heads=4, ffn=64, vocab=64, layers=10)
    plan = sharded.Plan(mode="fsdp2", shape=shape, seq_len=8, micro_batch=2, global_batch=2,
                        steps=1, warmup=0, dtype=torch.float32, lr=1e-3, weight_decay=0.0,
                        seed=5, checkpointing=True, mlp_up_saved_layers=3)
    assert sharded.probe_compute(plan, "cpu", 1, 3) == pytest.approx(1.0 + 0.5 * 10 - 0.1 * 3)
    assert seen == [(2, 0), (4, 0), (2, 2)]


def test_the_chunked_loss_is_the_whole_batchs_loss_and_gradients():
    """``loss_chunk_tokens``: the loss and every gradient equal the whole-logits loss's (float32
    model; the chunked loss's softmax is float32 as the plain one's upcast is)."""
    import torch

    tokens = torch.randint(0, SHAPE.vocab, (2, 9), generator=torch.Generator().manual_seed(3))
    plain = llama.build_model(SHAPE, torch.float32, "cpu", seed=5, checkpointing=True)
    chunked = llama.build_model(SHAPE, torch.float32, "cpu", seed=5, checkpointing=True)
    chunked.loss_chunk_tokens = 5  # 16 targets: chunks of 5, 5, 5, 1
    loss, grads = _grads_of(plain, tokens)
    chunk_loss, chunk_grads = _grads_of(chunked, tokens)
    assert chunk_loss == pytest.approx(loss, rel=1e-6)
    for a, b in zip(chunk_grads, grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


@pytest.mark.integration  # FSDP2 with CPU offload over a gloo group of one, 3 steps each way
def test_fsdp2_offload_trains_the_same_with_the_chunked_loss(tmp_path):
    """Under FSDP2 (the head's weight gathered inside the root's forward, its gradient
    reduced and offloaded by FSDP2) the chunked loss trains as the plain one does."""
    import torch
    import torch.distributed as dist
    from torch.distributed import HashStore

    def train(chunk):
        model, _ = sharded.build_sharded(SHAPE, torch.float32, "fsdp2-cpu-offload", 5, "cpu",
                                         cuda=False, checkpointing=True)
        model.loss_chunk_tokens = chunk
        opt = sharded.make_optimizer(model, "fsdp2-cpu-offload", 1e-2, 0.0)
        losses = [sharded.train_step(model, opt, s, 1, 0, 1, 8, 2, SHAPE.vocab, 5, "cpu")[0]
                  for s in range(3)]
        return losses, [p.detach().to_local().clone() for p in model.parameters()]

    dist.init_process_group("gloo", store=HashStore(), rank=0, world_size=1)
    try:
        plain, plain_w = train(None)
        chunked, chunked_w = train(6)
    finally:
        dist.destroy_process_group()
    assert chunked == pytest.approx(plain, rel=1e-5)
    # AdamW divides each gradient by its own root mean square: a near-zero gradient's float32
    # rounding (the chunks sum in another order) moves its weight by up to ~1e-5 of lr 1e-2
    for a, b in zip(chunked_w, plain_w):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=5e-5)
