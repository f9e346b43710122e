"""Our own prefill and greedy decode over the model's forward with ``past_key_values``.

Not ``model.generate``: the techniques here must decide where the cache lives between and during
calls (a cache whose layers are still arriving, a cache rebuilt from host memory), and time the
first token on its own. Greedy decoding makes the tokens a pure function of the cache and the
inputs, which is what the correctness tests compare across policies.
"""

from __future__ import annotations

from typing import Any

from hopperlab.cuda.nvtx import nvtx_range, pipeline


def forward_last(model: Any, ids: Any, cache: Any) -> Any:
    """Run ``ids`` [batch, tokens] through the model on top of ``cache`` (extended in place);
    return the logits of the last position [batch, vocab]. Only the last position goes through
    the LM head (``logits_to_keep=1``): a 16k-token prefill would otherwise spend gigabytes on
    logits nobody reads."""
    out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
    return out.logits[:, -1, :]


def prefill(model: Any, ids: Any, cache: Any) -> Any:
    """The new tokens through the model; returns the first generated token [batch, 1]."""
    return prefill_logits(model, ids, cache).argmax(dim=-1, keepdim=True)


def prefill_logits(model: Any, ids: Any, cache: Any) -> Any:
    """``prefill``'s logits of the last position [batch, vocab], before the greedy choice."""
    with nvtx_range(pipeline("prefill")):
        return forward_last(model, ids, cache)


def logits_digest(logits: Any) -> str:
    """A digest of the first token's logits (read after the step's synchronisation): equal bit
    for bit where a reloaded cache is the saved one (issue 47), whereas the greedy tokens after
    it can differ between two runs of the same cache on a GPU (a decode kernel that is not
    repeatable, docs/benchmarks/history/inference-2026-11.md)."""
    import hashlib  # noqa: PLC0415

    return hashlib.sha256(logits.detach().float().cpu().numpy().tobytes()).hexdigest()[:16]


def decode(model: Any, first: Any, cache: Any, steps: int) -> Any:
    """Greedy decoding: ``first`` [batch, 1] and ``steps - 1`` more tokens -> [batch, steps]."""
    import torch  # noqa: PLC0415

    tokens = [first]
    token = first
    with nvtx_range(pipeline("decode")):
        for _ in range(steps - 1):
            token = forward_last(model, token, cache).argmax(dim=-1, keepdim=True)
            tokens.append(token)
    return torch.cat(tokens, dim=1)
