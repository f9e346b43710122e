"""Each memory technique, applied by the finetune loop, gives the baseline's loss and gradients
exactly (CPU, float32, same seed and batch): the offloads only move tensors, checkpointing only
recomputes them. Also: the knob/param plumbing refuses what cannot combine."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from hopperlab.memory.layers import decoder_layers
from hopperlab.workloads.finetune import FinetuneParams, check
from hopperlab.workloads.finetune.torch import model as model_mod
from hopperlab.workloads.finetune.torch.loop import forward_backward, to_device
from hopperlab.workloads.base import Contradiction, Knobs
from hopperlab.workloads.finetune.torch.techniques import Techniques

from tests.memory_helpers import architecture_dir

CONFIG = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
          "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
          "vocab_size": 256, "max_position_embeddings": 128, "tie_word_embeddings": False}
PARAMS = FinetuneParams(weights="random", dtype="float32", lora_rank=4, lora_alpha=8,
                        lora_targets=("q_proj", "v_proj", "down_proj"), seq_len=32,
                        micro_batch=2, offload_min_bytes=0, resident_layers=1,
                        prefetch_layers=1)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return architecture_dir(tmp_path_factory.mktemp("tiny-arch"), CONFIG)


@pytest.fixture(scope="module")
def batch():
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, CONFIG["vocab_size"], (2, 32), generator=g)
    labels = ids.clone()
    labels[:, :5] = -100  # a prompt: no loss there
    return {"input_ids": ids, "labels": labels, "attention_mask": torch.ones_like(ids)}


def loss_and_grads(model_dir, batch, params, knobs=Knobs(), steps=2, host_layers=False):
    """Build, apply the techniques, run ``steps`` forward+backward passes (the second reuses
    pools and slots), return the last loss and every trainable gradient by name.
    ``host_layers``: build as parameter offload does (its random weights differ)."""
    device = torch.device("cpu")
    tech = Techniques(knobs, params, device, cuda=False)
    if tech.offloads_parameters or host_layers:
        model, _ = model_mod.build_host_layers_model(model_dir, params, device)
    else:
        model, _ = model_mod.load_base_model(model_dir, params, device)
    model = model_mod.make_trainable(model, params)
    tech.prepare_model(model, decoder_layers(model))
    for _ in range(steps):
        model.zero_grad(set_to_none=True)
        loss = forward_backward(model, to_device(batch, device), tech.forward_context)
    stats = tech.step_stats()
    tech.close()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    return loss.detach(), grads, stats


def assert_same(a, b):
    (loss_a, grads_a, _), (loss_b, grads_b, _) = a, b
    assert torch.equal(loss_a, loss_b)
    assert grads_a.keys() == grads_b.keys() and grads_a
    for name in grads_a:
        assert torch.equal(grads_a[name], grads_b[name]), name


@pytest.mark.parametrize("method", ["lora", "full"])
def test_activation_offload_is_exact(model_dir, batch, method):
    p = replace(PARAMS, method=method)
    base = loss_and_grads(model_dir, batch, p)
    off = loss_and_grads(model_dir, batch, p, Knobs(offload="activations"))
    assert_same(base, off)
    assert off[2]["act_bytes_offloaded"] > 0
    assert off[2]["act_bytes_reloaded"] == off[2]["act_bytes_offloaded"]


@pytest.mark.parametrize("variant", [
    {"checkpointing": True},
    {"activation_offload": "save_on_cpu"},
    {"offload_budget_gib": 4e-4},  # ~430 KB: some tensors stay, the rest go
    {"checkpointing": True, "offload_budget_gib": None},
])
def test_other_activation_techniques_are_exact(model_dir, batch, variant):
    p = replace(PARAMS, **variant)
    knobs = Knobs(offload="activations") if set(variant) - {"checkpointing"} or len(
        variant) > 1 else Knobs()
    assert_same(loss_and_grads(model_dir, batch, PARAMS),
                loss_and_grads(model_dir, batch, p, knobs))


@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
def test_budget_keeps_some_and_offloads_the_rest(model_dir, batch):
    _, _, all_off = loss_and_grads(model_dir, batch, PARAMS, Knobs(offload="activations"))
    _, _, budget = loss_and_grads(model_dir, batch, replace(PARAMS, offload_budget_gib=4e-4),
                                  Knobs(offload="activations"))
    assert budget["act_bytes_kept_by_budget"] > 0
    assert 0 < budget["act_bytes_offloaded"] < all_off["act_bytes_offloaded"]


@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
@pytest.mark.parametrize("offload", ["parameters", "both"])
def test_parameter_offload_is_exact_and_streams(model_dir, batch, offload):
    p = replace(PARAMS, checkpointing=offload == "both")
    base = loss_and_grads(model_dir, batch, p, host_layers=True)
    got = loss_and_grads(model_dir, batch, p, Knobs(offload=offload))
    assert_same(base, got)
    assert got[2]["param_streamed_layers"] == CONFIG["num_hidden_layers"] - 1
    assert got[2]["param_bytes_streamed"] > 0


def test_save_on_cpu_does_not_combine_with_parameter_offload():
    with pytest.raises(Contradiction, match="save_on_cpu"):
        check(Knobs(offload="both"), replace(PARAMS, activation_offload="save_on_cpu"))
    check(Knobs(offload="activations"), replace(PARAMS, activation_offload="save_on_cpu"))


def test_cut_model_has_the_asked_layers(model_dir):
    model, tags = model_mod.load_base_model(model_dir, replace(PARAMS, num_layers=2), "cpu")
    assert len(decoder_layers(model)) == 2 and tags["model.layers"] == "2"
    with pytest.raises(ValueError, match="num_layers"):
        model_mod.load_base_model(model_dir, replace(PARAMS, num_layers=9), "cpu")


@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
@pytest.mark.parametrize("method", ["lora", "full"])
def test_fp8_on_a_cpu_emulates_the_fp8_product(model_dir, batch, method):
    """Issue 37, item 8: a CPU (smoke) run of the fp8 variant converts the same linears and casts
    the same FP8 operands, but takes their product in float32 (torchao's ``emulate``), because
    ``torch._scaled_mm`` on a CPU is a reference path (0.4 s a product on an Intel Xeon with
    AVX512-FP16). The emulated loss agrees with ``_scaled_mm``'s on the same operands."""
    pytest.importorskip("torchao")
    from torchao.float8.float8_linear import Float8Linear

    from hopperlab.memory.fp8 import convert_to_fp8

    p = replace(PARAMS, method=method)
    tech = Techniques(Knobs(precision="fp8"), p, torch.device("cpu"), cuda=False)
    model = model_mod.make_trainable(model_mod.load_base_model(model_dir, p, "cpu")[0], p)
    tech.prepare_model(model, decoder_layers(model))
    fp8_linears = [m for m in model.modules() if isinstance(m, Float8Linear)]
    assert fp8_linears and all(m.config.emulate for m in fp8_linears)
    assert all(cfg.emulate for m in fp8_linears for cfg in m.linear_mm_config)
    assert "float32" in tech.tags["finetune.fp8_matmul"]

    reference = model_mod.make_trainable(model_mod.load_base_model(model_dir, p, "cpu")[0], p)
    assert len(convert_to_fp8(reference, lora=method == "lora")) == len(fp8_linears)
    assert not any(m.config.emulate for m in reference.modules() if isinstance(m, Float8Linear))
    with torch.no_grad():
        got = model(**to_device(batch, "cpu")).loss
        want = reference(**to_device(batch, "cpu")).loss
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_a_setting_the_engine_would_ignore_is_not_its_param():
    """expandable_segments is applied by the torch and sharded engines
    (memory/caching_allocator.py): the mcore engine would run without it, so it has no such
    param (the matrix refuses the key: tests/config/test_engines.py)."""
    from dataclasses import fields

    from hopperlab.workloads.finetune import McoreParams, ShardedParams

    assert "expandable_segments" not in {f.name for f in fields(McoreParams)}
    assert FinetuneParams(expandable_segments=True).expandable_segments
    assert ShardedParams(expandable_segments=True).expandable_segments
