"""Liger Kernel's kernels give the unfused model's losses and adapter gradients (float32, a
tiny Llama, on a GPU: Triton needs one). Each kernel alone and all four, against the same
model, seed and right-padded batch, through the family's techniques and loop."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from hopperlab.assets.dolly import IGNORE_INDEX
from hopperlab.memory.layers import decoder_layers
from hopperlab.workloads.base import Knobs
from hopperlab.workloads.finetune import LIGER_KERNELS, FinetuneParams
from hopperlab.workloads.finetune.torch import model as model_mod
from hopperlab.workloads.finetune.torch.loop import forward_backward, to_device
from hopperlab.workloads.finetune.torch.techniques import Techniques

from tests.memory_helpers import architecture_dir

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="Liger's Triton kernels "
                                "need a CUDA device (run on the lent GPU)")
CONFIG = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 688,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
          "vocab_size": 1000, "max_position_embeddings": 128, "tie_word_embeddings": False}
PARAMS = FinetuneParams(weights="random", dtype="float32", seq_len=128, micro_batch=4,
                        lora_targets=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                      "up_proj", "down_proj"))
STEPS = 3


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return architecture_dir(tmp_path_factory.mktemp("tiny-llama-arch"), CONFIG)


def batch() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, CONFIG["vocab_size"], (4, 128), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 90:] = 0
    labels = ids.masked_fill(mask == 0, IGNORE_INDEX)
    labels[:, :8] = IGNORE_INDEX
    return {"input_ids": ids, "labels": labels, "attention_mask": mask}


def train(model_dir, kernels):
    """Losses of STEPS AdamW steps and the last step's adapter gradients."""
    device = torch.device("cuda", 0)
    params = replace(PARAMS, liger=kernels)
    torch.manual_seed(0)
    model, _ = model_mod.load_base_model(model_dir, params, device)
    model = model_mod.make_trainable(model, params)
    tech = Techniques(Knobs(), params, device, cuda=True)
    model = tech.prepare_model(model, decoder_layers(model))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        loss = forward_backward(model, to_device(batch(), device), tech.forward_context)
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
        opt.step()
        losses.append(loss.item())
    tech.close()
    return losses, grads


@pytest.mark.parametrize("kernels", [(k,) for k in LIGER_KERNELS] + [LIGER_KERNELS],
                         ids=lambda k: "+".join(k))
def test_liger_gives_the_unfused_losses_and_gradients(model_dir, kernels):
    want_losses, want_grads = train(model_dir, ())
    got_losses, got_grads = train(model_dir, kernels)
    assert want_losses[-1] < want_losses[0]  # it learns, so the steps compare something
    torch.testing.assert_close(got_losses, want_losses, rtol=2e-5, atol=2e-5)
    assert got_grads.keys() == want_grads.keys() and got_grads
    for name in want_grads:
        torch.testing.assert_close(got_grads[name], want_grads[name], rtol=2e-3, atol=2e-5,
                                   msg=lambda m: f"{name}: {m}")
