"""The model a run trains: a causal LM from its asset (pretrained or random weights), cut to
``num_layers`` when asked, made trainable by LoRA (peft) or whole, and its parameter counts.

Random weights are built directly where they will live: on the GPU, or on the ``meta`` device
when the decoder layers go to host memory afterwards (parameter offload), so that a 70B
shape never passes through pageable host memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hopperlab.assets.random_weights import (
    architecture_config,
    model_weights,
    read_architecture,
    weights_tags,
)
from hopperlab.memory.pinned import pinned_copy
from hopperlab.workloads.finetune import FinetuneParams
from hopperlab.workloads.finetune.torch import moe
from hopperlab.workloads.finetune.torch.moe_config import is_moe, moe_config


@dataclass
class ModelCounts:
    """Parameter counts the FLOP formula needs (see ``metrics.flops_per_token``)."""

    total: int
    trainable: int
    #: parameters that take part in matrix products for one token: everything but the input
    #: embedding; for an MoE, less the experts a token skips ((E - top_k) experts per layer)
    matmul: int
    layers: int
    hidden: int
    vocab: int


def architecture(model_dir: Path) -> dict[str, Any]:
    return read_architecture(model_dir)


def _config(model_dir: Path, num_layers: int | None) -> Any:
    config = architecture_config(model_dir)
    if num_layers is not None:
        if num_layers > config.num_hidden_layers:
            raise ValueError(f"num_layers: {num_layers} is more than the "
                             f"{config.num_hidden_layers} layers of {model_dir.name}")
        config.num_hidden_layers = num_layers
    return config


def load_base_model(model_dir: Path, params: FinetuneParams, device: Any) -> tuple[Any, dict]:
    """The causal LM of ``model_dir`` on ``device`` in ``params.dtype``; returns (model, tags).

    ``weights: random`` builds it from the asset's config.json (every model asset has one);
    ``weights: pretrained`` loads the safetensors and refuses an asset that has none.
    """
    import torch
    from transformers import AutoModelForCausalLM

    dtype = getattr(torch, params.dtype)
    tags = weights_tags(model_dir)
    if is_moe(architecture(model_dir)):
        return _load_moe(model_dir, params, device, dtype), {
            **tags, "model.weights": "random", "model.architecture": "hopperlab-moe"}
    if params.weights == "random":
        torch.manual_seed(params.seed)
        config = _config(model_dir, params.num_layers)
        old = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            with torch.device(device):
                model = AutoModelForCausalLM.from_config(config)
        finally:
            torch.set_default_dtype(old)
        tags["model.weights"] = "random"
    else:
        if model_weights(model_dir) == "random":
            raise ValueError(f"weights: pretrained, but the model asset {model_dir.name} holds "
                             f"random weights only (its architecture); use weights: random")
        kwargs: dict[str, Any] = {"dtype": dtype}
        if params.num_layers is not None:
            kwargs["config"] = _config(model_dir, params.num_layers)
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), **kwargs)
        model.to(device)
    model.config.use_cache = False
    tags["model.layers"] = str(model.config.num_hidden_layers)
    return model, tags


def _load_moe(model_dir: Path, params: FinetuneParams, device: Any, dtype: Any) -> Any:
    """Our MoE decoder (``moe.py``) from the asset's config.json, random weights only (the
    spec-time check refuses the rest first; this is the job's own guard)."""
    if params.weights != "random":
        raise ValueError(f"weights: pretrained, but {model_dir.name} is a hopperlab-moe "
                         f"architecture (our own module, no pretrained weights); use weights: "
                         f"random")
    config = moe_config(architecture(model_dir), str(model_dir / "config.json"))
    return moe.build(config.with_layers(params.num_layers), device, dtype, params.seed)


def make_trainable(model: Any, params: FinetuneParams) -> Any:
    """LoRA adapters on ``lora_targets`` (the base frozen), or every weight trainable."""
    if params.method == "full":
        for p in model.parameters():
            p.requires_grad_(True)
        return model
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=params.lora_rank, lora_alpha=params.lora_alpha,
                        lora_dropout=params.lora_dropout, target_modules=list(params.lora_targets),
                        bias="none", task_type="CAUSAL_LM")
    return get_peft_model(model, config)


