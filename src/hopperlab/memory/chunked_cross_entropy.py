"""A causal LM's loss computed in chunks of tokens, with its gradient, in forward: the float32
logits over the whole vocabulary never exist at once.

Why: transformers' loss upcasts the logits of every token to float32 and saves them; for
Llama-2-7B at 4 x 2048 tokens those 2-3 GiB are the step's memory peak. ``LinearCrossEntropy``
walks the tokens in chunks: each chunk's logits, loss and the gradient back through the head, so
forward keeps only the hidden states' gradient; nothing is recomputed. The math is
transformers' ``ForCausalLMLoss`` (shifted labels, ``-100`` ignored, mean or
``num_items_in_batch``), equal to float32 rounding. ``apply(model, chunk_tokens)`` gives a
``...ForCausalLM`` (also inside peft) that training forward; generation and evaluation keep the
model's own. In detail: docs/memory.md ("The chunked loss").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

IGNORE_INDEX = -100


class LinearCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of ``hidden @ weight.T`` against ``targets``, chunk by chunk.

    ``hidden``: (tokens, d); ``weight``: (vocabulary, d); ``targets``: (tokens,), already
    shifted, ``IGNORE_INDEX`` for tokens without a target; ``divisor``: what the summed loss is
    divided by (None: the number of valid targets). Products run in ``compute_dtype`` (the
    autocast dtype under autocast), the softmax in float32.
    """

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                chunk_tokens: int, compute_dtype: torch.dtype,
                divisor: torch.Tensor | None) -> torch.Tensor:
        valid = targets != IGNORE_INDEX
        n = valid.sum().to(torch.float32) if divisor is None else \
            torch.as_tensor(divisor, dtype=torch.float32, device=hidden.device)
        w = weight.to(compute_dtype)
        need_hidden, need_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) \
            if need_weight else None
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        with torch.autocast(hidden.device.type, enabled=False):
            for start in range(0, hidden.shape[0], chunk_tokens):
                end = min(start + chunk_tokens, hidden.shape[0])
                h = hidden[start:end].to(compute_dtype)
                mask = valid[start:end]
                target = targets[start:end].clamp(min=0).unsqueeze(1)
                logits = (h @ w.t()).float()
                lse = torch.logsumexp(logits, dim=1)
                picked = logits.gather(1, target).squeeze(1)
                total += torch.where(mask, lse - picked, 0.0).sum()
                if grad_hidden is None and grad_weight is None:
                    continue
                # d(mean loss)/d(logits) = (softmax - onehot) / n on valid rows, 0 elsewhere
                probs = logits.sub_(lse.unsqueeze(1)).exp_()
                probs.scatter_add_(1, target, torch.full_like(picked, -1.0).unsqueeze(1))
                probs.mul_((mask.to(torch.float32) / n).unsqueeze(1))
                grad_logits = probs.to(compute_dtype)
                del probs, logits
                if grad_hidden is not None:
                    grad_hidden[start:end] = (grad_logits @ w).to(hidden.dtype)
                if grad_weight is not None:
                    grad_weight += (grad_logits.t() @ h).float()
        ctx.save_for_backward(grad_hidden, None if grad_weight is None
                              else grad_weight.to(weight.dtype))
        return total / n

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor) -> tuple[Any, ...]:
        grad_hidden, grad_weight = ctx.saved_tensors
        gh = None if grad_hidden is None else grad_hidden * grad_loss.to(grad_hidden.dtype)
        gw = None if grad_weight is None else grad_weight * grad_loss.to(grad_weight.dtype)
        return gh, gw, None, None, None, None


def causal_lm_loss(hidden: torch.Tensor, head: nn.Linear, labels: torch.Tensor, *,
                   chunk_tokens: int, num_items_in_batch: Any = None) -> torch.Tensor:
    """transformers' causal-LM loss of ``head(hidden)`` against ``labels`` (shifted by one here),
    without the whole batch's logits (module docstring)."""
    if head.bias is not None:
        raise ValueError("chunked cross-entropy: the head has a bias; only bias-free heads "
                         "(Llama's) are restated here")
    targets = nn.functional.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:]
    device_type = hidden.device.type
    compute_dtype = torch.get_autocast_dtype(device_type) \
        if torch.is_autocast_enabled(device_type) else head.weight.dtype
    flat = hidden.reshape(-1, hidden.shape[-1])
    return LinearCrossEntropy.apply(flat, head.weight, targets.reshape(-1).to(flat.device),
                                    chunk_tokens, compute_dtype, num_items_in_batch)


