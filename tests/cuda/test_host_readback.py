"""HostReadback: small device results read by the host through mapped pinned memory (the MoE's
tokens per expert), so that the read does not queue behind activation offload's copies."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from hopperlab.cuda.host_readback import HostReadback  # noqa: E402


def test_host_tensors_are_read_as_tolist():
    assert HostReadback(4).read(torch.tensor([7, 0, 3])) == [7, 0, 3]


def test_capacity_must_be_positive():
    with pytest.raises(ValueError, match="capacity"):
        HostReadback(0)


def test_a_copy_of_a_model_gets_its_own_readback():
    import copy

    original = HostReadback(3)
    duplicate = copy.deepcopy(original)
    assert duplicate is not original and duplicate.capacity == 3


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@cuda
def test_device_values_read_equal_tolist_and_the_memory_is_reused():
    readback = HostReadback(8)
    for values in ([5, 1, 0, 9], [2, 2], list(range(8))):
        t = torch.tensor(values, device="cuda", dtype=torch.int64)
        assert readback.read(t) == t.tolist()
    assert readback.read(torch.tensor([3, 4], device="cuda", dtype=torch.int32)) == [3, 4]


@cuda
@pytest.mark.parametrize("bad", [torch.zeros(9, dtype=torch.int64), torch.zeros(2, 2).long(),
                                 torch.zeros(2)])
def test_device_tensors_it_cannot_hold_are_refused(bad):
    with pytest.raises(ValueError, match="at most 8"):
        HostReadback(8).read(bad.cuda())
