"""A tiny LoRA Llama and one training step, shared by the memory-technique tests."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Callable, ContextManager

import torch
from torch import nn


def tiny_lora_llama(layers: int = 4, seed: int = 0, full: bool = False) -> nn.Module:
    """Llama (hidden 64, float32) with LoRA r=8 on q/k/v/o; lora_B made non-zero so that every
    adapter has a gradient. ``full``: no LoRA, every weight trainable."""
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      attn_implementation="eager")
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    if full:
        return model
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0,
                                             target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    return model


def batch(seed: int = 0, b: int = 2, s: int = 16) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 128, (b, s), generator=gen)
    return {"input_ids": ids, "labels": ids.clone()}


def step(model: nn.Module, data: dict[str, torch.Tensor],
         context: Callable[[], ContextManager] | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Forward (inside ``context()``) and backward; the loss and every trainable gradient."""
    model.zero_grad(set_to_none=True)
    if context is None:
        loss = model(**data, use_cache=False).loss
    else:
        with context():
            loss = model(**data, use_cache=False).loss
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    return loss.detach(), grads


def bf16_autocast_step(model: nn.Module, data: dict[str, torch.Tensor],
                       device_type: str = "cpu") -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``step`` with forward and backward under ``torch.autocast(device_type, bfloat16)``."""
    with torch.autocast(device_type, dtype=torch.bfloat16):
        return step(model, data)


def twin(model: nn.Module) -> nn.Module:
    return copy.deepcopy(model)


def assert_exact(a: tuple, b: tuple) -> None:
    loss_a, grads_a = a
    loss_b, grads_b = b
    assert torch.equal(loss_a, loss_b), (loss_a, loss_b)
    assert grads_a.keys() == grads_b.keys()
    assert grads_a, "no trainable gradients"
    for name in grads_a:
        assert torch.equal(grads_a[name], grads_b[name]), name


def architecture_dir(folder: Path, config: dict) -> Path:
    """A model folder holding only ``config.json``: what ``weights: random`` builds from."""
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def storages_left_by_a_failed_step(model: nn.Module, context: Any, pack_owner: Any) -> int:
    """Run forward inside ``context`` and fail before backward, as an out-of-memory error would;
    drop every reference the caller had and collect. How many storages of activations (saved
    tensors with a ``grad_fn``, not views of a weight) are still alive: 0 unless the saved-tensor hooks closed a
    reference cycle that the garbage collector cannot break."""
    import gc

    from torch.multiprocessing.reductions import StorageWeakRef

    seen: list[StorageWeakRef] = []
    pack = pack_owner._pack
    weights = {q.untyped_storage().data_ptr() for q in model.parameters()}

    def spy(t: torch.Tensor) -> Any:
        if t.grad_fn is not None and t.untyped_storage().data_ptr() not in weights:
            seen.append(StorageWeakRef(t.untyped_storage()))
        return pack(t)

    pack_owner._pack = spy
    try:
        with context:
            loss = model(**batch(), use_cache=False).loss
        del loss                                 # the step fails here, before backward
    finally:
        del pack_owner._pack                     # the bound method again
    gc.collect()
    assert seen, "nothing was saved"
    return sum(not ref.expired() for ref in seen)
