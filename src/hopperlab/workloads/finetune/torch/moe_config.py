"""The Mixture-of-Experts model config (``"model_type": "hopperlab-moe"`` in models/<name>/
config.json) and its check at spec time.

The MoE decoder is our own module (``moe.py``), not a transformers model, so its config is a
typed dataclass of our own: every key of the file is known, typed and bounded here. The matrix
calls ``check_assets`` for each finetune run before anything is submitted, so a wrong config
(an unknown key, ``top_k`` over ``num_experts``) is refused at ``hopperlab list`` or snakemake's
start with the file and key named, never inside the job. Cheap to import (no torch).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Mapping

from hopperlab.core.errors import SpecError, clip, shown
from hopperlab.core.schema import typed_from_mapping

#: the ``model_type`` of a config.json that ``model.load_base_model`` builds with ``moe.py``
MODEL_TYPE = "hopperlab-moe"


@dataclass(frozen=True)
class MoeConfig:
    """A Llama-style decoder whose FFN is ``num_experts`` SwiGLU experts behind a router."""

    model_type: str
    vocab_size: int
    hidden_size: int
    #: the FFN width of each expert (SwiGLU: gate and up are hidden x this, down this x hidden)
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    max_position_embeddings: int
    num_experts: int
    #: experts each token is sent to (their outputs weighted by the renormalised router probs)
    top_k: int
    #: weight of the load-balancing auxiliary loss added to the LM loss (0: none)
    router_aux_loss_coef: float = 0.01
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    #: standard deviation of the random initial weights
    initializer_range: float = 0.02

    def __post_init__(self) -> None:
        if self.model_type != MODEL_TYPE:
            raise ValueError(f"model_type: expected {MODEL_TYPE!r}, got {self.model_type!r}")
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "int" and (isinstance(value, bool) or not isinstance(value, int)
                                    or value < 1):
                raise ValueError(f"{f.name}: expected a whole number of at least 1, "
                                 f"got {value!r}")
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k: {self.top_k} is more than num_experts "
                             f"({self.num_experts}): a token cannot visit an expert twice")
        if self.hidden_size % self.num_attention_heads or \
                (self.hidden_size // self.num_attention_heads) % 2:
            raise ValueError(f"num_attention_heads: hidden_size {self.hidden_size} must split "
                             f"into {self.num_attention_heads} heads of an even size (RoPE)")
        if self.router_aux_loss_coef < 0:
            raise ValueError(f"router_aux_loss_coef: expected 0 or more, got "
                             f"{self.router_aux_loss_coef!r}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def with_layers(self, num_layers: int | None) -> "MoeConfig":
        """The first ``num_layers`` layers only (None: all); more than the config has is refused."""
        if num_layers is None:
            return self
        if num_layers > self.num_hidden_layers:
            raise ValueError(f"num_layers: {num_layers} is more than the "
                             f"{self.num_hidden_layers} layers of the model config")
        return replace(self, num_hidden_layers=num_layers)


def is_moe(data: Mapping[str, Any]) -> bool:
    return data.get("model_type") == MODEL_TYPE


def moe_config(data: Mapping[str, Any], where: str) -> MoeConfig:
    """The typed config of a config.json's mapping; ``where`` names the file in messages.

    Unknown keys are refused by name (the file is ours: a typo must not pass as a default)."""
    known = {f.name for f in fields(MoeConfig)}
    for key in data:
        if key not in known:
            raise SpecError(f"{where}: {clip(str(key))}: unknown key of a {MODEL_TYPE} model "
                            f"config; expected one of: {', '.join(sorted(known))}")
    return typed_from_mapping(MoeConfig, data, where, f"key of a {MODEL_TYPE} model config")


def read_moe_config(path: Path | str, where: str | None = None) -> MoeConfig:
    """The MoeConfig of a config.json file (or a folder holding one)."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    return moe_config(json.loads(p.read_text()), where or str(p))


def check_model_asset(params: Any, assets: Mapping[str, Any], where: str) -> bool:
    """Spec-time check of a finetune run against its model asset (``FamilyInfo.check_assets``);
    True when the model is a hopperlab-moe config.

    ``assets`` maps each role to its asset spec. A model asset whose architecture file is a
    hopperlab-moe config is read and validated here, with the run's params that depend on it:
    random weights only, full fine-tuning only (no LoRA targets in our module), and
    ``num_layers`` within the config's layers."""
    spec = assets.get("model")
    arch = getattr(spec, "architecture", None)
    if spec is None or not arch:
        return False
    path = Path(arch) if Path(arch).is_absolute() else Path(getattr(spec, "root", ".")) / arch
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SpecError(f"{where}: assets.model {spec.name}: {arch}: not a readable JSON "
                        f"model config ({exc})") from None
    if not isinstance(data, dict) or not is_moe(data):
        return False
    config = moe_config(data, f"{where}: assets.model {spec.name}: {arch}")
    backend = getattr(params, "backend", "torch")
    checks = {
        "backend": (backend == "torch", f"{shown(backend)}: the MoE decoder runs on the torch "
                                        f"backend only"),
        "weights": (getattr(params, "weights", "random") == "random",
                    f"pretrained, but {arch} is an architecture only (our own MoE module has no "
                    f"pretrained weights); use weights: random"),
        "method": (getattr(params, "method", "full") == "full",
                   "lora: the MoE decoder is trained whole (method: full)"),
        "recompute_elementwise": (not getattr(params, "recompute_elementwise", False),
                                  "the technique restates Llama's modules, not the MoE's"),
    }
    for key, (ok, why) in checks.items():
        if not ok:
            raise SpecError(f"{where}.params.{key}: {why}")
    layers = getattr(params, "num_layers", None)
    if layers is not None and layers > config.num_hidden_layers:
        raise SpecError(f"{where}.params.num_layers: {layers} is more than the "
                        f"{config.num_hidden_layers} layers of {arch}")
    return True
