"""Pinned host memory for evicted KV caches and streamed weights, carved from power-of-two chunks.

Why in memory/: it is the inference techniques' side of the one pinned host allocator
(``pinned.host_buffer``, exact-size ``cudaHostRegister``) that the offload techniques' pool uses
too; a family keeps no allocator of its own.

Why not one ``torch.empty(..., pin_memory=True)`` per tensor: torch's caching host allocator
rounds every request up to a power of two, so a 134 MB layer of a 16k-token cache would pin
256 MB, and pinning costs time (docs/benchmarks/membench.md: a few GB/s). Chunks of
exactly a power of two are neither rounded nor lost: a tensor is a slice of a chunk, a chunk goes
back to the arena's free list when its owner is released and is reused as is, and the pinning is
paid once per chunk. Without CUDA the chunks are plain host memory.
"""

from __future__ import annotations

import torch

from hopperlab.memory.pinned import host_buffer

DEFAULT_CHUNK_BYTES = 2**30
ALIGN = 512  # bytes; keeps every slice aligned for copies and for any dtype


def _round_up(n: int, to: int) -> int:
    return (n + to - 1) // to * to


def _pow2_ceil(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


class HostArena:
    """Chunks of pinned host memory shared by every ``HostBlock`` of a run."""

    def __init__(self, pinned: bool, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> None:
        if chunk_bytes & (chunk_bytes - 1):
            raise ValueError(f"chunk_bytes must be a power of two, got {chunk_bytes}")
        self.pinned = pinned
        self.chunk_bytes = chunk_bytes
        self._free: dict[int, list[torch.Tensor]] = {}
        self.held_bytes = 0  # chunks handed out now
        self.peak_held_bytes = 0
        self.reserved_bytes = 0  # every chunk allocated, in use or free

    def take(self, nbytes: int) -> torch.Tensor:
        """A uint8 chunk of at least ``nbytes`` (the arena's chunk size, or the next power of two
        for a larger request)."""
        size = max(self.chunk_bytes, _pow2_ceil(nbytes))
        pool = self._free.setdefault(size, [])
        chunk = pool.pop() if pool else None
        if chunk is None:
            chunk = host_buffer(size, pin=self.pinned)
            self.reserved_bytes += size
        self.held_bytes += size
        self.peak_held_bytes = max(self.peak_held_bytes, self.held_bytes)
        return chunk

    def give_back(self, chunk: torch.Tensor) -> None:
        self._free.setdefault(chunk.numel(), []).append(chunk)
        self.held_bytes -= chunk.numel()

    def block(self) -> "HostBlock":
        return HostBlock(self)


class HostBlock:
    """Tensors for one owner (an evicted session, a model's streamed layers), bump-allocated in
    chunks of the arena; ``release()`` hands every chunk back at once."""

    def __init__(self, arena: HostArena) -> None:
        self.arena = arena
        self._chunks: list[torch.Tensor] = []
        self._used = 0  # bytes used in the last chunk
        self.nbytes = 0  # bytes of the tensors handed out

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        n = int(torch.Size(shape).numel()) * torch.empty((), dtype=dtype).element_size()
        need = _round_up(max(n, 1), ALIGN)
        if not self._chunks or self._used + need > self._chunks[-1].numel():
            self._chunks.append(self.arena.take(need))
            self._used = 0
        raw = self._chunks[-1][self._used:self._used + n]
        self._used += need
        self.nbytes += n
        return raw.view(dtype).view(shape)

    def release(self) -> None:
        for chunk in self._chunks:
            self.arena.give_back(chunk)
        self._chunks = []
        self._used = 0
        self.nbytes = 0

    @property
    def chunk_bytes(self) -> int:
        return sum(c.numel() for c in self._chunks)
