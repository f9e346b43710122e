"""FP8 linear layers (torchao.float8, dynamic tensorwise scaling) and per-layer torch.compile.

Why: Hopper's tensor cores run FP8 matrix products at twice bf16's rate. ``convert_to_fp8(model,
lora=...)`` swaps the linears inside the decoder layers whose dimensions are multiples of 16
(never ``lm_head``) for torchao's ``Float8Linear``: all of them for full fine-tuning, the frozen
ones for LoRA, where ``FrozenFloat8Linear`` (the default, ``frozen_kernel=True``) saves only the
weight and computes only the input gradient (torchao's own function wastes a GEMM and keeps an
activation for a frozen weight). ``compile_layers(model)`` compiles each decoder layer in place:
the bf16 + compile baseline and the FP8 variant's compile step. ``require_fp8`` raises
``Fp8Unavailable`` where there is no FP8 GPU or no torchao. In detail: docs/memory.md ("FP8").
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from hopperlab.memory.layers import decoder_layers
from hopperlab.core.errors import NodeError

#: the smallest compute capability torchao's FP8 training runs on (Hopper is 9.0)
MIN_CAPABILITY = (8, 9)
SKIPPED_NAMES = ("lm_head",)


class Fp8Unavailable(NodeError):
    """FP8 cannot run here (no suitable GPU, or torchao missing): the run should be skipped."""


def fp8_unavailable_reason(device: torch.device | str | None = None) -> str | None:
    """Why FP8 training cannot run on ``device``, or None when it can."""
    if not torch.cuda.is_available():
        return "FP8 linear layers need a Hopper-class CUDA GPU (compute capability >= 8.9); this node has no CUDA device"
    dev = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
    if dev.type != "cuda":
        return f"FP8 linear layers run on a CUDA GPU, not on {dev}"
    cap = torch.cuda.get_device_capability(dev)
    if tuple(cap) < MIN_CAPABILITY:
        name = torch.cuda.get_device_name(dev)
        return (f"FP8 linear layers need compute capability >= {MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} "
                f"(Hopper is 9.0); {name} has {cap[0]}.{cap[1]}")
    try:
        import torchao.float8  # noqa: F401
    except ImportError as exc:
        return f"torchao is not installed ({exc}); install torchao>=0.18 for FP8"
    return None


def require_fp8(device: torch.device | str | None = None) -> None:
    """Raise ``Fp8Unavailable`` (a SkipRun-worthy message) unless FP8 can run on ``device``."""
    reason = fp8_unavailable_reason(device)
    if reason is not None:
        raise Fp8Unavailable(reason)


def _in_decoder_layer(fqn: str) -> bool:
    parts = fqn.split(".")
    return any(p in ("layers", "h", "blocks") and i + 1 < len(parts) and parts[i + 1].isdigit()
               for i, p in enumerate(parts))


def fp8_module_filter(*, lora: bool) -> Callable[[nn.Module, str], bool]:
    """The ``module_filter_fn`` for ``convert_to_float8_training``: which linears become FP8."""

    def keep(module: nn.Module, fqn: str) -> bool:
        if not isinstance(module, nn.Linear):
            return False
        if any(part in SKIPPED_NAMES for part in fqn.split(".")):
            return False
        if not _in_decoder_layer(fqn):
            return False
        if module.in_features % 16 or module.out_features % 16:
            return False
        if lora:
            leaf = fqn.split(".")[-1]
            if leaf.startswith("lora_") or ".lora_" in fqn or module.weight.requires_grad:
                return False
        return True

    return keep


def fp8_candidates(model: nn.Module, *, lora: bool) -> list[str]:
    """The fully qualified names of the linears ``convert_to_fp8`` would convert."""
    keep = fp8_module_filter(lora=lora)
    return [name for name, mod in model.named_modules() if keep(mod, name)]


def convert_to_fp8(model: nn.Module, *, lora: bool, config: Any = None,
                   frozen_kernel: bool | None = None, emulate: bool = False) -> list[str]:
    """Swap the selected linears for torchao ``Float8Linear`` (tensorwise dynamic scaling, the
    default ``Float8LinearConfig``); returns the names converted. Call after peft wraps the model
    and before ``compile_layers``. ``frozen_kernel`` (default: ``lora``): frozen-weight linears
    become ``FrozenFloat8Linear`` (no weight gradient, no saved input). ``emulate`` (a CPU run):
    torchao's ``emulate`` config, the same casts, scales and autograd with the product of the
    FP8 operands taken in float32, because ``torch._scaled_mm`` on a CPU is a functional
    reference that took 0.4 s for a 1024x64x128 product on an Intel Xeon with AVX512-FP16/AMX
    (docs/benchmarks/platform.md, "FP8 on an Intel CPU")."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    from torchao.float8.float8_linear_utils import swap_linear_layers

    names = fp8_candidates(model, lora=lora)
    if not names:
        raise ValueError("no linear layer qualifies for FP8 (decoder-layer linears with dims % 16 == 0)")
    config = config or Float8LinearConfig(emulate=emulate)
    frozen_kernel = lora if frozen_kernel is None else frozen_kernel
    modules = dict(model.named_modules())
    frozen = {n for n in names if frozen_kernel and not modules[n].weight.requires_grad}
    plain = set(names) - frozen
    if plain:
        convert_to_float8_training(model, module_filter_fn=lambda m, fqn: fqn in plain, config=config)
    if frozen:
        cls = frozen_float8_linear_class()
        swap_linear_layers(model, lambda m: cls.from_float(m, config=config),
                           module_filter_fn=lambda m, fqn: fqn in frozen)
    return names


