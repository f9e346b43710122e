"""The runner tells an out-of-memory error by its type, never by its class name (issue 17)."""

from __future__ import annotations

import pytest

from hopperlab.run.runner import _is_oom


def test_torch_out_of_memory_and_host_memory_error_are_oom():
    torch = pytest.importorskip("torch")
    assert _is_oom(torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB"))
    assert _is_oom(MemoryError())


def test_a_class_that_only_shares_the_name_is_not_oom():
    pytest.importorskip("torch")
    impostor = type("OutOfMemoryError", (RuntimeError,), {})("some other trouble")
    assert not _is_oom(impostor)
    assert not _is_oom(ValueError("bad value"))
