"""Host memory an offloading sharded run needs, from its parameters' local sizes: so that a node
without it is a ``skipped`` result with the figure, not a process the kernel kills mid-run.

Why per tensor: PyTorch's pinned allocator rounds every block up to a power of two, so the same
bytes cost 1.0-2.0x depending on each tensor's size. What is counted (bytes of this rank):
FSDP2 + CPUOffloadPolicy: the parameter shards in exact-size pinned buffers (ours), the gradient
shards in PyTorch's pinned blocks (rounded), two AdamW states (pageable, the parameters' dtype).
torchao's CPUOffloadOptimizer: a pinned host copy of every parameter and of its gradient
(rounded), two AdamW states. No torch here: tests feed it sizes.
"""

from __future__ import annotations

from typing import Iterable

#: the process itself (CUDA context, torch, Python, NCCL buffers): a margin, not a measurement
PROCESS_BYTES = 6 * 10**9


def pow2(n: int) -> int:
    """``n`` rounded up as PyTorch's pinned allocator rounds a block."""
    return 1 << max(0, (n - 1).bit_length()) if n > 0 else 0


def host_bytes(mode: str, local_bytes: Iterable[int], exact_params: bool,
               delayed: bool = False) -> int:
    """Host bytes one rank of ``mode`` needs, from its parameters' local sizes in bytes
    (``exact_params``: the parameter shards are in exact-size buffers, else rounded;
    ``delayed``: FSDP2's delayed update holds the previous step's gradients too)."""
    sizes = list(local_bytes)
    states = 2 * sum(sizes)
    rounded = sum(pow2(n) for n in sizes)
    if mode == "fsdp2-cpu-offload":
        grads = rounded * (2 if delayed else 1)
        return (sum(sizes) if exact_params else rounded) + grads + states + PROCESS_BYTES
    if mode == "torchao-cpu-offload":
        return 2 * rounded + states + PROCESS_BYTES
    return PROCESS_BYTES


def available_bytes(meminfo: str) -> int | None:
    """MemAvailable of a /proc/meminfo text, bytes (None when it does not say)."""
    for line in meminfo.splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None