class _ChunkedLossForward:
    """The causal LM's forward with the chunked loss (bound to one model instance)."""

    def __init__(self, lm: nn.Module, chunk_tokens: int):
        self.lm = lm
        self.chunk_tokens = chunk_tokens
        self.original = type(lm).forward

    def __call__(self, input_ids: Any = None, attention_mask: Any = None, position_ids: Any = None,
                 past_key_values: Any = None, inputs_embeds: Any = None, labels: Any = None,
                 use_cache: Any = None, logits_to_keep: Any = 0, **kwargs: Any) -> Any:
        lm = self.lm
        if labels is None or not torch.is_grad_enabled():
            return self.original(lm, input_ids=input_ids, attention_mask=attention_mask,
                                 position_ids=position_ids, past_key_values=past_key_values,
                                 inputs_embeds=inputs_embeds, labels=labels, use_cache=use_cache,
                                 logits_to_keep=logits_to_keep, **kwargs)
        from transformers.modeling_outputs import CausalLMOutputWithPast

        items = kwargs.pop("num_items_in_batch", None)
        outputs = lm.model(input_ids=input_ids, attention_mask=attention_mask,
                           position_ids=position_ids, past_key_values=past_key_values,
                           inputs_embeds=inputs_embeds, use_cache=use_cache, **kwargs)
        loss = causal_lm_loss(outputs.last_hidden_state, lm.lm_head, labels,
                              chunk_tokens=self.chunk_tokens, num_items_in_batch=items)
        return CausalLMOutputWithPast(loss=loss, logits=None,
                                      past_key_values=outputs.past_key_values,
                                      hidden_states=outputs.hidden_states,
                                      attentions=outputs.attentions)


@dataclass
class ChunkedLoss:
    """Handle on the changed model; ``remove()`` gives it its own forward back."""

    model_class: str
    chunk_tokens: int
    _lm: nn.Module | None

    def remove(self) -> None:
        if self._lm is not None:
            del self._lm.forward
            self._lm = None

    def describe(self) -> str:
        return f"{self.model_class}, chunks of {self.chunk_tokens} tokens"


def _causal_lm(model: nn.Module) -> nn.Module:
    """The ``...ForCausalLM`` module of ``model`` (itself, or the one a peft model wraps)."""
    for module in model.modules():
        # own children, not attributes forwarded by a wrapper (peft's PeftModelForCausalLM)
        if type(module).__name__.endswith("ForCausalLM") and "lm_head" in module._modules \
                and "model" in module._modules:
            return module
    raise ValueError(f"loss_chunk_tokens: {type(model).__name__} contains no ...ForCausalLM "
                     f"module with lm_head and model (a transformers causal LM)")


def apply(model: nn.Module, chunk_tokens: int) -> ChunkedLoss:
    """Make ``model``'s causal LM compute its training loss in chunks (module docstring).

    Raises ``ValueError`` for a chunk below 1, a model without a transformers causal LM, a head
    that is not a plain bias-free ``nn.Linear`` (an adapter or FP8 layer on the head), or a
    model already changed.
    """
    if isinstance(chunk_tokens, bool) or not isinstance(chunk_tokens, int) or chunk_tokens < 1:
        raise ValueError(f"loss_chunk_tokens: expected a whole number of at least 1, got "
                         f"{chunk_tokens!r}")
    lm = _causal_lm(model)
    head = lm.lm_head
    if type(head) is not nn.Linear or head.bias is not None:
        raise ValueError(f"loss_chunk_tokens: {type(lm).__name__}.lm_head is a "
                         f"{type(head).__name__}{' with a bias' if head.bias is not None else ''};"
                         f" the chunked loss restates a plain bias-free nn.Linear head only")
    if isinstance(lm.__dict__.get("forward"), _ChunkedLossForward):
        raise ValueError(f"{type(lm).__name__} already computes its loss in chunks")
    lm.forward = _ChunkedLossForward(lm, chunk_tokens)
    return ChunkedLoss(model_class=type(lm).__name__, chunk_tokens=chunk_tokens, _lm=lm)
