"""A multi-round dialogue server in miniature: the workload of the kv-cache study.

Sessions open with a context, then take rounds (a user turn, a greedy reply) round-robin, so
each session's cache sits idle while the others are served: the policy decides what happens to
it then. Per round it records time to first token, decode rate and, for a reload, bytes and copy
time. Seeded random tokens: the system is measured, not the text. Details:
docs/benchmarks/inference.md.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from hopperlab.workloads.inference.generation import decode, logits_digest, prefill_logits
from hopperlab.workloads.inference.kv_cache import cache_tokens, new_cache
from hopperlab.workloads.inference.kv_policies import KvCachePolicy
from hopperlab.workloads.inference.runtime import Runtime

#: token ids below this are left out of generated turns (special tokens of small vocabularies)
FIRST_PLAIN_TOKEN = 4


@dataclass
class RoundRecord:
    session: int
    round: int
    how: str  # "fresh", "resident", "reload", "recompute"
    cached_tokens: int  # tokens in the cache when the turn's prefill starts
    prefill_tokens: int
    ttft_s: float
    decode_s: float
    decode_tokens: int
    reload_bytes: int = 0
    reload_s: float = float("nan")
    reply: list[int] = field(default_factory=list)
    #: the digest of the first token's logits (``generation.logits_digest``), compared (issue 47)
    first_logits: str = ""

    @property
    def resumed(self) -> bool:
        return self.round > 0


@dataclass
class Conversation:
    session: int
    context: Any  # [1, context_tokens] on the host
    turns: list[Any]  # each [1, turn_tokens] on the host
    tokens: list[Any] = field(default_factory=list)  # every token so far, on the host
    pending: Any = None  # the last reply token, not yet in the cache


def make_conversations(torch: Any, n_sessions: int, rounds: int, context_tokens: int,
                       turn_tokens: int, vocab_size: int, seed: int,
                       first_session: int = 0) -> list[Conversation]:
    if vocab_size <= FIRST_PLAIN_TOKEN:
        raise ValueError(f"vocabulary of {vocab_size} tokens is too small")
    convs = []
    for s in range(first_session, first_session + n_sessions):
        g = torch.Generator().manual_seed(seed * 100_003 + s)
        ctx = torch.randint(FIRST_PLAIN_TOKEN, vocab_size, (1, context_tokens), generator=g)
        turns = [torch.randint(FIRST_PLAIN_TOKEN, vocab_size, (1, turn_tokens), generator=g)
                 for _ in range(rounds)]
        convs.append(Conversation(session=s, context=ctx, turns=turns, tokens=[ctx]))
    return convs


class Dialogue:
    def __init__(self, model: Any, rt: Runtime, policy: KvCachePolicy, reply_tokens: int) -> None:
        self.model = model
        self.rt = rt
        self.policy = policy
        self.reply_tokens = reply_tokens
        self.gpu_cache_bytes_peak = 0
        self.host_bytes_peak = 0

    def round(self, conv: Conversation, r: int) -> RoundRecord:
        torch, rt = self.rt.torch, self.rt
        turn = conv.turns[r]
        rt.sync_compute()
        t0 = time.perf_counter()
        resumed = self.policy.resume(conv.session, has_history=r > 0)
        if resumed.cache is None:
            cache = new_cache()
            ids = torch.cat([*conv.tokens, turn], dim=1)
            how = "recompute" if resumed.recompute else "fresh"
        else:
            cache = resumed.cache
            ids = torch.cat([conv.pending, turn], dim=1)
            how = "reload" if resumed.reload is not None else "resident"
        cached = cache_tokens(cache)
        logits = prefill_logits(self.model, ids.to(rt.device, non_blocking=False), cache)
        first = logits.argmax(dim=-1, keepdim=True)
        first_host = first.cpu()
        ttft = time.perf_counter() - t0
        reload_bytes, reload_s = 0, float("nan")
        if resumed.reload is not None:
            resumed.reload.finish(rt)
            reload_bytes, reload_s = resumed.reload.nbytes, resumed.reload.copy_seconds()
        t1 = time.perf_counter()
        reply = decode(self.model, first, cache, self.reply_tokens).cpu()
        decode_s = time.perf_counter() - t1
        del first_host
        conv.tokens += [turn, reply]
        conv.pending = reply[:, -1:]
        self.policy.park(conv.session, cache)
        self.gpu_cache_bytes_peak = max(self.gpu_cache_bytes_peak, self.policy.gpu_cache_bytes())
        self.host_bytes_peak = max(self.host_bytes_peak, self.policy.host_bytes())
        return RoundRecord(session=conv.session, round=r, how=how, cached_tokens=cached,
                           prefill_tokens=int(ids.shape[1]), ttft_s=ttft, decode_s=decode_s,
                           decode_tokens=self.reply_tokens - 1, reload_bytes=reload_bytes,
                           reload_s=reload_s, reply=reply[0].tolist(),
                           first_logits=logits_digest(logits))

    def run(self, convs: list[Conversation], rounds: int,
            on_round: Any = None) -> list[RoundRecord]:
        """Every conversation for ``rounds`` rounds, round-robin; ``on_round(rec)`` after each."""
        records = []
        for r in range(rounds):
            for conv in convs:
                rec = self.round(conv, r)
                records.append(rec)
                if on_round is not None:
                    on_round(rec)
        for conv in convs:
            self.policy.end(conv.session)
        return records
