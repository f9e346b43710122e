"""The chunked causal-LM loss (hopperlab.memory.chunked_cross_entropy): the same loss and
gradients as transformers' own (LoRA, full, bf16 autocast, ignored labels, with activation
offload), less memory at the loss, and what it refuses."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from hopperlab.memory import chunked_cross_entropy as cce  # noqa: E402
from hopperlab.memory.layers import decoder_layers  # noqa: E402
from hopperlab.memory.activation_offload import ActivationOffload  # noqa: E402
from hopperlab.memory import recompute_elementwise as rec  # noqa: E402

from tests.memory_helpers import (batch, bf16_autocast_step, step, tiny_lora_llama,  # noqa: E402
                             twin)


def _assert_close(a, b, rtol=1e-5, atol=1e-7) -> None:
    loss_a, grads_a = a
    loss_b, grads_b = b
    torch.testing.assert_close(loss_a, loss_b, rtol=rtol, atol=atol)
    assert grads_a.keys() == grads_b.keys() and grads_a
    for name in grads_a:
        torch.testing.assert_close(grads_a[name], grads_b[name], rtol=rtol, atol=atol, msg=name)


@pytest.mark.parametrize("chunk", [1, 7, 32, 1000])
@pytest.mark.parametrize("full", [False, True], ids=["lora", "full"])
def test_same_loss_and_gradients_as_transformers(full, chunk):
    model = tiny_lora_llama(layers=2, full=full)
    base = step(model, batch())
    handle = cce.apply(model, chunk)
    assert handle.describe() == f"LlamaForCausalLM, chunks of {chunk} tokens"
    chunked = step(model, batch())
    _assert_close(base, chunked)
    if full:   # the head is trained: its gradient comes from the chunks too
        assert "lm_head.weight" in chunked[1]
    handle.remove()
    assert "forward" not in model.get_base_model().__dict__ if not full else \
        "forward" not in model.__dict__
    _assert_close(base, step(model, batch()), rtol=0, atol=0)


def test_ignored_labels_and_padding_rows():
    model = tiny_lora_llama(layers=2)
    data = batch()
    data["labels"][0, :9] = -100          # a prompt masked out, as the Dolly preparation does
    data["labels"][1, -4:] = -100
    base = step(model, data)
    cce.apply(model, 5)
    _assert_close(base, step(model, data))


def test_num_items_in_batch_divides_the_sum():
    model = tiny_lora_llama(layers=1)
    data = batch()
    model.zero_grad(set_to_none=True)
    ref = model(**data, use_cache=False, num_items_in_batch=torch.tensor(50)).loss
    cce.apply(model, 4)
    got = model(**data, use_cache=False, num_items_in_batch=torch.tensor(50)).loss
    torch.testing.assert_close(ref, got, rtol=1e-6, atol=0)


def test_bf16_autocast_within_bf16_rounding():
    model = tiny_lora_llama(layers=2).to(torch.bfloat16)
    base = bf16_autocast_step(model, batch())
    chunked_model = twin(model)
    cce.apply(chunked_model, 8)
    # the stock path rounds the logits to bf16 before its float32 softmax, and so do we; the
    # summation order of the loss differs (float32), the gradients go through the same bf16 casts
    _assert_close(base, bf16_autocast_step(chunked_model, batch()), rtol=2e-2, atol=1e-3)


def test_with_activation_offload_and_recompute():
    model = tiny_lora_llama(layers=3)
    base = step(model, batch())
    lean = twin(model)
    rec.apply(lean)
    cce.apply(lean, 6)
    offload = ActivationOffload("cpu", min_bytes=0).wrap_layers(decoder_layers(lean))
    offload.track_parameters(lean)
    _assert_close(base, step(lean, batch(), context=lambda: offload))
    assert offload.stats().bytes_offloaded > 0


def test_eval_and_generation_keep_the_stock_forward():
    model = tiny_lora_llama(layers=1)
    data = batch()
    with torch.no_grad():
        ref = model(**data, use_cache=False)
    cce.apply(model, 4)
    with torch.no_grad():
        out = model(**data, use_cache=False)
    assert out.logits is not None
    torch.testing.assert_close(ref.logits, out.logits, rtol=0, atol=0)
    torch.testing.assert_close(ref.loss, out.loss, rtol=0, atol=0)
    train_out = model(**data, use_cache=False)
    assert train_out.logits is None and train_out.loss.requires_grad


def test_loss_saves_no_logits():
    """What the loss keeps for backward: the hidden states' gradient, no (tokens, vocabulary)
    log-probabilities (the tiny model's MLP is vocabulary-wide too, but 3-D)."""
    data = batch(b=2, s=16)
    logits_shape = (2 * 16, 128)
    model = tiny_lora_llama(layers=1)

    def saved_shapes(m) -> list[tuple[int, ...]]:
        shapes: list[tuple[int, ...]] = []

        def pack(t):
            shapes.append(tuple(t.shape))
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            m(**data, use_cache=False).loss.backward()
        return shapes

    assert logits_shape in saved_shapes(model)      # the stock loss saves its log-probabilities
    cce.apply(model, 4)
    shapes = saved_shapes(model)
    assert logits_shape not in shapes and (2 * 16, 64) in shapes   # the hidden's gradient


def test_refusals():
    model = tiny_lora_llama(layers=1)
    with pytest.raises(ValueError, match="at least 1"):
        cce.apply(model, 0)
    cce.apply(model, 4)
    with pytest.raises(ValueError, match="already computes its loss in chunks"):
        cce.apply(model, 4)
    with pytest.raises(ValueError, match="no ...ForCausalLM"):
        cce.apply(torch.nn.Sequential(torch.nn.Linear(2, 2)), 4)
    biased = tiny_lora_llama(layers=1, full=True)
    biased.lm_head = torch.nn.Linear(64, 128, bias=True)
    with pytest.raises(ValueError, match="with a bias"):
        cce.apply(biased, 4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_bf16_autocast_within_bf16_tolerance():
    """On the GPU (cuBLAS products in bf16, float32 softmax): the same loss and gradients as
    transformers' loss to bf16 rounding."""
    model = tiny_lora_llama(layers=2).to("cuda", torch.bfloat16)
    data = {k: v.cuda() for k, v in batch(b=4, s=32).items()}
    base = bf16_autocast_step(model, data, "cuda")
    chunked_model = twin(model)
    cce.apply(chunked_model, 16)
    _assert_close(base, bf16_autocast_step(chunked_model, data, "cuda"), rtol=2e-2, atol=1e-3)
