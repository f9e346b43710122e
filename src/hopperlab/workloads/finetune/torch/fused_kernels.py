"""Liger Kernel's fused Triton kernels in the torch engine's Llama (param ``liger``).

Why: transformers' Llama runs RMSNorm as separate ``pow``/``mean``/``rsqrt``/``mul`` kernels
and float32 casts, RoPE as ``rotate_half`` with a ``torch.cat`` per call, SwiGLU as three
element-wise kernels, and the loss over the whole batch's float32 logits; megatron-core's step
at the same shape was 17 % shorter (docs/benchmarks/finetune.md). Liger Kernel is the field's
kept library for exactly these four (``rms_norm``, ``rope``, ``swiglu``,
``fused_linear_cross_entropy``); each is a setting of its own, so each can be measured.

The kernels go onto one model instance: its norms and MLPs get Liger's forwards, its causal LM
Liger's loss forward (the logits of a training step are never made). RoPE is a module-level
function that transformers' attention looks up at call time, so it is swapped in
``modeling_llama`` while the run trains and put back by ``remove``; the module's classes, which
Liger's entry point replaces too, are put back at once (models built later keep their own).
Triton kernels need a CUDA device: without one the workload skips the run with the reason
(``LigerUnavailable``), it never trains without the kernels it was asked for.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hopperlab.workloads.base import package_version
from hopperlab.workloads.finetune import LIGER_KERNELS

#: what Liger's entry point replaces in transformers' llama module
_MODULE_NAMES = ("apply_rotary_pos_emb", "LlamaRMSNorm", "LlamaMLP")


class LigerUnavailable(RuntimeError):
    """The run asks for Liger's kernels where they cannot run (no CUDA, no liger-kernel)."""


@dataclass
class LigerHandle:
    kernels: tuple[str, ...]
    version: str
    _module: Any = None
    _saved: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        return f"{','.join(self.kernels)} (liger-kernel {self.version})"

    def remove(self) -> None:
        """Put transformers' RoPE back (the instance patches die with the model)."""
        for name, value in self._saved.items():
            setattr(self._module, name, value)
        self._saved.clear()


def require(cuda: bool) -> str:
    """liger-kernel's version where its kernels can run; else LigerUnavailable, saying why."""
    if not cuda:
        raise LigerUnavailable("Liger Kernel's Triton kernels need a CUDA device and this run "
                               "has none (set liger: [] to run it on the CPU)")
    try:
        import liger_kernel.transformers  # noqa: F401
    except ImportError as exc:
        raise LigerUnavailable(f"liger-kernel is not importable here ({exc})") from None
    return package_version("liger-kernel") or "unknown"


def llama_of(model: Any) -> Any:
    """The transformers ``LlamaForCausalLM`` inside ``model`` (peft's wrapper or the model)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if type(base).__name__ != "LlamaForCausalLM":
        raise ValueError(f"liger: Liger's Llama kernels need a transformers LlamaForCausalLM, "
                         f"not {type(base).__name__}")
    return base


def apply(model: Any, kernels: tuple[str, ...], version: str) -> LigerHandle:
    """Liger's ``kernels`` on ``model`` (call ``require`` first); returns the handle whose
    ``remove`` undoes the module-level RoPE swap."""
    from liger_kernel.transformers import apply_liger_kernel_to_llama
    from transformers.models.llama import modeling_llama

    base = llama_of(model)
    saved = {name: getattr(modeling_llama, name) for name in _MODULE_NAMES}
    apply_liger_kernel_to_llama(
        rope="rope" in kernels, rms_norm="rms_norm" in kernels, swiglu="swiglu" in kernels,
        fused_linear_cross_entropy="fused_linear_cross_entropy" in kernels,
        cross_entropy=False, model=base)
    for name in ("LlamaRMSNorm", "LlamaMLP"):  # classes: later models keep transformers' own
        setattr(modeling_llama, name, saved[name])
    keep = {"apply_rotary_pos_emb": saved["apply_rotary_pos_emb"]} if "rope" in kernels else {}
    return LigerHandle(tuple(k for k in LIGER_KERNELS if k in kernels), version,
                       modeling_llama, keep)
