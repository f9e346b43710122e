"""The attention call the torch engine's model makes on the full-scale code path (random
weights from config.json, peft LoRA, the loop's batch to the device), pinned on the CPU:
Dolly rows right-padded by ``assets.dolly.pad`` must reach SDPA as ``is_causal=True`` with no
mask (the causal kernel skips the masked half; a padding mask makes it compute the whole
square), and dropping the mask must leave the loss and the adapters' gradients as they were."""

from __future__ import annotations

import pytest
import torch

from hopperlab.assets.dolly import IGNORE_INDEX, pad
from hopperlab.memory.layers import decoder_layers
from hopperlab.workloads.base import Knobs
from hopperlab.workloads.finetune import FinetuneParams
from hopperlab.workloads.finetune.torch import model as model_mod
from hopperlab.workloads.finetune.torch.loop import causal_mask_suffices, forward_backward, to_device
from hopperlab.workloads.finetune.torch.techniques import Techniques

from tests.memory_helpers import architecture_dir

CONFIG = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
          "vocab_size": 256, "max_position_embeddings": 64, "tie_word_embeddings": False}
#: the full-scale params of lora-llama2-7b (random weights, LoRA on q/k/v/o), float32 on a CPU
PARAMS = FinetuneParams(weights="random", dtype="float32", seq_len=32, micro_batch=3)
SEQ = PARAMS.seq_len


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return architecture_dir(tmp_path_factory.mktemp("tiny-llama-arch"), CONFIG)


def dolly_batch(lengths: list[int], prompt: int = 4) -> dict[str, torch.Tensor]:
    """Rows as the Dolly loader makes them: a prompt without loss, a response, right padding."""
    g = torch.Generator().manual_seed(11)
    rows = []
    for n in lengths:
        ids = torch.randint(1, CONFIG["vocab_size"], (n,), generator=g).tolist()
        labels = [IGNORE_INDEX] * prompt + ids[prompt:]
        rows.append(pad(ids, labels, SEQ, pad_id=0))
    return {key: torch.tensor([r[i] for r in rows]) for i, key in
            enumerate(("input_ids", "labels", "attention_mask"))}


def build(model_dir):
    torch.manual_seed(0)
    model, _ = model_mod.load_base_model(model_dir, PARAMS, "cpu")
    model = model_mod.make_trainable(model, PARAMS)
    tech = Techniques(Knobs(), PARAMS, torch.device("cpu"), cuda=False)
    return tech.prepare_model(model, decoder_layers(model)), tech


def sdpa_calls(monkeypatch) -> list[dict]:
    """Record each call of torch.nn.functional.scaled_dot_product_attention (transformers'
    sdpa attention looks it up there at call time), then run the real one."""
    calls: list[dict] = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, **kw):
        calls.append({"attn_mask": attn_mask, "is_causal": is_causal, "q": tuple(q.shape)})
        return real(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, **kw)
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    return calls


def test_right_padded_rows_reach_sdpa_as_causal_without_a_mask(model_dir, monkeypatch):
    model, tech = build(model_dir)
    batch = dolly_batch([SEQ, 20, 9])
    assert not bool(batch["attention_mask"].all())  # padded: the case the loader makes
    calls = sdpa_calls(monkeypatch)
    forward_backward(model, to_device(batch, "cpu"), tech.forward_context)
    assert len(calls) == CONFIG["num_hidden_layers"]
    for call in calls:
        assert call["is_causal"] is True and call["attn_mask"] is None, call
        assert call["q"] == (3, CONFIG["num_attention_heads"], SEQ, 16)


def test_dropping_the_padding_mask_leaves_loss_and_gradients_as_they_were(model_dir):
    batch = dolly_batch([SEQ, 20, 9])
    without = to_device(batch, "cpu")
    assert "attention_mask" not in without
    results = []
    for inputs in (without, batch):  # causal only, then the padding mask as transformers has it
        model, tech = build(model_dir)
        loss = forward_backward(model, inputs, tech.forward_context)
        grads = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
        results.append((loss.detach(), grads))
    (loss_a, grads_a), (loss_b, grads_b) = results
    torch.testing.assert_close(loss_a, loss_b, rtol=1e-6, atol=1e-6)
    assert grads_a.keys() == grads_b.keys() and grads_a
    for name in grads_a:
        torch.testing.assert_close(grads_a[name], grads_b[name], rtol=1e-5, atol=1e-6)


def test_a_mask_causal_attention_cannot_replace_is_kept(model_dir, monkeypatch):
    """Left padding, a hole inside a row, or a padded position with a label: the mask (or the
    loss over the pads) matters, so it goes to the model and SDPA gets it."""
    batch = dolly_batch([SEQ, 20, 9])
    left = {k: v.flip(-1) for k, v in batch.items()}
    labelled = {**batch, "labels": batch["input_ids"].clone()}
    holed = {**batch, "attention_mask": batch["attention_mask"].clone()}
    holed["attention_mask"][0, 5] = 0
    holed["labels"] = holed["labels"].masked_fill(holed["attention_mask"] == 0, IGNORE_INDEX)
    for b in (left, labelled, holed):
        assert not causal_mask_suffices(b["attention_mask"], b["labels"])
        assert "attention_mask" in to_device(b, "cpu")
    assert causal_mask_suffices(batch["attention_mask"], batch["labels"])
    model, tech = build(model_dir)
    calls = sdpa_calls(monkeypatch)
    forward_backward(model, to_device(left, "cpu"), tech.forward_context)
    assert calls and all(c["attn_mask"] is not None and c["is_causal"] is False for c in calls)
