"""hopperlab.cuda.peaks: a window's peak, and the run's overall peak kept across windows
(PyTorch's counters replaced by a stand-in: CI has no GPU)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from hopperlab.cuda import peaks  # noqa: E402


class FakeCounters:
    """One device's allocated / reserved bytes with PyTorch's peak-and-reset semantics."""

    def __init__(self):
        self.allocated = self.reserved = 0
        self.peak_allocated = self.peak_reserved = 0

    def set(self, allocated: int, reserved: int) -> None:
        self.allocated, self.reserved = allocated, reserved
        self.peak_allocated = max(self.peak_allocated, allocated)
        self.peak_reserved = max(self.peak_reserved, reserved)

    def reset(self, device=None) -> None:
        self.peak_allocated, self.peak_reserved = self.allocated, self.reserved


@pytest.fixture()
def counters(monkeypatch):
    c = FakeCounters()
    monkeypatch.setattr(peaks, "_stat", lambda i, kind, field="peak": (
        c.peak_allocated if kind == "allocated_bytes" else c.peak_reserved))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", c.reset)
    monkeypatch.setattr(peaks, "_running", {})
    return c


def test_window_peak_and_overall_peak_survive_the_window_reset(counters):
    dev = "cuda:0"
    peaks.reset(dev)
    counters.set(900, 1000)          # forward's peak
    counters.set(400, 1000)          # forward's end
    peaks.start_window(dev)
    counters.set(650, 1000)          # the loss's backward
    counters.set(300, 1000)
    assert peaks.window_peak_allocated(dev) == 650
    assert peaks.overall(dev) == (900, 1000)     # the window's reset hid nothing
    counters.set(1200, 1300)
    assert peaks.overall(dev) == (1200, 1300)


def test_reset_forgets_earlier_windows(counters):
    dev = "cuda:0"
    counters.set(5000, 6000)
    peaks.start_window(dev)
    counters.set(100, 200)
    peaks.reset(dev)                 # the measured phase starts
    assert peaks.overall(dev) == (100, 200)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_nested_reads_equal_torchs_own():
    held = torch.empty(5 << 20, device="cuda")
    i = torch.cuda.current_device()
    assert peaks._stat(i, "allocated_bytes") == torch.cuda.max_memory_allocated(i)
    assert peaks._stat(i, "reserved_bytes") == torch.cuda.max_memory_reserved(i)
    assert peaks._stat(i, "allocated_bytes", "current") == torch.cuda.memory_allocated(i) > 0
    del held
