"""Our own Mixture-of-Experts causal LM: a Llama-style decoder whose FFN is a mixture of SwiGLU
experts behind a learned linear router (issue 19, the source's Megatron-LM MoE SFT).

One layer: ``x + attn(norm(x))`` (RoPE, SDPA with ``is_causal``: flash attention on the GPU),
then ``x + moe(norm(x))``. The MoE block:

1. router: ``softmax(x W_r)`` over ``num_experts``; each token keeps its ``top_k`` experts, their
   probabilities renormalised to sum to 1 (so top_k 1 is exactly the winning expert's output);
2. dispatch by sorting: the ``T * top_k`` token-slots are sorted by expert id (a stable argsort),
   so each expert's tokens are one contiguous segment, gathered once;
3. each expert runs its SwiGLU as plain batched matmuls on its segment (no capacity limit and no
   dropped token: a segment is as long as the router makes it);
4. combine: the outputs, weighted by the slots' probabilities, are added back to their tokens.

The load-balancing loss is Switch/GShard's ``E * sum_e f_e * P_e`` (``f_e``: the fraction of
token-slots routed to expert e, ``P_e``: the mean router probability of e), times
``router_aux_loss_coef``, added to the LM loss. The decoder layers are an ``nn.ModuleList``
named ``layers``, so ``memory.layers.decoder_layers`` and every technique find them. A job-side
compute module (torch at module level), imported only below the family's entry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from hopperlab.cuda.host_readback import HostReadback
from hopperlab.memory.recompute_elementwise import RecomputeInBackward
from hopperlab.workloads.finetune.torch.moe_config import MoeConfig


@dataclass
class MoeOutput:
    """What the training loop reads (``.loss``) and what tests look at."""

    loss: torch.Tensor | None
    logits: torch.Tensor
    aux_loss: torch.Tensor


class RMSNorm(nn.Module):
    """``F.rms_norm`` (fused where torch has a kernel: saves its input and the rstd only)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight.to(x.dtype), self.eps)


def rope_tables(seq: int, head_dim: int, theta: float, device: Any,
                dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [seq, head_dim / 2] of rotary position embedding."""
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32)
                          / head_dim)
    angles = torch.outer(torch.arange(seq, device=device, dtype=torch.float32), inv)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the channel pairs (even, odd) of ``x`` [batch, heads, seq, head_dim]."""
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


class Attention(nn.Module):
    def __init__(self, c: MoeConfig) -> None:
        super().__init__()
        self.heads, self.theta = c.num_attention_heads, c.rope_theta
        # three projections, not one fused: v, saved by attention, is then a view of its own
        # [T, hidden] output and does not keep a 3 x wider fused output alive
        self.q_proj, self.k_proj, self.v_proj = (
            nn.Linear(c.hidden_size, c.hidden_size, bias=False) for _ in range(3))
        self.o_proj = nn.Linear(c.hidden_size, c.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        b, t, h = x.shape
        q, k, v = (proj(x).view(b, t, self.heads, -1).transpose(1, 2)
                   for proj in (self.q_proj, self.k_proj, self.v_proj))
        cos, sin = rope_tables(t, q.shape[-1], self.theta, x.device, q.dtype)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if mask is None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # padded rows: causal and padding mask together (no flash kernel then)
            causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
            keep = causal & mask[:, None, None, :].bool()
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, h))


def _silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up


