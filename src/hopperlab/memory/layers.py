"""Find the decoder layers of a causal LM: the one helper every technique and family uses.

Why one strategy: the techniques hook the stack of decoder layers of models they do not build
(Hugging Face causal LMs, the same inside peft's wrappers, after accelerate's dispatch), so the
stack is found by what it is, not by an attribute path. Cheap to import (torch inside).
"""

from __future__ import annotations

from typing import Any

#: names a decoder stack goes by (Llama/Mistral ``layers``, GPT-2 ``h``, others ``blocks``)
STACK_NAMES = ("layers", "h", "blocks")


def decoder_layers(model: Any) -> Any:
    """The model's stack of decoder layers: the largest ``nn.ModuleList`` named ``...layers``
    (or ``h``, ``blocks``).

    Works for Hugging Face causal LMs (``model.model.layers``) and for the same model inside
    peft's wrappers (``base_model.model.model.layers``) without knowing either's attribute path.
    """
    from torch import nn

    best: nn.ModuleList | None = None
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and name.split(".")[-1] in STACK_NAMES:
            if best is None or len(module) > len(best):
                best = module
    if best is None:
        raise ValueError(f"no decoder layer list (a ModuleList named 'layers') in "
                         f"{type(model).__name__}")
    return best