_FROZEN_CLASS: Any = None


def frozen_float8_linear_class() -> Any:
    """``FrozenFloat8Linear``: a torchao ``Float8Linear`` for a frozen weight (built on first use,
    so that importing this module does not import torchao)."""
    global _FROZEN_CLASS
    if _FROZEN_CLASS is not None:
        return _FROZEN_CLASS
    from torchao.float8.float8_linear import Float8Linear
    from torchao.float8.float8_scaling_utils import hp_tensor_to_float8_dynamic
    from torchao.float8.float8_training_tensor import GemmInputRole

    class _FrozenWeightFp8Matmul(torch.autograd.Function):
        """y = x @ w.T in FP8; backward: only dx = dy @ w, from the saved (frozen) weight."""

        @staticmethod
        def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, mm_config: Any, config: Any) -> torch.Tensor:
            ctx.save_for_backward(weight)
            ctx.mm_config, ctx.config = mm_config, config
            c = config
            x8 = hp_tensor_to_float8_dynamic(x, c.cast_config_input.target_dtype, mm_config,
                                             gemm_input_role=GemmInputRole.INPUT)
            w8t = hp_tensor_to_float8_dynamic(weight.t(), c.cast_config_weight.target_dtype, mm_config,
                                              gemm_input_role=GemmInputRole.WEIGHT)
            shape = x8.shape
            out = torch.mm(x8.reshape(-1, shape[-1]), w8t)
            return out.reshape(*shape[:-1], out.shape[-1])

        @staticmethod
        def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:
            (weight,) = ctx.saved_tensors
            c = ctx.config
            shape = grad_out.shape
            g8 = hp_tensor_to_float8_dynamic(grad_out.reshape(-1, shape[-1]),
                                             c.cast_config_grad_output.target_dtype, ctx.mm_config,
                                             gemm_input_role=GemmInputRole.GRAD_OUTPUT)
            w8 = hp_tensor_to_float8_dynamic(weight, c.cast_config_weight_for_grad_input.target_dtype,
                                             ctx.mm_config, gemm_input_role=GemmInputRole.WEIGHT)
            grad_x = torch.mm(g8, w8)
            return grad_x.reshape(*shape[:-1], grad_x.shape[-1]), None, None, None

    class FrozenFloat8Linear(Float8Linear):
        def forward(self, input: torch.Tensor) -> torch.Tensor:
            if self.weight.requires_grad:       # unfrozen later: torchao's full function
                return super().forward(input)
            if torch.is_autocast_enabled():
                input = input.to(torch.get_autocast_gpu_dtype())
            out = _FrozenWeightFp8Matmul.apply(input, self.weight, self.linear_mm_config, self.config)
            if self.bias is not None:
                out = out + self.bias.to(out.dtype)
            return out

    _FROZEN_CLASS = FrozenFloat8Linear
    return _FROZEN_CLASS


def compile_layers(model: nn.Module, **compile_kwargs: Any) -> int:
    """``torch.compile`` each decoder layer separately, in place; returns how many."""
    layers = decoder_layers(model)
    for layer in layers:
        layer.compile(**compile_kwargs)
    return len(layers)
