"""A Llama decoder split over the run's ranks by tensor parallelism, for long-context serving.

Our own small layer rather than transformers' ``tp_plan``: it must run the same on the CPU
machines (torch 2.13, gloo) and the GPU machine (torch 2.11, NCCL), and we time the all-reduce
ourselves. Column-parallel projections (q, k, v, gate, up) keep a slice of the heads or of the
FFN on each rank; row-parallel ones (o, down) give partial sums that one all-reduce per block
half adds up. Embedding, norms and the LM head are replicated. Weights are random, drawn from a
seed per full matrix, so that any world size computes the same model (and the same logits).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class Shape:
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    layers: int

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


class AllReduceTimer:
    """Sums the time spent in all-reduces (CUDA events on a GPU, the wall clock on the CPU)."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.events: list[tuple[Any, Any]] = []
        self.cpu_s = 0.0
        self.calls = 0

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if not dist.is_initialized() or dist.get_world_size() == 1:
            return x
        self.calls += 1
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dist.all_reduce(x)
            end.record()
            self.events.append((start, end))
        else:
            t0 = time.perf_counter()
            dist.all_reduce(x)
            self.cpu_s += time.perf_counter() - t0
        return x

    def total_s(self) -> float:
        """Seconds spent so far (synchronises the GPU), then start again."""
        if self.cuda:
            torch.cuda.synchronize()
            self.cpu_s += sum(s.elapsed_time(e) for s, e in self.events) / 1e3
            self.events = []
        out, self.cpu_s = self.cpu_s, 0.0
        return out


def _rank_world() -> tuple[int, int]:
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def full_weight(seed: int, tag: int, rows: int, cols: int, dtype: Any, device: Any) -> torch.Tensor:
    """The full matrix ``tag`` of the model, N(0, 0.02) from ``seed`` (same on every rank)."""
    g = torch.Generator(device=device).manual_seed(seed * 100_003 + tag)
    return (torch.randn(rows, cols, generator=g, device=device, dtype=torch.float32) * 0.02).to(dtype)


def rope(x: torch.Tensor, start: int) -> torch.Tensor:
    """Rotary embedding of ``x`` [batch, heads, seq, head_dim] at positions start.."""
    seq, dim = x.shape[-2], x.shape[-1]
    inv = 1.0 / (10000 ** (torch.arange(0, dim, 2, device=x.device, dtype=torch.float32) / dim))
    pos = torch.arange(start, start + seq, device=x.device, dtype=torch.float32)
    ang = torch.outer(pos, inv)
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


def rms_norm(x: torch.Tensor) -> torch.Tensor:
    var = x.float().pow(2).mean(-1, keepdim=True)
    return (x.float() * torch.rsqrt(var + 1e-5)).to(x.dtype)