def counts(model: Any) -> ModelCounts:
    """Parameter counts; an MoE's ``matmul`` counts the active parameters only (the router and
    top_k of num_experts experts per layer), as a token's FLOPs do."""
    config = getattr(model, "config")
    seen: set[int] = set()
    total = trainable = embed = 0
    emb = model.get_input_embeddings().weight
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        total += p.numel()
        trainable += p.numel() if p.requires_grad else 0
        if p is emb:
            embed = p.numel()
    inactive = model.inactive_parameters() if isinstance(model, moe.MoeForCausalLM) else 0
    return ModelCounts(total=total, trainable=trainable, matmul=total - embed - inactive,
                       layers=int(config.num_hidden_layers), hidden=int(config.hidden_size),
                       vocab=int(config.vocab_size))


def _init_layer(model: Any, layer: Any) -> None:
    """Random values for one freshly built layer, as the model's own initialiser makes them."""
    for module in layer.modules():
        model._init_weights(module)


def to_host(module: Any, pin: bool) -> None:
    """Move every parameter and buffer of ``module`` to host memory (pinned when ``pin``),
    one tensor at a time: at most one tensor's worth of extra host memory at any moment."""
    import torch

    for tensor_owner in module.modules():
        for name, p in list(tensor_owner.named_parameters(recurse=False)):
            if pin:  # exact size (memory.pinned), not PyTorch's power-of-two pinned blocks
                host = pinned_copy(p.data)
            else:
                host = torch.empty(p.shape, dtype=p.dtype, device="cpu")
                host.copy_(p.data)
            p.data = host
        for name, b in list(tensor_owner.named_buffers(recurse=False)):
            if b is not None:
                tensor_owner._buffers[name] = b.to("cpu")


def build_host_layers_model(model_dir: Path, params: FinetuneParams,
                            device: Any) -> tuple[Any, dict]:
    """The model with its embedding, final norm and LM head on ``device`` and every decoder
    layer in host memory, for parameter offload (``ParameterOffload`` then packs each layer's
    frozen weights into its own pinned buffer, one layer at a time, and frees these).

    Random weights: the model is built without layers on ``device``, then each layer is built
    and initialised on ``device`` and moved to the host before the next is made, so the GPU
    never holds more than one layer. Pretrained weights: loaded on the host.
    """
    import copy

    import torch

    if is_moe(architecture(model_dir)):
        raise ValueError("offload: parameters: not implemented for the hopperlab-moe decoder "
                         "(its layers are not transformers layers); offload activations only")
    if params.weights != "random":
        model, tags = load_base_model(model_dir, params, "cpu")
        layers = model.get_decoder().layers
        for layer in layers:
            to_host(layer, pin=False)
        for module in (model.get_input_embeddings(), model.get_output_embeddings(),
                       model.get_decoder().norm, getattr(model.get_decoder(), "rotary_emb", None)):
            if module is not None:
                module.to(device)
        return model, tags
    import sys

    from transformers import AutoModelForCausalLM

    dtype = getattr(torch, params.dtype)
    config = _config(model_dir, params.num_layers)
    n_layers = config.num_hidden_layers
    shell_config = copy.deepcopy(config)
    shell_config.num_hidden_layers = 0
    torch.manual_seed(params.seed)
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(shell_config)
        # the layers must use the attention kernel the model chose (sdpa), not the eager
        # fallback a layer built outside the model would get
        config._attn_implementation = model.config._attn_implementation
        layer_cls = getattr(sys.modules[type(model).__module__],
                            type(model).__name__.replace("ForCausalLM", "DecoderLayer"))
        layers = []
        for i in range(n_layers):
            with torch.device(device):
                layer = layer_cls(config, i)
            _init_layer(model, layer)
            to_host(layer, pin=False)
            layers.append(layer)
    finally:
        torch.set_default_dtype(old)
    model.get_decoder().layers = torch.nn.ModuleList(layers)
    model.config.num_hidden_layers = n_layers
    model.config.use_cache = False
    tags = weights_tags(model_dir)
    tags.update({"model.weights": "random", "model.layers": str(n_layers)})
    return model, tags
