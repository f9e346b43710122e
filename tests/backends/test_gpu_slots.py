"""The local backend's GPU slot pool (backends/local/slots.py): the pool from the caller's
CUDA_VISIBLE_DEVICES, a stand-in count or /dev/nvidia<N>; slots another process holds are
never given, a job of several takes them all at once or waits, and a process that ends gives
its slots back."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hopperlab.backends.local import slots


def test_the_pool_comes_from_the_caller_then_the_stand_in_then_the_devices(tmp_path):
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm"):
        (tmp_path / name).touch()
    assert slots.pool("2,3", "4", tmp_path) == (2, 3)
    assert slots.pool(None, "3", tmp_path) == (0, 1, 2)
    assert slots.pool(None, None, tmp_path) == (0, 1)
    assert slots.pool("GPU-uuid", "2", tmp_path) == ()  # the caller's choice, not numbered
    assert slots.pool("", None, tmp_path / "none") == ()
    with pytest.raises(ValueError, match=slots.SLOTS_ENV):
        slots.pool(None, "two", tmp_path)


def _holder(folder, n: int) -> subprocess.Popen:
    """Another process holding ``n`` slots of (0, 1) until killed."""
    code = (f"import sys, time; from pathlib import Path; from hopperlab.backends.local import "
            f"slots; print(slots.take({n}, (0, 1), 5, Path({str(folder)!r})), flush=True); "
            f"time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip()  # it holds them now
    return proc


def test_a_slot_another_process_holds_is_never_given(tmp_path):
    other = _holder(tmp_path, 1)
    try:
        assert slots.take(1, (0, 1), 5, tmp_path) == (1,)
        assert slots.take(1, (0, 1), 5, tmp_path) == (1,)  # held already: given again
        with pytest.raises(TimeoutError, match="free GPU slot"):
            slots.take(2, (0, 1), 0.3, tmp_path)  # never half of a 2-GPU job
    finally:
        slots.release()
        other.kill()
        other.wait()


def test_a_job_of_two_waits_for_both_and_takes_them_once_the_holder_ends(tmp_path):
    other = _holder(tmp_path, 2)
    try:
        with pytest.raises(TimeoutError):
            slots.take(1, (0, 1), 0.3, tmp_path)
        other.kill()
        other.wait()
        assert slots.take(2, (0, 1), 5, tmp_path) == (0, 1)
        with pytest.raises(ValueError, match="asks for 3 GPUs"):
            slots.take(3, (0, 1), 1, tmp_path)
    finally:
        slots.release()
