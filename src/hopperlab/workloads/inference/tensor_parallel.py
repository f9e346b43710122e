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
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from hopperlab.workloads.inference.tp_floor import Shape


class AllReduce:
    """Sums partial results over the ranks, counting the calls; disabled, it leaves them as
    they are (to time a step without its collectives)."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.enabled = True
        self.calls = 0

    def _active(self) -> bool:
        return self.enabled and dist.is_initialized() and dist.get_world_size() > 1

    def start(self, x: torch.Tensor) -> Any:
        """Starts summing ``x`` in place without waiting (prefill overlaps it with the next
        slice's compute); ``finish`` makes the current stream wait for it."""
        if not self._active():
            return None
        self.calls += 1
        return dist.all_reduce(x, async_op=True)

    @staticmethod
    def finish(work: Any) -> None:
        if work is not None:
            work.wait()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self._active():
            self.calls += 1
            dist.all_reduce(x)
        return x


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
    """RMS norm (no weight: the random model's are ones), in float32 or wider inside one fused
    kernel where torch has it."""
    return F.rms_norm(x, (x.shape[-1],), eps=1e-5)


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


#: decode attention sums the weighted values in slices of this many positions, one matrix
#: product each, then adds the slices: a single [group, positions] x [positions, head_dim]
#: product per kv head runs on a handful of SMs and reads a 31k-token cache at a tenth of HBM
#: speed (measured: docs/benchmarks/distributed.md). The cache length is a multiple of it.
KV_SLICE = 256

#: prefill sums each block half's partial results in this many slices of the prompt, so that
#: one slice's all-reduce overlaps the next slice's projections (4 x H200, TP 4, 31k prompt:
#: 4 slices 1.42x of the compute floor, 8 slices 1.46x: NCCL's kernels take SMs from the GEMMs)
PREFILL_SLICES = 4
_MIN_SLICE_TOKENS = 512


class KVCache:
    """Keys and values of every layer for ``batch`` sequences of up to ``max_len`` tokens
    (rounded up to a whole number of ``KV_SLICE``), allocated once (zeros: attention multiplies
    the masked tail by 0, and 0 x NaN is NaN)."""

    def __init__(self, layers: int, batch: int, kv_heads: int, max_len: int, head_dim: int,
                 dtype: Any, device: Any) -> None:
        self.max_len = -(-max_len // KV_SLICE) * KV_SLICE
        shape = (batch, kv_heads, self.max_len, head_dim)
        self.layers = [(torch.zeros(shape, dtype=dtype, device=device),
                        torch.zeros(shape, dtype=dtype, device=device)) for _ in range(layers)]

    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in self.layers)


def qkv_rope(x: torch.Tensor, w: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
             heads: tuple[int, int, int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Normed ``x`` [b, t, hidden] through the fused q/k/v slice; q and k rotated.
    ``heads``: (query heads, kv heads, head_dim) of this rank."""
    hq, hk, d = heads
    b, t, _ = x.shape
    qkv = (rms_norm(x) @ w.T).view(b, t, hq + 2 * hk, d).transpose(1, 2)
    q, k, v = qkv.split((hq, hk, hk), dim=1)
    return rope(q, cos, sin), rope(k, cos, sin), v


def decode_attention(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor,
                     valid: torch.Tensor) -> torch.Tensor:
    """Attention of one query per sequence [b, hq, 1, d] over the whole cache [b, hk, L, d],
    positions not ``valid`` masked: each kv head serves its group of query heads from one read
    (no expanded copy); the weighted sum runs in ``KV_SLICE`` slices added up in float32."""
    b, hq, _, d = q.shape
    hk, length = kc.shape[1], kc.shape[2]
    group = hq // hk
    qg = q.view(b, hk, group, d)
    scores = _wide(qg @ kc.transpose(-1, -2)) * d ** -0.5                      # [b, hk, g, L]
    p = scores.masked_fill(~valid, float("-inf")).softmax(-1).to(q.dtype)
    slices = length // KV_SLICE
    p = p.view(b, hk, group, slices, KV_SLICE).transpose(2, 3)                  # [b, hk, s, g, S]
    partial = p @ vc.view(b, hk, slices, KV_SLICE, d)                            # [b, hk, s, g, d]
    return _wide(partial).sum(2).to(q.dtype).view(b, hq, 1, d)


def ffn(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """This rank's partial sum of the SwiGLU FFN of normed ``x``."""
    gate, up = (rms_norm(x) @ gate_up.T).chunk(2, dim=-1)
    return (F.silu(gate) * up) @ down.T


class Kernels:
    """The block's pieces between collectives, eager or compiled (``torch.compile`` fuses the
    norms, rotations, masking and softmax: a decode step of 80 layers otherwise launches ~3,600
    small kernels, whose minimum time alone is most of a TP-4 step's floor)."""

    def __init__(self, compile_them: bool) -> None:
        wrap = (lambda f: torch.compile(f, dynamic=False, fullgraph=True)) if compile_them \
            else (lambda f: f)
        self.compiled = compile_them
        self.qkv_rope, self.decode_attention, self.ffn = (
            wrap(qkv_rope), wrap(decode_attention), wrap(ffn))


def _prefill_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention by the fastest fused kernel torch has for it here (cuDNN's on Hopper,
    else flash; the CPU's math kernel)."""
    if q.is_cuda:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        order = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION,
                 SDPBackend.EFFICIENT_ATTENTION]
        with sdpa_kernel(order, set_priority=True):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class TPBlock:
    """One decoder block; this rank's slice of the heads and of the FFN."""

    def __init__(self, s: Shape, index: int, seed: int, dtype: Any, device: Any,
                 reduce: AllReduce, kernels: Kernels) -> None:
        rank, world = _rank_world()
        if s.heads % world or s.kv_heads % world or s.ffn % world:
            raise ValueError(f"heads {s.heads}, kv heads {s.kv_heads} and ffn {s.ffn} must "
                             f"divide by the world size {world}")
        d, hq, hk, f = s.head_dim, s.heads // world, s.kv_heads // world, s.ffn // world
        self.hq, self.hk, self.d, self.reduce, self.k = hq, hk, d, reduce, kernels
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

    def prefill(self, x: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor],
                cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.k.qkv_rope(x, self.qkv, cos[:t], sin[:t], (self.hq, self.hk, self.d))
        kc, vc = cache
        kc[:, :, :t], vc[:, :, :t] = k, v
        if self.hk != self.hq:  # fused attention kernels want as many kv heads as query heads
            k = k.repeat_interleave(self.hq // self.hk, dim=1)
            v = v.repeat_interleave(self.hq // self.hk, dim=1)
        attn = _prefill_sdpa(q, k, v).transpose(1, 2).reshape(b, t, -1)
        slices = PREFILL_SLICES if t >= PREFILL_SLICES * _MIN_SLICE_TOKENS else 1
        xs, attns = x.chunk(slices, dim=1), attn.chunk(slices, dim=1)
        # every slice's o projection, its all-reduce running behind the next slice's
        outs, pending = [], []
        for a in attns:
            outs.append(a @ self.o.T)
            pending.append(self.reduce.start(outs[-1]))
        mids, ffn_outs, ffn_pending = [], [], []
        for xi, oi, work in zip(xs, outs, pending):
            self.reduce.finish(work)
            mid = xi + oi
            part = self.k.ffn(mid, self.gate_up, self.down)
            mids.append(mid)
            ffn_outs.append(part)
            ffn_pending.append(self.reduce.start(part))
        for work in ffn_pending:
            self.reduce.finish(work)
        return torch.cat([m + p for m, p in zip(mids, ffn_outs)], dim=1)

    def decode(self, x: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor],
               cos: torch.Tensor, sin: torch.Tensor, pos: torch.Tensor,
               valid: torch.Tensor) -> torch.Tensor:
        """One token per sequence at position ``pos`` (a device tensor [1]); ``valid`` [max_len]
        marks the cache positions up to and including ``pos``."""
        b = x.shape[0]
        q, k, v = self.k.qkv_rope(x, self.qkv, cos, sin, (self.hq, self.hk, self.d))
        kc, vc = cache
        kc.index_copy_(2, pos, k)
        vc.index_copy_(2, pos, v)
        attn = self.k.decode_attention(q, kc, vc, valid).transpose(1, 2).reshape(b, 1, -1)
        x = x + self.reduce(attn @ self.o.T)
        return x + self.reduce(self.k.ffn(x, self.gate_up, self.down))


class TPDecoder:
    """The model on this rank: replicated embedding, norms and head; a slice of every block."""

    def __init__(self, s: Shape, seed: int, dtype: Any, device: Any, cuda: bool,
                 compile_kernels: bool = False) -> None:
        self.shape, self.dtype, self.device = s, dtype, torch.device(device)
        self.reduce = AllReduce(cuda)
        self.kernels = Kernels(compile_kernels)
        self.embed = full_weight(seed, 10**6, s.vocab, s.hidden, dtype, device)
        self.blocks = [TPBlock(s, i, seed, dtype, device, self.reduce, self.kernels)
                       for i in range(s.layers)]
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


def build(shape: Shape, seed: int, dtype: Any, device: Any, cuda: bool,
          compile_kernels: bool = False) -> TPDecoder:
    return TPDecoder(shape, seed, dtype, device, cuda, compile_kernels)


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
        self.out = torch.zeros(batch, self.cache.max_len, dtype=torch.long, device=dev)
        self.graph: Any = None
        #: the same step without its all-reduces (several ranks only): what they cost in a step
        self.graph_alone: Any = None
        if graphs:
            self.graph = self._capture()
            if model.reduce._active():
                model.reduce.enabled = False
                try:
                    self.graph_alone = self._capture()
                finally:
                    model.reduce.enabled = True

    def _step(self) -> None:
        nxt = self.model.decode_step(self.token, self.cache, self.pos).argmax(-1)
        self.out.index_copy_(1, self.step_index, nxt)
        self.token.copy_(nxt)
        self.pos.add_(1)
        self.step_index.add_(1)

    def _capture(self) -> Any:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up: lazy inits and compiles happen outside capture
            for _ in range(3):
                self._step()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        self.pos.zero_()
        self.step_index.zero_()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._step()
        torch.cuda.synchronize()
        return graph

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

    def step_seconds(self, start_pos: int, steps: int, alone: bool = False) -> float:
        """Mean seconds of ``steps`` graph replays from ``start_pos`` (``alone``: the step
        without its all-reduces, which leaves the cache's tail and the tokens wrong)."""
        graph = self.graph_alone if alone else self.graph
        self.pos.fill_(start_pos)
        self.step_index.zero_()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(steps):
            graph.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / steps


def serve(server: Server, prompts: torch.Tensor, new_tokens: int, sync: Any) -> dict[str, float]:
    """One request batch: prefill the prompts, then ``new_tokens - 1`` greedy decode steps after
    the first token. Times on the wall clock after ``sync()``; returns ttft and decode seconds,
    and the tokens the batch generated (``generated_tokens``: every sequence's first token and
    its decode steps; ``first_tokens``: one a sequence), which a caller's energy window counts."""
    sequences, steps = int(prompts.shape[0]), new_tokens - 1
    sync()
    t0 = time.perf_counter()
    server.prefill(prompts)
    sync()
    ttft = time.perf_counter() - t0
    t1 = time.perf_counter()
    server.decode(steps)
    sync()
    decode = time.perf_counter() - t1
    return {"ttft_s": ttft, "decode_s": decode, "latency_s": ttft + decode,
            "generated_tokens": float(sequences * (1 + steps)), "first_tokens": float(sequences)}
