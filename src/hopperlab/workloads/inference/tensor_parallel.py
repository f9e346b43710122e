"""A Llama decoder split over the run's ranks by tensor parallelism, served the way fast servers
serve it: fused projections, a static KV cache, and a decode step that replays as one CUDA graph.

Our own small layer rather than transformers' ``tp_plan``: it must run the same on the CPU
machines (torch 2.13, gloo) and the GPU machine (torch 2.11, NCCL). Column-parallel projections
keep a slice of the heads (q, k and v fused into one matrix) or of the FFN (gate and up fused)
on each rank; row-parallel ones (o, down) give partial sums that one all-reduce per block half
adds up. Embedding, norms and the LM head are replicated. Weights are random, drawn from a seed
per full matrix, so that any world size computes the same model (and the same logits).

Why each piece (docs/benchmarks/distributed.md has the measurements):
- decode reads every weight once per token; anything else the GPU does per token (launching
  ~20 kernels per layer from Python, copying the cache for grouped-query attention) is overhead
  on that floor. The decode step therefore has static shapes (the position is a device tensor,
  attention runs over the whole preallocated cache with positions past the current one masked),
  so that it can be captured once and replayed as a single CUDA graph, all-reduces included.
- grouped-query attention in decode reads each key/value head once for all the query heads it
  serves (a batched matmul over a [kv heads, group] view), never an expanded copy of the cache.
- prefill is compute bound: fused projections and flash attention (keys and values expanded
  for the one layer at hand, which is small next to the prompt's activations).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F


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

    @property
    def layer_params(self) -> int:
        """Weights of one decoder block (attention and FFN projections; norms have none here)."""
        d = self.head_dim
        return self.hidden * d * (2 * self.heads + 2 * self.kv_heads) + 3 * self.hidden * self.ffn


class AllReduce:
    """Sums partial results over the ranks; counts the calls and, while ``timed`` (eager decode
    only: events cannot be recorded inside a graph), the time from the call until the sum is
    there, which is the collective plus the wait for the slowest peer."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.timed = False
        self.calls = 0
        self.events: list[tuple[Any, Any]] = []
        self.cpu_s = 0.0

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if not dist.is_initialized() or dist.get_world_size() == 1:
            return x
        self.calls += 1
        if not self.timed:
            dist.all_reduce(x)
        elif self.cuda:
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

    def take_timed_s(self) -> float:
        """Seconds the timed calls took (synchronises the GPU), then start again."""
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


def _wide(x: torch.Tensor) -> torch.Tensor:
    """``x`` in at least float32 (float64 stays float64: the CPU tests compare at float64)."""
    return x if x.dtype == torch.float64 else x.float()


def rms_norm(x: torch.Tensor) -> torch.Tensor:
    w = _wide(x)
    return (w * torch.rsqrt(w.pow(2).mean(-1, keepdim=True) + 1e-5)).to(x.dtype)


def rope_tables(positions: int, dim: int, dtype: Any, device: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotary angles [positions, dim / 2], computed once per server."""
    wide = torch.float64 if dtype == torch.float64 else torch.float32
    inv = 1.0 / (10000 ** (torch.arange(0, dim, 2, device=device, dtype=wide) / dim))
    ang = torch.outer(torch.arange(positions, device=device, dtype=wide), inv)
    return ang.cos().to(dtype), ang.sin().to(dtype)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of ``x`` [batch, heads, seq, head_dim] with the angles of its positions
    (``cos``/``sin`` [seq, head_dim / 2]); pairs are (0, 1), (2, 3), ..."""
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


class KVCache:
    """Keys and values of every layer for ``batch`` sequences of up to ``max_len`` tokens,
    allocated once (zeros: attention multiplies the masked tail by 0, and 0 x NaN is NaN)."""

    def __init__(self, layers: int, batch: int, kv_heads: int, max_len: int, head_dim: int,
                 dtype: Any, device: Any) -> None:
        shape = (batch, kv_heads, max_len, head_dim)
        self.max_len = max_len
        self.layers = [(torch.zeros(shape, dtype=dtype, device=device),
                        torch.zeros(shape, dtype=dtype, device=device)) for _ in range(layers)]

    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in self.layers)


