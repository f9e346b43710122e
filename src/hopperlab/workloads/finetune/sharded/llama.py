"""The Llama the sharded fine-tune trains (RMSNorm, RoPE attention, SwiGLU), built from a shape
with random weights: a performance study needs the architecture, not the weights. Each decoder
layer can be compiled (its checkpoint inside, so the partitioner plans the recomputation) and
can keep its MLP's up-projection instead of recomputing it, and the loss can be computed in
chunks inside the forward; ``sharded.py`` shards and trains it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from hopperlab.memory.chunked_cross_entropy import LinearCrossEntropy
from hopperlab.workloads.finetune.sharded import shard_init


@dataclass(frozen=True)
class Shape:
    hidden: int
    heads: int
    ffn: int
    vocab: int
    layers: int


class RMSNorm(nn.Module):
    def __init__(self, dim: int, dtype: Any, device: Any) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype, device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # float32 at least: a float64 model (the tests') stays float64 throughout
        wide = x.to(torch.promote_types(x.dtype, torch.float32))
        var = wide.pow(2).mean(-1, keepdim=True)
        return (wide * torch.rsqrt(var + 1e-5)).to(x.dtype) * self.weight


#: RoPE tables by (seq, head_dim, device, dtype): made once per shape, not in every layer's
#: forward (and its recomputation) of every step
_ROPE: dict[tuple[int, int, str, Any], tuple[torch.Tensor, torch.Tensor]] = {}


def rope_tables(seq: int, dim: int, device: Any, dtype: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) [seq, dim/2] of the rotary embedding, in ``dtype``; computed in float32 once
    per (seq, dim, device, dtype) and kept (constants: no gradient flows into them)."""
    key = (seq, dim, str(device), dtype)
    if key not in _ROPE:
        inv = 1.0 / (10000 ** (torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim))
        ang = torch.outer(torch.arange(seq, device=device, dtype=torch.float32), inv)
        _ROPE[key] = (ang.cos().to(dtype), ang.sin().to(dtype))
    return _ROPE[key]


def rope(x: torch.Tensor, cos: torch.Tensor | None = None,
         sin: torch.Tensor | None = None) -> torch.Tensor:
    """Rotary position embedding of ``x`` [batch, heads, seq, head_dim], interleaved pairs
    (elements 2i and 2i+1 rotated together); ``cos``/``sin`` from ``rope_tables`` (made here
    when not given)."""
    if cos is None or sin is None:
        cos, sin = rope_tables(x.shape[-2], x.shape[-1], x.device, x.dtype)
    pairs = x.unflatten(-1, (-1, 2))
    x1, x2 = pairs[..., 0], pairs[..., 1]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


