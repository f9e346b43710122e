"""Selective recomputation of the cheap element-wise parts of a Llama decoder layer: fewer
saved bytes for the price of a few memory-bound kernels in backward.

Why: each RMSNorm saves a float32 copy of its input and the MLP saves ``gate``, ``silu(gate)``
and ``up``; saving the norm's bf16 input and recomputing ``silu(gate)`` takes 23% off what a
Llama-2-7B layer saves, and no matrix product is recomputed (checkpointing recomputes them all).
Two autograd Functions save through ``ctx.save_for_backward``, so the offloads' saved-tensor
hooks see what they save: ``RecomputeInBackward`` (the MLP's product) and ``RmsNormSavingInput``
(autograd's backward of the norm restated op by op: gradients bit for bit the stock modules' in
bf16). Only Llama's own ``LlamaRMSNorm`` and ``LlamaMLP`` are changed; ``apply`` refuses a model
with neither. Measurements: docs/memory.md ("Recomputing the element-wise parts").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

#: the module classes whose forward this technique restates, by class name
NORM_CLASSES = frozenset({"LlamaRMSNorm"})
MLP_CLASSES = frozenset({"LlamaMLP"})


class RecomputeInBackward(torch.autograd.Function):
    """``fn(*tensors)``, saving only ``tensors``; backward recomputes ``fn`` and differentiates it.

    ``fn`` must be deterministic and read no tensor other than its arguments (parameters it
    needs are passed as arguments, so their gradients flow and streamed weights are saved
    properly).
    """

    @staticmethod
    def forward(ctx: Any, fn: Callable[..., torch.Tensor], *tensors: torch.Tensor) -> torch.Tensor:
        ctx.fn = fn
        ctx.autocast = _autocast_state(tensors[0].device.type)
        ctx.save_for_backward(*tensors)
        return fn(*tensors)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        needs = ctx.needs_input_grad[1:]
        leaves = [t.detach().requires_grad_(need) for t, need in zip(ctx.saved_tensors, needs)]
        device_type, enabled, dtype = ctx.autocast
        with torch.enable_grad(), torch.autocast(device_type, dtype=dtype, enabled=enabled):
            out = ctx.fn(*leaves)
        wanted = [leaf for leaf, need in zip(leaves, needs) if need]
        grads = iter(torch.autograd.grad(out, wanted, grad) if wanted else ())
        return (None, *(next(grads) if need else None for need in needs))


def _autocast_state(device_type: str) -> tuple[str, bool, torch.dtype]:
    return (device_type, torch.is_autocast_enabled(device_type),
            torch.get_autocast_dtype(device_type))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``LlamaRMSNorm``'s math (float32 statistics, the product in the input's dtype)."""
    input_dtype = x.dtype
    h = x.to(torch.float32)
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + eps)
    return weight * h.to(input_dtype)


class RmsNormSavingInput(torch.autograd.Function):
    """``rms_norm`` that saves its input (in its own dtype), the weight and the float32 inverse
    RMS (one float per token) instead of the float32 copy of the input.

    Backward restates, op by op and in the same order, what autograd runs for ``rms_norm``'s
    graph (the derivative formulas of ``mul``, ``rsqrt``, ``mean``, ``pow`` and the casts), from
    the upcast input recomputed: the same kernels on the same values, so the same bits; only the
    variance is not recomputed (its result, the inverse RMS, is saved)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        xf = x.to(torch.float32)
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return weight * (xf * rstd).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight, rstd = ctx.saved_tensors
        xf = x.to(torch.float32)
        grad_weight = None
        if ctx.needs_input_grad[1]:
            grad_weight = (grad * (xf * rstd).to(x.dtype)).sum_to_size(weight.shape)
        grad_x = None
        if ctx.needs_input_grad[0]:
            grad_h = (grad * weight).to(torch.float32)          # mul, then the cast back
            grad_rstd = (grad_h * xf).sum(-1, keepdim=True)     # mul's other (broadcast)
            grad_var = -0.5 * grad_rstd * rstd.pow(3)           # rsqrt's formula
            grad_sq = grad_var.expand(xf.shape) / xf.shape[-1]  # mean's
            grad_xf = grad_h * rstd + grad_sq * (2 * xf.pow(1))  # mul's self + pow's
            grad_x = grad_xf.to(x.dtype)
        return grad_x, grad_weight, None


class _NormForward:
    """Replaces a ``LlamaRMSNorm``'s forward: saves the bf16 input, not its float32 copy."""

    def __init__(self, norm: nn.Module):
        self.norm = norm
        self.eps = float(norm.variance_epsilon)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.is_grad_enabled():
            return rms_norm(x, self.norm.weight, self.eps)
        return RmsNormSavingInput.apply(x, self.norm.weight, self.eps)


class _MlpForward:
    """Replaces a ``LlamaMLP``'s forward: the projections as before, ``act(gate) * up``
    recomputed in backward from ``gate`` and ``up``."""

    def __init__(self, mlp: nn.Module):
        self.mlp = mlp
        act = mlp.act_fn
        self.fn = lambda gate, up: act(gate) * up

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        mlp = self.mlp
        gate, up = mlp.gate_proj(x), mlp.up_proj(x)
        if torch.is_grad_enabled():
            hidden = RecomputeInBackward.apply(self.fn, gate, up)
        else:
            hidden = self.fn(gate, up)
        return mlp.down_proj(hidden)


@dataclass
class RecomputedModules:
    """Handle on the changed modules; ``remove()`` gives them their own forward back."""

    norms: int
    mlps: int
    _modules: list[nn.Module]

    def remove(self) -> None:
        for module in self._modules:
            del module.forward             # the instance attribute: the class's forward is back
        self._modules = []

    def describe(self) -> str:
        return f"{self.norms} RMSNorms, {self.mlps} MLPs"


def apply(model: nn.Module) -> RecomputedModules:
    """Make every ``LlamaRMSNorm`` and ``LlamaMLP`` of ``model`` save less (module docstring).

    Call it before any technique that wraps the layers' forward (checkpointing, compile).
    Raises ``ValueError`` when the model has none of them, or when a module was already changed.
    """
    changed: list[nn.Module] = []
    norms = mlps = 0
    for module in model.modules():
        name = type(module).__name__
        if name not in NORM_CLASSES and name not in MLP_CLASSES:
            continue
        if isinstance(module.__dict__.get("forward"), (_NormForward, _MlpForward)):
            raise ValueError(f"{name} already recomputes its element-wise part")
        if name in NORM_CLASSES:
            module.forward = _NormForward(module)
            norms += 1
        else:
            module.forward = _MlpForward(module)
            mlps += 1
        changed.append(module)
    if not changed:
        raise ValueError(f"recompute_elementwise: {type(model).__name__} has no "
                         f"{'/'.join(sorted(NORM_CLASSES | MLP_CLASSES))} module; the technique "
                         f"restates those modules' math and knows no other")
    return RecomputedModules(norms=norms, mlps=mlps, _modules=changed)
