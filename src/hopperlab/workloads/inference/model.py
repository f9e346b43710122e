"""The model a run works on: the run's ``model`` asset, on the run's device, in eval mode.

Smoke scale names the ``tiny-llama`` asset (a saved checkpoint); full scale names a Llama-2-7B
asset with ``weights: random``, which ``hopperlab.assets`` builds from its ``config.json``
directly on the GPU (nothing downloaded; the kernels and bytes are those of the real model).
"""

from __future__ import annotations

from typing import Any

from hopperlab.assets.random_weights import load_model


def load_run_model(model_dir: Any, device: Any, dtype: str,
                   seed: int) -> tuple[Any, dict[str, str]]:
    model, tags = load_model(model_dir, device, dtype=dtype, seed=seed)
    model.eval()
    model.config.use_cache = True
    return model, tags


def kv_bytes_per_token(config: Any, element_size: int) -> int:
    """Bytes one token adds to the KV cache: keys and values of every layer."""
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return 2 * config.num_hidden_layers * kv_heads * head_dim * element_size


def vocab_size(model: Any) -> int:
    return int(model.config.vocab_size)