class TPBlock:
    """One decoder block; this rank's slice of the heads and of the FFN."""

    def __init__(self, s: Shape, index: int, seed: int, dtype: Any, device: Any,
                 reduce: AllReduce) -> None:
        rank, world = _rank_world()
        if s.heads % world or s.kv_heads % world or s.ffn % world:
            raise ValueError(f"heads {s.heads}, kv heads {s.kv_heads} and ffn {s.ffn} must "
                             f"divide by the world size {world}")
        d, hq, hk, f = s.head_dim, s.heads // world, s.kv_heads // world, s.ffn // world
        self.hq, self.hk, self.d, self.reduce = hq, hk, d, reduce
        base = index * 16

        def rows(tag: int, n_rows: int, part: int) -> torch.Tensor:  # column-parallel slice
            return full_weight(seed, base + tag, n_rows, s.hidden, dtype, device)[
                rank * part:(rank + 1) * part]

        def cols(tag: int, n_cols: int, part: int) -> torch.Tensor:  # row-parallel slice
            w = full_weight(seed, base + tag, s.hidden, n_cols, dtype, device)
            return w[:, rank * part:(rank + 1) * part].contiguous()

        self.qkv = torch.cat([rows(0, s.heads * d, hq * d), rows(1, s.kv_heads * d, hk * d),
                              rows(2, s.kv_heads * d, hk * d)])
        self.o = cols(3, s.heads * d, hq * d)
        self.gate_up = torch.cat([rows(4, s.ffn, f), rows(5, s.ffn, f)])
        self.down = cols(6, s.ffn, f)

    def _qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b, t, _ = x.shape
        qkv = (rms_norm(x) @ self.qkv.T).view(b, t, self.hq + 2 * self.hk, self.d).transpose(1, 2)
        q, k, v = qkv.split((self.hq, self.hk, self.hk), dim=1)
        return rope(q, cos, sin), rope(k, cos, sin), v

    def _finish(self, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        x = x + self.reduce(attn.transpose(1, 2).reshape(b, t, -1) @ self.o.T)
        gate, up = (rms_norm(x) @ self.gate_up.T).chunk(2, dim=-1)
        return x + self.reduce((F.silu(gate) * up) @ self.down.T)

    def prefill(self, x: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor],
                cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        q, k, v = self._qkv(x, cos[:t], sin[:t])
        kc, vc = cache
        kc[:, :, :t], vc[:, :, :t] = k, v
        if self.hk != self.hq:  # flash attention wants as many kv heads as query heads
            k = k.repeat_interleave(self.hq // self.hk, dim=1)
            v = v.repeat_interleave(self.hq // self.hk, dim=1)
        return self._finish(x, F.scaled_dot_product_attention(q, k, v, is_causal=True))

    def decode(self, x: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor],
               cos: torch.Tensor, sin: torch.Tensor, pos: torch.Tensor,
               valid: torch.Tensor) -> torch.Tensor:
        """One token per sequence at position ``pos`` (a device tensor [1]); ``valid`` [max_len]
        marks the cache positions up to and including ``pos``."""
        b = x.shape[0]
        q, k, v = self._qkv(x, cos, sin)
        kc, vc = cache
        kc.index_copy_(2, pos, k)
        vc.index_copy_(2, pos, v)
        group = self.hq // self.hk
        qg = q.view(b, self.hk, group, self.d)  # each kv head with the query heads it serves
        scores = _wide(qg @ kc.transpose(-1, -2)) * self.d ** -0.5
        p = scores.masked_fill(~valid, float("-inf")).softmax(-1).to(x.dtype)
        return self._finish(x, (p @ vc).view(b, self.hq, 1, self.d))


class TPDecoder:
    """The model on this rank: replicated embedding, norms and head; a slice of every block."""

    def __init__(self, s: Shape, seed: int, dtype: Any, device: Any, cuda: bool) -> None:
        self.shape, self.dtype, self.device = s, dtype, torch.device(device)
        self.reduce = AllReduce(cuda)
        self.embed = full_weight(seed, 10**6, s.vocab, s.hidden, dtype, device)
        self.blocks = [TPBlock(s, i, seed, dtype, device, self.reduce) for i in range(s.layers)]
        self.head = full_weight(seed, 10**6 + 1, s.vocab, s.hidden, dtype, device)
        self._cos = self._sin = torch.empty(0, device=device)

    def weight_bytes(self) -> int:
        blocks = sum(t.nbytes for b in self.blocks for t in (b.qkv, b.o, b.gate_up, b.down))
        return blocks + self.embed.nbytes + self.head.nbytes

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        blk = self.blocks[0]
        self._tables(max_len)
        return KVCache(len(self.blocks), batch, blk.hk, max_len, blk.d, self.dtype, self.device)

    def _tables(self, positions: int) -> None:
        if self._cos.shape[0] < positions:
            self._cos, self._sin = rope_tables(positions, self.shape.head_dim, self.dtype,
                                               self.device)

    @torch.no_grad()
    def prefill(self, tokens: torch.Tensor, cache: KVCache, last_only: bool = True) -> torch.Tensor:
        """The prompts [batch, t] from position 0: fills the cache, returns float logits (of the
        last position only, or of every position)."""
        self._tables(tokens.shape[1])
        x = self.embed[tokens]
        for blk, c in zip(self.blocks, cache.layers):
            x = blk.prefill(x, c, self._cos, self._sin)
        x = rms_norm(x[:, -1:] if last_only else x)
        return _wide(x @ self.head.T)

    @torch.no_grad()
    def decode_step(self, tokens: torch.Tensor, cache: KVCache, pos: torch.Tensor) -> torch.Tensor:
        """One token [batch, 1] per sequence at the device position ``pos`` [1]: static shapes,
        no host synchronisation, so it can be captured in a CUDA graph. Returns float logits."""
        cos, sin = self._cos.index_select(0, pos), self._sin.index_select(0, pos)
        valid = torch.arange(cache.max_len, device=pos.device) <= pos
        x = self.embed[tokens]
        for blk, c in zip(self.blocks, cache.layers):
            x = blk.decode(x, c, cos, sin, pos, valid)
        return _wide(rms_norm(x) @ self.head.T)


def build(shape: Shape, seed: int, dtype: Any, device: Any, cuda: bool) -> TPDecoder:
    return TPDecoder(shape, seed, dtype, device, cuda)


class Server:
    """A batch of ``batch`` requests of up to ``max_len`` tokens: a static KV cache, and greedy
    decode as one CUDA graph per token (``graphs``), the next token and position kept on the
    device between replays. Without a GPU the same step runs eagerly."""

    def __init__(self, model: TPDecoder, batch: int, max_len: int, graphs: bool) -> None:
        self.model, self.batch = model, batch
        dev = model.device
        self.cache = model.new_cache(batch, max_len)
        self.token = torch.zeros(batch, 1, dtype=torch.long, device=dev)
        self.pos = torch.zeros(1, dtype=torch.long, device=dev)
        self.step_index = torch.zeros(1, dtype=torch.long, device=dev)
        self.out = torch.zeros(batch, max_len, dtype=torch.long, device=dev)
        self.graph: Any = None
        if graphs:
            self._capture()

    def _step(self) -> None:
        nxt = self.model.decode_step(self.token, self.cache, self.pos).argmax(-1)
        self.out.index_copy_(1, self.step_index, nxt)
        self.token.copy_(nxt)
        self.pos.add_(1)
        self.step_index.add_(1)

    def _capture(self) -> None:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up: lazy inits must not happen inside the capture
            for _ in range(2):
                self._step()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        self.pos.zero_()
        self.step_index.zero_()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self._step()
        torch.cuda.synchronize()

    def prefill(self, prompts: torch.Tensor) -> None:
        """Fills the cache with the prompts; their first generated token waits on the device."""
        self.token.copy_(self.model.prefill(prompts, self.cache).argmax(-1))
        self.pos.fill_(prompts.shape[1])
        self.step_index.zero_()

    def decode(self, steps: int) -> None:
        """``steps`` greedy tokens after the prefill's (queued, not waited for)."""
        for _ in range(steps):
            if self.graph is not None:
                self.graph.replay()
            else:
                self._step()

    def generated(self, steps: int) -> torch.Tensor:
        return self.out[:, :steps]

    def timed_decode_allreduce_s(self, steps: int) -> tuple[float, int]:
        """Seconds and calls of the all-reduces of ``steps`` eager decode steps, each timed from
        the call until the sum is there (the collective plus the wait for the slowest peer)."""
        reduce = self.model.reduce
        calls = reduce.calls
        reduce.take_timed_s()
        reduce.timed = True
        try:
            for _ in range(steps):
                self._step()
            return reduce.take_timed_s(), reduce.calls - calls
        finally:
            reduce.timed = False


def serve(server: Server, prompts: torch.Tensor, new_tokens: int, sync: Any) -> dict[str, float]:
    """One request batch: prefill the prompts, then ``new_tokens - 1`` greedy decode steps after
    the first token. Times on the wall clock after ``sync()``; returns ttft and decode seconds."""
    sync()
    t0 = time.perf_counter()
    server.prefill(prompts)
    sync()
    ttft = time.perf_counter() - t0
    t1 = time.perf_counter()
    server.decode(new_tokens - 1)
    sync()
    decode = time.perf_counter() - t1
    return {"ttft_s": ttft, "decode_s": decode, "latency_s": ttft + decode}
