"""Pinned memory stays registered as long as any tensor reads it (memory/pinned.py).

The 2026-11-28 TPC-H host-pinned run streamed at the pageable rate: ``pinned_copy`` returned a
view, and the registration ended with the tensor object it had been tied to. cudart is stood
in for here (no CUDA on the test machine): what matters is when unregister is called."""

from __future__ import annotations

import gc

import pytest
import torch

from hopperlab.memory import pinned


class FakeCudart:
    def __init__(self) -> None:
        self.registered: list[tuple[int, int, int]] = []
        self.unregistered: list[int] = []

    def cudaHostRegister(self, ptr: int, nbytes: int, flags: int) -> int:  # noqa: N802
        self.registered.append((ptr, nbytes, flags))
        return 0

    def cudaHostUnregister(self, ptr: int) -> int:  # noqa: N802
        self.unregistered.append(ptr)
        return 0


@pytest.fixture
def cudart(monkeypatch) -> FakeCudart:
    fake = FakeCudart()
    monkeypatch.setattr(torch.cuda, "cudart", lambda: fake)
    return fake


def test_a_pinned_copy_stays_registered_while_a_view_of_it_lives(cudart):
    src = torch.arange(3 * 1024, dtype=torch.float32).view(3, 1024)
    copy = pinned.pinned_copy(src)
    gc.collect()
    assert torch.equal(copy, src) and copy.shape == src.shape
    [(ptr, nbytes, flags)] = cudart.registered
    assert (ptr, nbytes, flags) == (copy.data_ptr(), src.numel() * 4, 0)
    assert cudart.unregistered == []      # the uint8 buffer it was made from is gone already
    row = copy[1]
    del copy
    gc.collect()
    assert cudart.unregistered == []      # a view still reads the memory
    assert row[0].item() == 1024.0
    del row
    gc.collect()
    assert cudart.unregistered == [ptr]   # the last tensor gone: unregistered, once


def test_mapped_and_empty_buffers(cudart):
    buf = pinned.pinned_empty(pinned.PREFAULT_BYTES, mapped=True)
    assert cudart.registered == [(buf.data_ptr(), pinned.PREFAULT_BYTES,
                                  pinned.HOST_REGISTER_PORTABLE | pinned.HOST_REGISTER_MAPPED)]
    assert int(buf.sum()) == 0            # touched (zeroed) before registration
    assert pinned.pinned_empty(0).numel() == 0 and len(cudart.registered) == 1
    ptr = buf.data_ptr()
    del buf
    gc.collect()
    assert cudart.unregistered == [ptr]
