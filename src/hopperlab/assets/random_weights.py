"""Models from their architecture alone (``weights: random``), and loading a model asset.

Performance studies need the shapes, not the trained values: a model built from its
``config.json`` runs the same kernels and moves the same bytes. It is created directly on the
target device (``meta`` to count parameters without memory, ``cuda`` to run), never on the
CPU first. Every model asset says which weights it holds, and ``weights_tags`` turns that into
the tags a run records.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from hopperlab.assets.manifest import INFO


def read_architecture(config_path: Path | str) -> dict[str, Any]:
    """The architecture dict of a ``config.json`` (a file, or a folder holding one)."""
    path = Path(config_path)
    if path.is_dir():
        path = path / "config.json"
    data = json.loads(path.read_text())
    if "model_type" not in data:
        raise ValueError(f"{path}: no model_type: not a Hugging Face model config")
    return data


def architecture_config(config_path: Path | str):
    """A transformers config object built from the JSON file alone (no download)."""
    from transformers import AutoConfig

    data = dict(read_architecture(config_path))
    model_type = data.pop("model_type")
    for key in ("architectures", "transformers_version", "_name_or_path"):
        data.pop(key, None)
    return AutoConfig.for_model(model_type, **data)


@contextmanager
def _default_dtype(dtype: Any) -> Iterator[None]:
    import torch

    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def _torch_dtype(dtype: Any):
    import torch

    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    return getattr(torch, str(dtype))


def count_parameters(model: Any) -> int:
    """Distinct parameters (tied weights once)."""
    return sum(p.numel() for p in model.parameters())


def build_random_model(config_path: Path | str, device: Any = "meta", *,
                       dtype: Any = "bfloat16", seed: int | None = None) -> tuple[Any, int]:
    """A causal LM of the architecture in ``config_path``, randomly initialised on ``device``.

    ``device="meta"`` allocates nothing (for counting); ``"cuda"`` allocates and initialises on
    the GPU directly. Returns ``(model, number of parameters)``.
    """
    import torch
    from transformers import AutoModelForCausalLM

    config = architecture_config(config_path)
    if seed is not None:
        torch.manual_seed(seed)
    torch_dtype = _torch_dtype(dtype) or torch.float32
    with torch.device(device), _default_dtype(torch_dtype):
        model = AutoModelForCausalLM.from_config(config)
    return model, count_parameters(model)


def format_count(n: int) -> str:
    """``6738415616`` -> ``'6.74 B'``."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return str(n)


def model_weights(model_dir: Path | str) -> str:
    """``pretrained``, ``random`` or ``generated`` (a tiny smoke model), from ASSET.json."""
    try:
        info = json.loads((Path(model_dir) / INFO).read_text())
    except (OSError, ValueError):
        return "unknown"
    return str(info.get("weights") or "unknown")


def weights_tags(model_dir: Path | str) -> dict[str, str]:
    """Tags for a run's record: which model asset, which weights, which revision."""
    try:
        info = json.loads((Path(model_dir) / INFO).read_text())
    except (OSError, ValueError):
        return {"model.weights": "unknown", "model.path": str(model_dir)}
    source = info.get("source") or {}
    tags = {"model.asset": str(info.get("name")), "model.weights": model_weights(model_dir),
            "model.fingerprint": str(info.get("fingerprint"))}
    for key in ("repo", "revision"):
        if source.get(key):
            tags[f"model.{key}"] = str(source[key])
    return tags


def load_model(model_dir: Path | str, device: Any = "cpu", *, dtype: Any = "bfloat16",
               seed: int | None = None) -> tuple[Any, dict[str, str]]:
    """The model of an asset folder, on ``device``: built from its architecture when the asset
    holds random weights, loaded from its safetensors otherwise. Returns ``(model, tags)``."""
    tags = weights_tags(model_dir)
    if tags.get("model.weights") == "random":
        model, _ = build_random_model(model_dir, device, dtype=dtype, seed=seed)
        return model, tags
    import transformers
    from transformers import AutoModelForCausalLM

    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    key = "dtype" if (major, minor) >= (4, 56) else "torch_dtype"
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), **{key: _torch_dtype(dtype)})
    return model.to(device), tags
