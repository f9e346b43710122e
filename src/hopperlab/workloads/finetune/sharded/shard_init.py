"""Random weights for a model built on the meta device, made where they will live and only for
this rank's shard.

Why: the sharded 13B built every rank's whole model on the CPU with ``normal_`` before FSDP2
sharded it (minutes of a node's time the run does not measure). Here each parameter's values
are a function of (seed, parameter index, flat element index) alone: the flat elements are cut
into fixed blocks, each drawn from its own generator seeded from (seed, parameter, block), so a
rank draws the blocks its rows touch and keeps its rows. The same seed is the same model for
every world size (and whether the model is sharded at all); values are drawn in float32 and
rounded to the parameter's dtype, on the device that will hold them (the GPU where there is one,
and copied from there into the host shard under CPU offload). CPU and CUDA generators differ, so
a model drawn on a GPU differs from one drawn on the CPU, as torch's own ``normal_`` does.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import torch
from torch import nn


#: elements per generator block: large enough for few generator set-ups (13B: ~800 blocks),
#: small enough that a rank draws at most one block of another rank's rows per tensor side
BLOCK = 1 << 24
#: N(0, STD) for every weight but the RMSNorm scales (ones)
STD = 0.02
_MASK = (1 << 63) - 1


def block_seed(seed: int, index: int, block: int) -> int:
    """The generator seed of block ``block`` of parameter ``index`` (a 63-bit mix: distinct
    for every (seed, index, block) a run meets)."""
    x = (seed * 0x9E3779B97F4A7C15 + index * 0xBF58476D1CE4E5B9 + block * 0x94D049BB133111EB)
    x &= _MASK
    x ^= x >> 31
    return (x * 0xD6E8FEB86659FD93) & _MASK


def draw_block(seed: int, index: int, block: int, numel: int, device: Any) -> torch.Tensor:
    """Block ``block`` of parameter ``index`` (``numel`` elements in all), float32 on ``device``:
    its size depends on ``numel`` alone, never on who asks, so every rank draws the same."""
    size = min(BLOCK, numel - block * BLOCK)
    g = torch.Generator(device=device).manual_seed(block_seed(seed, index, block))
    return torch.randn(size, generator=g, device=device, dtype=torch.float32).mul_(STD)


def fill_normal_(out: torch.Tensor, start: int, numel: int, seed: int, index: int,
                 device: Any) -> None:
    """Write flat elements ``[start, start + out.numel())`` of parameter ``index`` (``numel``
    elements) into the contiguous ``out``, drawing only the blocks they touch on ``device``."""
    flat = out.view(-1)
    end = start + flat.numel()
    for b in range(start // BLOCK, -(-end // BLOCK)):
        lo, hi = max(start, b * BLOCK), min(end, (b + 1) * BLOCK)
        values = draw_block(seed, index, b, numel, device)[lo - b * BLOCK:hi - b * BLOCK]
        # rounded to the parameter's dtype where drawn: a copy that changes device and dtype
        # at once may convert on the host (the same rounding, at a CPU core's rate)
        flat[lo - start:hi - start].copy_(values.to(flat.dtype))


def local_rows(param: torch.Tensor) -> tuple[torch.Tensor, int]:
    """This rank's part of ``param`` and the global row it starts at: all of a plain tensor;
    for an FSDP2 (DTensor, ``Shard(0)``) parameter, its chunk of the rows as ``torch.chunk``
    cuts them."""
    from torch.distributed.tensor import DTensor, Shard

    if not isinstance(param, DTensor):
        return param.data, 0
    if tuple(param.placements) != (Shard(0),):
        raise ValueError(f"expected one Shard(0) placement, got {param.placements}")
    local = param.to_local()
    rows, world = param.shape[0], param.device_mesh.size()
    chunk = -(-rows // world)
    first = min(param.device_mesh.get_local_rank() * chunk, rows)
    if local.shape[0] != max(0, min(chunk, rows - first)):
        raise ValueError(f"local shard of {local.shape[0]} rows, expected "
                         f"{max(0, min(chunk, rows - first))} of {rows} from row {first}")
    return local, first


def init_weights(model: nn.Module, seed: int, device: Any) -> None:
    """Fill every parameter's local part (norm scales 1, the rest N(0, 0.02)) from ``seed``,
    drawing on ``device``; parameters are numbered in ``named_parameters`` order, the same
    sharded or not."""
    with torch.no_grad():
        for index, (name, p) in enumerate(model.named_parameters()):
            local, first = local_rows(p)
            if name.endswith("norm.weight"):
                local.fill_(1.0)
            elif local.numel():
                row = p.numel() // p.shape[0] if p.dim() > 1 else 1  # global: no DTensor op
                fill_normal_(local, first * row, p.numel(), seed, index, device)


def materialise(model: nn.Module, device: Any,
                host_alloc: Callable[[int], torch.Tensor] | None = None) -> list[torch.Tensor]:
    """Give every meta parameter and buffer of ``model`` (FSDP2-sharded or not) uninitialised
    storage of its local shape on ``device``; with ``host_alloc`` (bytes -> uint8 host buffer:
    ``memory.pinned.pinned_empty``, exact-size page-locked memory, not PyTorch's power-of-two
    rounding) each local tensor is a view of a buffer of its own, made there and nowhere else.
    Returns those buffers: the caller keeps them as long as the model (a pinned one's finalizer
    unpins it)."""
    from torch.distributed.tensor import DTensor

    bases: list[torch.Tensor] = []

    def host(shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
        assert host_alloc is not None
        nbytes = shape.numel() * dtype.itemsize
        base = host_alloc(max(1, nbytes))
        bases.append(base)
        return base[:nbytes].view(dtype).view(shape)

    def alloc(t: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(t, device=device)  # to_empty's own step (a DTensor stays one)
        if host_alloc is None:
            return out
        if isinstance(out, DTensor):
            # the local tensor swapped for one in our buffer, as FSDP2 itself swaps it when it
            # re-pads (``DTensor.from_local`` would move it to the mesh's device, the GPU)
            out._local_tensor = host(out._local_tensor.shape, out.dtype)
            return out
        return host(out.shape, out.dtype)

    model._apply(alloc)  # to_empty's path, with our allocation (FSDP2 re-pads after it)
    # a shard of uneven rows FSDP2 has just copied into a padded tensor of its own: drop ours
    used = {local.data_ptr() for local in _locals(model)}
    return [b for b in bases if any(b.data_ptr() <= ptr < b.data_ptr() + b.numel()
                                    for ptr in used)]


def _locals(model: nn.Module) -> Iterator[torch.Tensor]:
    for p in model.parameters():
        yield p.to_local() if hasattr(p, "to_local") else p


def share_in(model: nn.Module, bases: list[torch.Tensor]) -> float:
    """The fraction of this rank's parameter bytes that live in ``bases`` (1.0: FSDP2 kept the
    exact-size buffers rather than copying the shards into memory of its own)."""
    spans = sorted((b.data_ptr(), b.data_ptr() + b.numel()) for b in bases)
    held = inside = 0
    for local in _locals(model):
        n = local.numel() * local.element_size()
        held += n
        ptr = local.data_ptr()
        inside += n if any(lo <= ptr < hi for lo, hi in spans) else 0
    return inside / held if held else 0.0


def meta_parameters(model: nn.Module) -> Iterator[str]:
    """Names of the parameters still on the meta device (none after ``materialise``)."""
    return (n for n, p in model.named_parameters() if p.device.type == "meta")
