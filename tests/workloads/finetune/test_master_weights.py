"""AdamW on float32 masters of bf16 weights (workloads/finetune/master_weights.py)."""

import pytest
import torch

from hopperlab.workloads.finetune import FinetuneParams
from hopperlab.workloads.finetune.torch.master_weights import MasterWeightsAdamW


def test_steps_equal_float32_adamw_rounded_to_bf16():
    torch.manual_seed(0)
    ref = torch.nn.Parameter(torch.randn(64, 32))
    weight = torch.nn.Parameter(ref.detach().to(torch.bfloat16))
    opt = MasterWeightsAdamW([weight], lr=1e-2, weight_decay=0.1)
    ref_opt = torch.optim.AdamW([torch.nn.Parameter(weight.detach().float())], lr=1e-2,
                                weight_decay=0.1)
    for _ in range(3):
        grad = torch.randn(64, 32).to(torch.bfloat16)
        weight.grad = grad
        ref_opt.param_groups[0]["params"][0].grad = grad.float()
        opt.step()
        ref_opt.step()
        opt.zero_grad()
        assert weight.grad is None
    master = ref_opt.param_groups[0]["params"][0]
    assert torch.equal(opt.masters[0], master.detach())
    assert torch.equal(weight.detach(), master.detach().to(torch.bfloat16))


def test_updates_below_a_bf16_step_are_kept_in_the_master():
    """What the masters are for: many small updates that bf16 alone would round away."""
    weight = torch.nn.Parameter(torch.ones(8, dtype=torch.bfloat16))
    opt = MasterWeightsAdamW([weight], lr=1e-4, weight_decay=0.0)
    for _ in range(50):
        weight.grad = torch.ones(8, dtype=torch.bfloat16)
        opt.step()
    assert float(opt.masters[0][0]) < 1.0 - 4e-3          # 50 steps of ~1e-4
    assert 8 * 4 * 3 <= opt.state_bytes() < 8 * 4 * 4     # master, exp_avg, exp_avg_sq, step


@pytest.mark.parametrize("kwargs", [{"method": "lora"}, {"method": "full", "dtype": "float32"}])
def test_master_weights_need_full_bf16_training(kwargs):
    with pytest.raises(ValueError, match="master_weights"):
        FinetuneParams(master_weights=True, **kwargs)
