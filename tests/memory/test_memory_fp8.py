"""FP8 (hopperlab.memory.fp8): which linears are converted for LoRA and for full fine-tuning,
the conversion itself (torchao, module swap only: no FP8 matmul without a Hopper GPU), the
guard that refuses FP8 without one, and per-layer compile."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from hopperlab.memory.fp8 import (  # noqa: E402
    Fp8Unavailable, compile_layers, convert_to_fp8, fp8_candidates, fp8_unavailable_reason, require_fp8)

from tests.memory_helpers import batch, step, tiny_lora_llama  # noqa: E402

PROJ = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}


def test_lora_selects_frozen_base_projections_only():
    model = tiny_lora_llama(layers=2)
    names = fp8_candidates(model, lora=True)
    assert len(names) == 2 * 7
    for n in names:
        assert ".layers." in n and "lm_head" not in n and "lora_" not in n
    attn = [n for n in names if "self_attn" in n]
    assert all(n.endswith(".base_layer") for n in attn)           # peft's wrapped frozen Linear
    mlp = [n for n in names if ".mlp." in n]
    assert {n.split(".")[-1] for n in mlp} == {"gate_proj", "up_proj", "down_proj"}


def test_full_selects_every_decoder_linear():
    model = tiny_lora_llama(layers=2, full=True)
    names = fp8_candidates(model, lora=False)
    assert {n.split(".")[-1] for n in names} == PROJ and len(names) == 14
    assert not any("lm_head" in n for n in names)


def test_dims_not_multiple_of_16_are_skipped():
    from torch import nn

    model = nn.Module()
    model.layers = nn.ModuleList([nn.ModuleDict({"a": nn.Linear(64, 64), "b": nn.Linear(64, 40)})])
    assert fp8_candidates(model, lora=False) == ["layers.0.a"]


def test_conversion_swaps_modules_and_keeps_frozen_weights():
    pytest.importorskip("torchao")
    from torchao.float8.float8_linear import Float8Linear

    model = tiny_lora_llama(layers=2)
    before = {n: p.requires_grad for n, p in model.named_parameters()}
    names = convert_to_fp8(model, lora=True)
    modules = dict(model.named_modules())
    assert all(isinstance(modules[n], Float8Linear) for n in names)
    assert not isinstance(modules["base_model.model.lm_head"], Float8Linear)
    lora_a = [m for n, m in modules.items() if n.endswith("lora_A.default")]
    assert lora_a and not any(isinstance(m, Float8Linear) for m in lora_a)
    after = {n: p.requires_grad for n, p in model.named_parameters()}
    assert before == after                     # same parameters, frozen ones still frozen


def test_guard_refuses_without_hopper():
    if torch.cuda.is_available() and fp8_unavailable_reason() is None:
        pytest.skip("this node can run FP8")
    reason = fp8_unavailable_reason()
    assert reason and "FP8" in reason
    with pytest.raises(Fp8Unavailable, match="FP8"):
        require_fp8()


@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
def test_compile_layers_in_place():
    model = tiny_lora_llama(layers=2)
    before = step(model, batch())
    names = [n for n, _ in model.named_parameters()]
    assert compile_layers(model, backend="eager") == 2
    assert [n for n, _ in model.named_parameters()] == names      # state-dict names unchanged
    after = step(model, batch())
    assert torch.equal(before[0], after[0])
