"""The floors a tensor-parallel serving run is judged against, from the shape and the node's
measured rates (pure arithmetic, so that a recorded run's floors can be recomputed).

Decode, per token: every byte this rank must read (its weight slice, the replicated LM head,
its share of the KV cache up to the current position) at the measured HBM rate, plus the
2 x layers all-reduces of one hidden-size vector per sequence at their measured time.
Prefill: the dense FLOPs of this rank (projections, causal attention, the head for the last
position) at the measured matmul rate; the all-reduces of the prompt's activations are given
apart (``prefill_allreduce_floor_s``), not in the compute floor.
"""

from __future__ import annotations

from dataclasses import dataclass

from hopperlab.core.stats import GB


@dataclass(frozen=True)
class Shape:
    """A Llama decoder's shape (grouped-query attention, SwiGLU FFN)."""

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


@dataclass(frozen=True)
class TPShape(Shape):
    """The shape as the floors need it: split over ``world`` ranks, ``dtype_bytes`` a weight."""

    world: int
    dtype_bytes: int

    @property
    def block_params_per_rank(self) -> int:
        return self.layer_params // self.world

    def weight_read_bytes(self) -> int:
        """Bytes of weights one decode step reads on a rank (blocks' slices and the head; the
        embedding is gathered one row per sequence)."""
        return (self.layers * self.block_params_per_rank + self.vocab * self.hidden) * self.dtype_bytes

    def kv_bytes(self, batch: int, tokens: int) -> int:
        """Bytes of this rank's keys and values for ``batch`` sequences of ``tokens``."""
        return 2 * self.layers * batch * (self.kv_heads // self.world) * self.head_dim * tokens \
            * self.dtype_bytes

    def prefill_flops(self, batch: int, tokens: int) -> float:
        """FLOPs of this rank's prefill of ``batch`` prompts of ``tokens`` (causal attention:
        half the square of scores and of the weighted sum)."""
        projections = 2.0 * batch * tokens * self.block_params_per_rank * self.layers
        attention = 2.0 * batch * (self.heads // self.world) * tokens * tokens * self.head_dim \
            * self.layers
        head = 2.0 * batch * self.hidden * self.vocab
        return projections + attention + head


@dataclass(frozen=True)
class NodeRates:
    """The node's measured rates: HBM GB/s, dense matmul TFLOP/s, and the seconds of one
    all-reduce of a decode step's and of a prefill's message (0 on one rank)."""

    hbm_gbps: float
    matmul_tflops: float
    allreduce_decode_s: float
    allreduce_prefill_s: float


def decode_floor_s(shape: TPShape, rates: NodeRates, batch: int, context: float) -> float:
    """Seconds of one decode step of ``batch`` sequences at ``context`` tokens (mean over the
    steps timed) at the node's floor."""
    read = shape.weight_read_bytes() + shape.kv_bytes(batch, 1) * context
    return read / (rates.hbm_gbps * GB) + 2 * shape.layers * rates.allreduce_decode_s


def prefill_floor_s(shape: TPShape, rates: NodeRates, batch: int, tokens: int) -> float:
    """Seconds of the prefill's dense compute at the measured matmul rate."""
    return shape.prefill_flops(batch, tokens) / (rates.matmul_tflops * 1e12)


def prefill_allreduce_floor_s(shape: TPShape, rates: NodeRates) -> float:
    """Seconds of the prefill's 2 x layers all-reduces at their measured time."""
    return 2 * shape.layers * rates.allreduce_prefill_s


def layers_that_fit(shape: TPShape, free_bytes: int, batch: int, max_len: int) -> int:
    """How many blocks fit in ``free_bytes`` beside the embedding, the head, the KV cache and
    the prefill's working set (a rough upper bound of one layer's activations, 2 GiB spare)."""
    fixed = 2 * shape.vocab * shape.hidden * shape.dtype_bytes
    tokens = batch * max_len
    work = tokens * (16 * shape.hidden + 8 * shape.ffn // shape.world
                     + 6 * (shape.heads // shape.world) * shape.head_dim * shape.dtype_bytes)
    per_layer = shape.block_params_per_rank * shape.dtype_bytes + shape.kv_bytes(batch, max_len) \
        // shape.layers
    room = free_bytes - fixed - work - 2 * (1 << 30)
    return max(0, min(shape.layers, room // per_layer))
