"""AdamW over float32 master copies of bfloat16 weights: mixed-precision training as Megatron-LM's
``--bf16`` and PyTorch AMP keep it.

The model computes in bf16 (its weights and gradients are bf16, so are the activations it saves);
the optimizer holds a float32 copy of every weight and float32 AdamW states, steps them, and
writes the rounded result back. 16 bytes per trained parameter (2 weight + 2 gradient + 4 master
+ 8 states) against 8 for AdamW on bf16 weights: what the source's MoE SFT pays per parameter,
and the updates smaller than a bf16 ulp are not lost. Job-side (torch at module level).
"""

from __future__ import annotations

from typing import Any, Iterable

import torch


class MasterWeightsAdamW:
    """``step()`` / ``zero_grad()`` like a torch optimizer; the float32 masters live on the
    weights' device. The float32 gradients exist during the step only (Megatron keeps them
    throughout): backward's peak, when the activations are alive, does not carry them."""

    def __init__(self, params: Iterable[torch.nn.Parameter], *, lr: float, weight_decay: float,
                 fused: bool | None = None) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.masters = [p.detach().float().clone() for p in self.params]
        for m in self.masters:
            m.requires_grad_(True)
        self.inner = torch.optim.AdamW(self.masters, lr=lr, weight_decay=weight_decay,
                                       fused=fused)

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.inner.param_groups

    @torch.no_grad()
    def step(self) -> None:
        for p, m in zip(self.params, self.masters):
            m.grad = None if p.grad is None else p.grad.float()
        self.inner.step()
        for p, m in zip(self.params, self.masters):
            m.grad = None
            p.copy_(m)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None

    def state_bytes(self) -> int:
        """Bytes of the masters and the AdamW states (after the first step)."""
        states = sum(t.numel() * t.element_size() for s in self.inner.state.values()
                     for t in s.values() if torch.is_tensor(t))
        return sum(m.numel() * m.element_size() for m in self.masters) + states