class TPBlock(nn.Module):
    """One decoder block; this rank's slice of the heads and of the FFN."""

    def __init__(self, s: Shape, index: int, seed: int, dtype: Any, device: Any,
                 timer: AllReduceTimer) -> None:
        super().__init__()
        rank, world = _rank_world()
        if s.heads % world or s.kv_heads % world or s.ffn % world:
            raise ValueError(f"heads {s.heads}, kv heads {s.kv_heads} and ffn {s.ffn} must "
                             f"divide by the world size {world}")
        d, hq, hk, f = s.head_dim, s.heads // world, s.kv_heads // world, s.ffn // world
        self.hq, self.hk, self.d, self.timer = hq, hk, d, timer
        base = index * 16

        def rows(tag: int, n_rows: int, part: int) -> torch.Tensor:  # column-parallel slice
            w = full_weight(seed, base + tag, n_rows, s.hidden, dtype, device)
            return w[rank * part:(rank + 1) * part].contiguous()

        def cols(tag: int, n_cols: int, part: int) -> torch.Tensor:  # row-parallel slice
            w = full_weight(seed, base + tag, s.hidden, n_cols, dtype, device)
            return w[:, rank * part:(rank + 1) * part].contiguous()

        self.q = rows(0, s.heads * d, hq * d)
        self.k = rows(1, s.kv_heads * d, hk * d)
        self.v = rows(2, s.kv_heads * d, hk * d)
        self.o = cols(3, s.heads * d, hq * d)
        self.gate, self.up = rows(4, s.ffn, f), rows(5, s.ffn, f)
        self.down = cols(6, s.ffn, f)

    def forward(self, x: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor], pos: int
                ) -> torch.Tensor:
        b, t, _ = x.shape
        h = rms_norm(x)
        q = (h @ self.q.T).view(b, t, self.hq, self.d).transpose(1, 2)
        k = (h @ self.k.T).view(b, t, self.hk, self.d).transpose(1, 2)
        v = (h @ self.v.T).view(b, t, self.hk, self.d).transpose(1, 2)
        q, k = rope(q, pos), rope(k, pos)
        kc, vc = cache
        kc[:, :, pos:pos + t], vc[:, :, pos:pos + t] = k, v
        keys, values = kc[:, :, :pos + t], vc[:, :, :pos + t]
        # grouped-query attention: each kv head serves hq / hk query heads
        a = F.scaled_dot_product_attention(q, keys, values, is_causal=t > 1,
                                           enable_gqa=self.hk != self.hq)
        x = x + self.timer.all_reduce(a.transpose(1, 2).reshape(b, t, -1) @ self.o.T)
        h = rms_norm(x)
        return x + self.timer.all_reduce((F.silu(h @ self.gate.T) * (h @ self.up.T)) @ self.down.T)


class TPDecoder(nn.Module):
    def __init__(self, s: Shape, seed: int, dtype: Any, device: Any, cuda: bool) -> None:
        super().__init__()
        self.shape, self.dtype, self.device = s, dtype, device
        self.timer = AllReduceTimer(cuda)
        self.embed = full_weight(seed, 10**6, s.vocab, s.hidden, dtype, device)
        self.blocks = [TPBlock(s, i, seed, dtype, device, self.timer) for i in range(s.layers)]
        self.head = full_weight(seed, 10**6 + 1, s.vocab, s.hidden, dtype, device)

    def new_cache(self, batch: int, max_len: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        blk = self.blocks[0]
        shape = (batch, blk.hk, max_len, blk.d)
        return [(torch.empty(shape, dtype=self.dtype, device=self.device),
                 torch.empty(shape, dtype=self.dtype, device=self.device)) for _ in self.blocks]

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor, cache: list, pos: int,
                last_only: bool = True) -> torch.Tensor:
        x = self.embed[tokens]
        for blk, c in zip(self.blocks, cache):
            x = blk(x, c, pos)
        x = rms_norm(x[:, -1:] if last_only else x)
        return (x @ self.head.T).float()


def build(shape: Shape, seed: int, dtype: Any, device: Any, cuda: bool) -> TPDecoder:
    return TPDecoder(shape, seed, dtype, device, cuda)


def serve(model: TPDecoder, prompts: torch.Tensor, new_tokens: int, sync: Any
          ) -> dict[str, float]:
    """One request batch: prefill the prompts, then ``new_tokens`` greedy decode steps.
    Times on the wall clock after ``sync()``; returns ttft, decode and all-reduce seconds."""
    b, t = prompts.shape
    cache = model.new_cache(b, t + new_tokens)
    model.timer.total_s()
    sync()
    t0 = time.perf_counter()
    nxt = model(prompts, cache, 0).argmax(-1)
    sync()
    ttft = time.perf_counter() - t0
    ar_prefill = model.timer.total_s()
    t1 = time.perf_counter()
    for i in range(new_tokens - 1):
        nxt = model(nxt, cache, t + i).argmax(-1)
    sync()
    decode = time.perf_counter() - t1
    return {"ttft_s": ttft, "decode_s": decode, "latency_s": ttft + decode,
            "allreduce_s": ar_prefill + model.timer.total_s()}