class SwiGLU(nn.Module):
    """One expert (or a dense FFN): ``down(silu(gate(x)) * up(x))``. ``silu(gate) * up`` saves
    only ``gate`` and ``up`` and is recomputed in backward (as Megatron's fused SwiGLU does):
    one [tokens, ffn] tensor less per expert than autograd's stock graph, no matmul redone."""

    def __init__(self, hidden: int, ffn: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, ffn, bias=False)
        self.up_proj = nn.Linear(hidden, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_proj(x), self.up_proj(x)
        if torch.is_grad_enabled():
            return self.down_proj(RecomputeInBackward.apply(_silu_mul, gate, up))
        return self.down_proj(_silu_mul(gate, up))


class MoeFFN(nn.Module):
    """Router + experts, tokens dispatched by sorting token-slots by expert (module docstring)."""

    def __init__(self, c: MoeConfig) -> None:
        super().__init__()
        self.num_experts, self.top_k = c.num_experts, c.top_k
        self.router = nn.Linear(c.hidden_size, c.num_experts, bias=False)
        self.experts = nn.ModuleList(SwiGLU(c.hidden_size, c.intermediate_size)
                                     for _ in range(c.num_experts))
        self.readback = HostReadback(c.num_experts)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(router probabilities [T, E] float32, top-k weights [T, k], top-k expert ids [T, k])."""
        probs = torch.softmax(self.router(x).float(), dim=-1)
        weights, experts = probs.topk(self.top_k, dim=-1)
        return probs, weights / weights.sum(dim=-1, keepdim=True), experts

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(output [T, hidden], load-balancing loss) of tokens ``x`` [T, hidden]."""
        probs, weights, experts = self.route(x)
        slot_expert = experts.reshape(-1)                       # [T * k]
        order = torch.argsort(slot_expert, stable=True)         # slots grouped by expert
        token = order // self.top_k                             # the token of each sorted slot
        counts = expert_counts(slot_expert, self.num_experts)
        # one host sync per layer: the segment lengths (Megatron's grouped GEMM needs them too),
        # read past the copy engine, which activation offload keeps busy (cuda/host_readback.py)
        sizes = self.readback.read(counts)
        segments = x[token].split(sizes)
        out = torch.cat([expert(seg) for expert, seg in zip(self.experts, segments)])
        out = out * weights.reshape(-1)[order].unsqueeze(-1).to(out.dtype)
        y = torch.zeros_like(x).index_add_(0, token, out.to(x.dtype))
        return y, self.balance_loss(probs, counts)

    def balance_loss(self, probs: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Switch/GShard: ``E * sum_e f_e * P_e``; 1 when the load is even (its minimum).
        ``counts``: token-slots per expert (``expert_counts``)."""
        f = counts.float() / counts.sum()
        return self.num_experts * (f * probs.mean(dim=0)).sum()


def expert_counts(slot_expert: torch.Tensor, num_experts: int) -> torch.Tensor:
    """Token-slots per expert, with no host synchronisation: ``torch.bincount`` on CUDA reads the
    largest id back to size its output (a device->host copy that, under activation offload,
    queues behind gigabytes of copies and stalls forward: docs/benchmarks/moe.md)."""
    counts = torch.zeros(num_experts, dtype=torch.int64, device=slot_expert.device)
    return counts.scatter_add_(0, slot_expert, torch.ones_like(slot_expert))


class MoeBlock(nn.Module):
    def __init__(self, c: MoeConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = MoeFFN(c)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """(hidden states, this layer's balance loss): the loss goes out as an output, so
        per-layer hooks (offload, checkpointing) see everything the layer computes."""
        x = x + self.self_attn(self.input_layernorm(x), mask)
        b, t, h = x.shape
        y, aux = self.mlp(self.post_attention_layernorm(x).reshape(b * t, h))
        return x + y.view(b, t, h), aux


class MoeForCausalLM(nn.Module):
    """Embedding, ``layers``, final norm, LM head; ``forward(input_ids, labels=...)`` returns
    a ``MoeOutput`` whose loss is the next-token cross entropy plus the weighted balance loss."""

    def __init__(self, config: MoeConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(MoeBlock(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        #: the loss in chunks of this many tokens (None: whole), see ``use_chunked_loss``
        self.loss_chunk_tokens: int | None = None
        self.reset_parameters()

    def use_chunked_loss(self, chunk_tokens: int) -> str:
        """Compute the training loss (final norm, head, cross entropy) in checkpointed chunks
        of ``chunk_tokens``: the [tokens, vocab] logits (and their float32 copy) never exist
        whole; only the last layer's output is kept. The family's ``loss_chunk_tokens``."""
        if isinstance(chunk_tokens, bool) or not isinstance(chunk_tokens, int) or chunk_tokens < 1:
            raise ValueError(f"loss_chunk_tokens: expected a whole number of at least 1, got "
                             f"{chunk_tokens!r}")
        self.loss_chunk_tokens = chunk_tokens
        return f"{type(self).__name__}: norm, head and loss in checkpointed chunks of " \
               f"{chunk_tokens} tokens"

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Normal(0, initializer_range) matrices, unit norm weights (as Llama initialises)."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                module.weight.normal_(0.0, self.config.initializer_range)
            elif isinstance(module, RMSNorm):
                module.weight.fill_(1.0)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embed_tokens

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, **_: Any) -> MoeOutput:
        """Extra keywords (``use_cache``) are accepted and ignored, as HF models take them."""
        x = self.embed_tokens(input_ids)
        aux = x.new_zeros((), dtype=torch.float32)
        for layer in self.layers:
            x, layer_aux = layer(x, attention_mask)
            aux = aux + layer_aux
        aux = aux / len(self.layers)
        if labels is not None and self.loss_chunk_tokens is not None:
            loss = chunked_lm_loss(x, labels, self._token_loss_sum, self.loss_chunk_tokens)
            return MoeOutput(loss=loss + self.config.router_aux_loss_coef * aux, logits=None,
                             aux_loss=aux)
        logits = self.lm_head(self.norm(x))
        loss = None
        if labels is not None:
            loss = lm_loss(logits, labels) + self.config.router_aux_loss_coef * aux
        return MoeOutput(loss=loss, logits=logits, aux_loss=aux)

    def _token_loss_sum(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(self.norm(hidden))
        return F.cross_entropy(logits.float(), targets, ignore_index=-100, reduction="sum")

    def inactive_parameters(self) -> int:
        """Expert parameters a token does not use: (num_experts - top_k) experts per layer."""
        per_expert = sum(p.numel() for p in self.layers[0].mlp.experts[0].parameters()) \
            if len(self.layers) else 0
        return (self.config.num_experts - self.config.top_k) * per_expert * len(self.layers)


def lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Next-token cross entropy in float32 (label -100 ignored, as transformers does). The
    labels are shifted, not the logits: slicing the logits would copy [T, vocab] once more."""
    return F.cross_entropy(logits.flatten(0, 1).float(), next_token_targets(labels),
                           ignore_index=-100)


def next_token_targets(labels: torch.Tensor) -> torch.Tensor:
    """Each position's target, flat: the next label, -100 (ignored) after the last."""
    ignore = labels.new_full((labels.shape[0], 1), -100)
    return torch.cat((labels[:, 1:], ignore), dim=1).reshape(-1)


def chunked_lm_loss(hidden: torch.Tensor, labels: torch.Tensor,
                    loss_sum: Any, chunk_tokens: int) -> torch.Tensor:
    """``lm_loss`` of the head over ``hidden`` [batch, seq, hidden], chunk by chunk of tokens,
    each chunk under non-reentrant checkpointing (recomputed in backward): the same mean over
    the tokens that have a label, to float rounding."""
    targets = next_token_targets(labels)
    flat = hidden.reshape(-1, hidden.shape[-1])
    total = hidden.new_zeros((), dtype=torch.float32)
    for start in range(0, flat.shape[0], chunk_tokens):
        stop = start + chunk_tokens
        total = total + checkpoint(loss_sum, flat[start:stop], targets[start:stop],
                                   use_reentrant=False)
    return total / (targets != -100).sum().clamp(min=1)


def build(config: MoeConfig, device: Any, dtype: torch.dtype, seed: int) -> MoeForCausalLM:
    """The model with random weights, created directly on ``device`` in ``dtype``."""
    torch.manual_seed(seed)
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            return MoeForCausalLM(config)
    finally:
        torch.set_default_dtype(old)
