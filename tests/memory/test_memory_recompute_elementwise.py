"""Selective recomputation of the element-wise parts (hopperlab.memory.recompute_elementwise):
exact gradients on CPU (alone, with activation offload, with checkpointing, under autocast),
fewer saved bytes, and what it refuses."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from hopperlab.memory import recompute_elementwise as rec  # noqa: E402
from hopperlab.memory.layers import decoder_layers  # noqa: E402
from hopperlab.memory.activation_offload import ActivationOffload  # noqa: E402
from hopperlab.memory.checkpointing import checkpoint_layers  # noqa: E402

from tests.memory_helpers import (assert_exact, batch, bf16_autocast_step, step,  # noqa: E402
                             tiny_lora_llama, twin)


def _saved_bytes(model, data) -> tuple[int, list[torch.dtype]]:
    """Bytes of the distinct storages autograd saves in one forward (parameters excluded)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}
    dtypes: list[torch.dtype] = []

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            seen[ptr] = t.untyped_storage().nbytes()
            dtypes.append(t.dtype)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(**data, use_cache=False).loss
    loss.backward()           # the recomputation in backward saves its own, outside the count
    model.zero_grad(set_to_none=True)
    return sum(seen.values()), dtypes


def _assert_close(a, b) -> None:
    loss_a, grads_a = a
    loss_b, grads_b = b
    assert torch.equal(loss_a, loss_b)
    assert grads_a.keys() == grads_b.keys() and grads_a
    for name in grads_a:
        torch.testing.assert_close(grads_a[name], grads_b[name], rtol=1e-5, atol=1e-8, msg=name)


@pytest.mark.parametrize("full", [False, True], ids=["lora", "full"])
def test_gradients_exact_in_bf16(full):
    model = tiny_lora_llama(layers=3, full=full).to(torch.bfloat16)
    base = step(model, batch())
    handle = rec.apply(model)
    assert (handle.norms, handle.mlps) == (3 * 2 + 1, 3)   # two per layer and the final norm
    assert_exact(base, step(model, batch()))
    handle.remove()
    assert all("forward" not in m.__dict__ for m in model.modules())
    assert_exact(base, step(model, batch()))


def test_float32_gradients_equal_up_to_summation_order():
    # In a float32 model the norm's upcast is no copy: the stock graph sums the norm's two
    # gradient paths and the residual's in one buffer, ours sums the norm's first; the last
    # bit may differ (bf16 models, where the upcast is a real cast, are exact: above).
    model = tiny_lora_llama(layers=3)
    base = step(model, batch())
    rec.apply(model)
    _assert_close(base, step(model, batch()))


def test_exact_under_bf16_autocast():
    model = tiny_lora_llama(layers=2).to(torch.bfloat16)
    base = bf16_autocast_step(model, batch())
    lean = twin(model)
    rec.apply(lean)
    assert_exact(base, bf16_autocast_step(lean, batch()))


def test_saves_fewer_bytes_and_no_float32_norm_copies():
    model = tiny_lora_llama(layers=2).to(torch.bfloat16)
    data = batch(b=4, s=32)
    before, dtypes_before = _saved_bytes(model, data)
    rec.apply(model)
    after, dtypes_after = _saved_bytes(model, data)
    tokens, d, f, layers = 4 * 32, 64, 128, 2
    # each norm saves its bf16 input instead of a float32 copy (the inverse RMS either way);
    # each MLP drops silu(gate). (LoRA: the first norm's input, the frozen embedding's output,
    # needs no gradient, so that norm saves nothing either way: 2 * layers norms count.)
    norm_saving = tokens * d * (4 - 2)
    assert before - after == 2 * layers * norm_saving + layers * tokens * f * 2
    # float32 saved tensors: the norms' upcast copies before; after, only the loss's log-probs
    assert dtypes_after.count(torch.float32) < dtypes_before.count(torch.float32)


def test_with_activation_offload_the_inputs_are_offloaded_and_exact():
    model = tiny_lora_llama(layers=3).to(torch.bfloat16)
    base = step(model, batch())
    lean = twin(model)
    rec.apply(lean)
    off = ActivationOffload("cpu", min_bytes=1024).wrap_layers(decoder_layers(lean)) \
        .track_parameters(lean)
    assert_exact(base, step(lean, batch(), lambda: off))
    plain = twin(model)
    off_plain = ActivationOffload("cpu", min_bytes=1024).wrap_layers(decoder_layers(plain)) \
        .track_parameters(plain)
    step(plain, batch(), lambda: off_plain)
    s_lean, s_plain = off.stats(), off_plain.stats()
    assert s_lean.bytes_offloaded == s_lean.bytes_reloaded > 0
    assert s_lean.bytes_offloaded < s_plain.bytes_offloaded


def test_with_checkpointing_exact():
    model = tiny_lora_llama(layers=2).to(torch.bfloat16)
    base = step(model, batch())
    lean = twin(model)
    rec.apply(lean)
    checkpoint_layers(decoder_layers(lean))
    assert_exact(base, step(lean, batch()))


def test_no_grad_forward_matches():
    model = tiny_lora_llama(layers=2)
    data = batch()
    with torch.no_grad():
        expected = model(**data, use_cache=False).logits
        rec.apply(model)
        assert torch.equal(expected, model(**data, use_cache=False).logits)


def test_refuses_a_model_without_llama_modules_and_a_second_application():
    with pytest.raises(ValueError, match="recompute_elementwise: Sequential has no LlamaMLP"):
        rec.apply(torch.nn.Sequential(torch.nn.Linear(4, 4)))
    model = tiny_lora_llama(layers=1)
    rec.apply(model)
    with pytest.raises(ValueError, match="already recomputes"):
        rec.apply(model)


def test_norm_function_matches_the_norm_and_its_weight_gradient():
    x = torch.randn(2, 5, 8, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(8, dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(2, 5, 8, dtype=torch.bfloat16)
    rec.rms_norm(x, w, 1e-6).backward(g)
    expected = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    rec.RmsNormSavingInput.apply(x, w, 1e-6).backward(g)
    assert torch.equal(x.grad, expected[0]) and torch.equal(w.grad, expected[1])


def test_function_gives_no_gradient_where_none_is_needed():
    x = torch.randn(3, 4, requires_grad=True)
    w = torch.randn(4)                         # no grad
    out = rec.RecomputeInBackward.apply(lambda a, b: (a * b).sin(), x, w)
    out.sum().backward()
    assert torch.allclose(x.grad, (x * w).cos().detach() * w)
    assert w.grad is None