class Block(nn.Module):
    """One decoder layer. Under ``checkpointing`` its forward is recomputed in backward
    (``torch.utils.checkpoint`` inside ``forward``, so that a compiled layer holds the
    checkpoint in its graph and the partitioner plans the recomputation: torchtitan's order,
    activation checkpointing, then compile, then ``fully_shard`` around both).
    ``save_mlp_up`` (``keep_mlp_up``): the layer keeps its MLP's up-projection output and
    input instead of recomputing them: two checkpoints (attention and norm; the MLP's
    element-wise part and down-projection) around an up-projection autograd saves for itself,
    so backward recomputes no ``gate_up`` matmul (its largest: 43 % of a 13B layer's)."""

    def __init__(self, s: Shape, dtype: Any, device: Any, checkpointing: bool = False) -> None:
        super().__init__()
        kw = {"bias": False, "dtype": dtype, "device": device}
        self.heads = s.heads
        self.checkpointing = checkpointing
        self.save_mlp_up = False
        self.attn_norm, self.mlp_norm = RMSNorm(s.hidden, dtype, device), RMSNorm(s.hidden, dtype, device)
        self.qkv = nn.Linear(s.hidden, 3 * s.hidden, **kw)
        self.o = nn.Linear(s.hidden, s.hidden, **kw)
        self.gate_up = nn.Linear(s.hidden, 2 * s.ffn, **kw)
        self.down = nn.Linear(s.ffn, s.hidden, **kw)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if not self.checkpointing:
            return self.body(x, cos, sin)
        if not self.save_mlp_up:
            return checkpoint(self.body, x, cos, sin, use_reentrant=False)
        x, normed = checkpoint(self.attention, x, cos, sin, use_reentrant=False)
        return x + checkpoint(self.mlp_tail, self.gate_up(normed), use_reentrant=False)

    def body(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x, normed = self.attention(x, cos, sin)
        return x + self.mlp_tail(self.gate_up(normed))

    def attention(self, x: torch.Tensor, cos: torch.Tensor,
                  sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The residual stream after attention, and its norm (the MLP's input)."""
        b, t, h = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).view(b, t, 3, self.heads, -1).unbind(2)
        q, k, v = rope(q.transpose(1, 2), cos, sin), rope(k.transpose(1, 2), cos, sin), v.transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, h))
        return x, self.mlp_norm(x)

    def mlp_tail(self, gate_up: torch.Tensor) -> torch.Tensor:
        """SwiGLU's element-wise part and the down-projection, from the up-projection."""
        gate, up = gate_up.chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class Llama(nn.Module):
    def __init__(self, s: Shape, dtype: Any, device: Any, checkpointing: bool = False) -> None:
        super().__init__()
        self.embed = nn.Embedding(s.vocab, s.hidden, dtype=dtype, device=device)
        self.layers = nn.ModuleList(Block(s, dtype, device, checkpointing) for _ in range(s.layers))
        self.norm = RMSNorm(s.hidden, dtype, device)
        self.head = nn.Linear(s.hidden, s.vocab, bias=False, dtype=dtype, device=device)
        self.checkpointing = checkpointing
        self.head_dim = s.hidden // s.heads
        #: the loss in chunks of this many tokens (``forward`` with targets); None: whole
        self.loss_chunk_tokens: int | None = None

    def forward(self, tokens: torch.Tensor,
                targets: torch.Tensor | None = None) -> torch.Tensor:
        """The logits of ``tokens``; with ``targets`` (and ``loss_chunk_tokens``) the mean
        next-token loss instead, computed chunk by chunk with its gradient
        (``memory.chunked_cross_entropy``): the whole batch's float32 logits never exist.
        Inside ``forward``, so that FSDP2 holds the head's gathered weight for it."""
        x = self.embed(tokens)
        cos, sin = rope_tables(tokens.shape[-1], self.head_dim, x.device, x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin)
        x = self.norm(x)
        if targets is None or self.loss_chunk_tokens is None:
            return self.head(x)
        flat = x.reshape(-1, x.shape[-1])
        return LinearCrossEntropy.apply(flat, self.head.weight, targets.reshape(-1),
                                        self.loss_chunk_tokens, x.dtype, None)


def keep_mlp_up(model: Llama, layers: int) -> int:
    """Let the last ``layers`` decoder layers keep their MLP's up-projection (``Block``) where
    the model recomputes in backward; before the first forward (a compiled layer reads the
    flag when it is traced: two kinds of layers, two graphs). Returns how many keep it (0
    without checkpointing: nothing is recomputed)."""
    n = min(max(0, layers), len(model.layers)) if model.checkpointing else 0
    for i, layer in enumerate(model.layers):
        layer.save_mlp_up = i >= len(model.layers) - n
    return n


#: what a CPU run with ``compile`` does (no inductor kernels: minutes of C++ for a smoke run)
CPU_COMPILE_BACKEND = "eager"


def compile_layers(model: Llama, backend: str = "inductor") -> int:
    """``torch.compile`` each decoder layer's forward (its checkpoint inside: the recompute
    is planned in the graph), not the module's call, so that FSDP2's hooks around it stay
    eager; the layers share one code object, hence one compilation for all of them (their
    parameters are graph inputs). Returns how many layers were compiled."""
    for layer in model.layers:
        layer.forward = torch.compile(layer.forward, backend=backend, fullgraph=True)
    return len(model.layers)


def build_model(shape: Shape, dtype: Any, device: Any, seed: int,
                checkpointing: bool = False) -> Llama:
    """The whole model on ``device``, built on the meta device and filled from ``seed``
    (``shard_init``: norms at 1, the rest N(0, 0.02)): the model every sharded build of the
    same seed holds a shard of."""
    model = Llama(shape, dtype, "meta", checkpointing)
    model.to_empty(device=device)
    shard_init.init_weights(model, seed, device)
    return model
