"""One pinned host allocator (issue 31): inference's host arena lived in the family
(workloads/inference/host_memory.py) and pinned with torch's power-of-two allocator, beside
memory/pinned.py's exact-size one. It is in memory/ now and pins through ``host_buffer``."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from hopperlab.memory import pinned  # noqa: E402
from hopperlab.memory.host_arena import HostArena  # noqa: E402

WORKLOADS = Path(__file__).resolve().parents[2] / "src" / "hopperlab" / "workloads"


def test_the_arena_pins_its_chunks_through_the_one_allocator(monkeypatch):
    made = []

    def fake_pinned_empty(nbytes: int) -> torch.Tensor:  # no CUDA here: record, allocate plainly
        made.append(nbytes)
        return torch.empty(nbytes, dtype=torch.uint8)

    monkeypatch.setattr(pinned, "pinned_empty", fake_pinned_empty)
    arena = HostArena(pinned=True, chunk_bytes=4096)
    block = arena.block()
    block.empty((100,), torch.float32)
    block.empty((3000,), torch.float32)  # 12000 B: a chunk of its own, 16384
    assert made == [4096, 16384]
    pool = pinned.PinnedBufferPool(pin=True)
    pool.acquire(10_000)
    assert made == [4096, 16384, pinned.rounded_size(10_000)]  # the offload pool: the same one


def test_unpinned_arena_allocates_no_pinned_memory(monkeypatch):
    monkeypatch.setattr(pinned, "pinned_empty", lambda n: pytest.fail("pinned without CUDA"))
    HostArena(pinned=False, chunk_bytes=4096).block().empty((10,), torch.float32)


def test_no_family_keeps_a_host_allocator_of_its_own():
    assert not (WORKLOADS / "inference" / "host_memory.py").exists()
    for path in WORKLOADS.rglob("*.py"):
        assert "class HostArena" not in path.read_text(), path
