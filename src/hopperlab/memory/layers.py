"""Find the decoder layers of a causal LM, plain or wrapped by peft."""

from __future__ import annotations

from torch import nn


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The model's stack of decoder layers: the largest ``nn.ModuleList`` named ``...layers``.

    Works for Hugging Face causal LMs (``model.model.layers``) and for the same model inside
    peft's wrappers (``base_model.model.model.layers``) without knowing either's attribute path.
    """
    best: nn.ModuleList | None = None
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and name.split(".")[-1] in ("layers", "h", "blocks"):
            if best is None or len(module) > len(best):
                best = module
    if best is None:
        raise ValueError(f"no decoder layer list (a ModuleList named 'layers') in {type(model).__name__}")
    return best
