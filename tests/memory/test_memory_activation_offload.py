"""Activation offload and checkpointing (hopperlab.memory): exact gradients on CPU, pool reuse,
the budget policy. The CPU path runs the same bookkeeping as CUDA, with host->host copies."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from hopperlab.memory.layers import decoder_layers  # noqa: E402
from hopperlab.memory.activation_offload import (  # noqa: E402
    ActivationOffload, _dense, _Kept, save_on_cpu_reference)
from hopperlab.memory.pinned import PinnedBufferPool  # noqa: E402
from hopperlab.memory.checkpointing import checkpoint_layers  # noqa: E402

from tests.memory_helpers import (  # noqa: E402
    assert_exact, batch, step, storages_left_by_a_failed_step, tiny_lora_llama, twin)


def _offload(model, **kw) -> ActivationOffload:
    kw.setdefault("min_bytes", 1024)
    return ActivationOffload("cpu", **kw).wrap_layers(decoder_layers(model)).track_parameters(model)


def test_offload_gradients_exact_and_pool_reused(lora_model, baseline):
    model = twin(lora_model)
    off = _offload(model)
    assert_exact(baseline, step(model, batch(), lambda: off))
    first = off.stats()
    assert first.tensors_offloaded > 0 and first.bytes_offloaded == first.bytes_reloaded
    assert first.groups == 4 + 1              # one per layer, and the head after the last
    assert first.pool_new_allocations == first.tensors_offloaded
    assert first.parameters_skipped > 0       # the (frozen) weights' views were recognised
    assert first.tensors_shared > 0           # q/k/v adapters save the same input: one copy
    assert_exact(baseline, step(model, batch(), lambda: off))
    second = off.stats()
    assert second.pool_new_allocations == 0   # steady state: no new pinned buffers
    assert second.pool_bytes == first.pool_bytes
    assert second.bytes_offloaded == first.bytes_offloaded
    assert off.pool.in_use_bytes == 0         # every host buffer went back after backward


def test_full_finetune_exact_with_offload():
    model = tiny_lora_llama(layers=2, full=True)
    base = step(model, batch(1))
    off = _offload(model)
    assert_exact(base, step(model, batch(1), lambda: off))
    assert off.stats().tensors_offloaded > 0


def test_checkpointing_exact(lora_model, baseline):
    model = twin(lora_model)
    handle = checkpoint_layers(decoder_layers(model))
    assert len(handle) == 4
    assert_exact(baseline, step(model, batch()))
    handle.remove()
    assert "forward" not in decoder_layers(model)[0].__dict__
    assert_exact(baseline, step(model, batch()))


def test_checkpointing_with_offload_moves_only_layer_inputs(lora_model, baseline):
    model = twin(lora_model)
    checkpoint_layers(decoder_layers(model))
    off = _offload(model)
    assert_exact(baseline, step(model, batch(), lambda: off))
    s = off.stats()
    # inside the layers only the checkpoint inputs are saved through our hooks: the hidden
    # states (and rotary tables) of each of the 4 layers, far fewer than without checkpointing
    model2 = twin(lora_model)
    off2 = _offload(model2)
    step(model2, batch(), lambda: off2)
    assert 0 < s.bytes_offloaded < off2.stats().bytes_offloaded / 3
    hidden_bytes = 2 * 16 * 64 * 4
    assert s.bytes_offloaded >= 4 * hidden_bytes


def test_budget_large_offloads_nothing_small_offloads(lora_model, baseline):
    model = twin(lora_model)
    everything = _offload(model)
    step(model, batch(), lambda: everything)
    total = everything.stats().bytes_offloaded
    everything.remove()

    big = _offload(model, budget_bytes=1 << 40)
    # first step, nothing known of backward's need yet: everything goes (the budget holds)
    assert_exact(baseline, step(model, batch(), lambda: big))
    assert big.stats().bytes_offloaded == total and big.stats().plan_bytes == 0
    # from the second step, the plan: nothing needs to go
    assert_exact(baseline, step(model, batch(), lambda: big))
    assert big.stats().tensors_offloaded == 0 and big.stats().bytes_kept_by_budget > 0
    big.remove()

    half = _offload(model, budget_bytes=total // 2)
    assert_exact(baseline, step(model, batch(), lambda: half))
    assert half.stats().bytes_offloaded == total
    # from the second step, the plan: offload the earliest groups, just enough
    assert_exact(baseline, step(model, batch(), lambda: half))
    planned = half.stats()
    # the plan's bytes come from the first saved tensors on: the earliest layers' groups, not
    # the head's (group 8, after the 4th layer)
    assert 0 < planned.plan_bytes <= planned.bytes_offloaded < total
    assert min(half._groups) == 1 and max(half._groups) < 8
    half.remove()

    tiny = _offload(model, budget_bytes=1)
    assert_exact(baseline, step(model, batch(), lambda: tiny))
    assert tiny.stats().bytes_offloaded == total


def test_budget_counts_the_reserve():
    probe = {"bytes": 900}
    off = ActivationOffload("cpu", budget_bytes=1000, reserve_bytes=50, memory_probe=lambda: probe["bytes"])
    assert off._within_budget()
    probe["bytes"] = 960
    assert not off._within_budget()


def test_min_bytes_keeps_small_tensors(lora_model, baseline):
    model = twin(lora_model)
    off = _offload(model, min_bytes=1 << 30)
    assert_exact(baseline, step(model, batch(), lambda: off))
    assert off.stats().tensors_offloaded == 0


def test_save_on_cpu_reference_exact(lora_model, baseline):
    model = twin(lora_model)
    assert_exact(baseline, step(model, batch(), save_on_cpu_reference))


def test_pool_reuses_a_released_buffer():
    pool = PinnedBufferPool(pin=False)
    a = pool.acquire(100)
    pool.release(a)
    again = pool.acquire(100)
    assert again.data_ptr() == a.data_ptr() and pool.allocations == 1
    pool.release(again)
    assert pool.acquire(50).data_ptr() == a.data_ptr()  # the smallest free buffer that fits
    pool.acquire(100)
    assert pool.allocations == 2 and pool.allocated_bytes == 200 and pool.in_use_bytes == 200


def test_dense_layouts():
    x = torch.randn(4, 6, 8)
    assert _dense(x) and _dense(x.transpose(0, 2)) and _dense(x.permute(1, 2, 0))
    assert not _dense(x[:, ::2]) and not _dense(x[..., :4])
    assert _dense(torch.randn(1, 5).t())


def test_transposed_saved_tensor_round_trip():
    """A permuted (non-contiguous, dense) saved tensor comes back with its strides."""
    off = ActivationOffload("cpu", min_bytes=0)
    w = torch.randn(16, 8, requires_grad=True)
    x = torch.randn(16, 8).t()            # a transposed activation, saved by the matmul
    x.requires_grad_(True)
    with off:
        y = (x.exp() @ w).sum()
    y.backward()
    ref_w, ref_x = w.grad.clone(), x.grad.clone()
    w.grad = x.grad = None
    (x.exp() @ w).sum().backward()
    assert torch.equal(ref_w, w.grad) and torch.equal(ref_x, x.grad)
    assert off.stats().tensors_offloaded >= 1


def test_refuses_bad_arguments():
    with pytest.raises(ValueError):
        ActivationOffload("cpu", budget_bytes=0)
    with pytest.raises(ValueError):
        ActivationOffload("cpu", min_bytes=-1)
    with pytest.raises(ValueError, match="staging: expected one of host, device"):
        ActivationOffload("cpu", staging="disk")
    with pytest.raises(ValueError, match="a budget cannot hold"):
        ActivationOffload("cpu", staging="device", budget_bytes=1 << 30)


def test_device_pool_hands_out_device_buffers_and_refuses_pinning():
    with pytest.raises(ValueError, match="device buffers need none"):
        PinnedBufferPool(pin=True, device=torch.device("cpu"))
    pool = PinnedBufferPool(pin=False, device=torch.device("meta"))
    buf = pool.acquire(64)
    assert buf.device.type == "meta" and pool.allocated_bytes == 64
    pool.release(buf)
    pool.acquire(64)
    assert pool.allocations == 1  # the released buffer served again


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("staging", ["host", "device"])
def test_cuda_offload_equals_the_plain_step(staging):
    """On the GPU (bf16 model, side streams, events, prefetch): the loss and every adapter
    gradient equal the plain step's; ``staging`` says where the copies went."""
    model = tiny_lora_llama(layers=4).to("cuda", torch.bfloat16)
    data = {k: v.cuda() for k, v in batch(b=4, s=64).items()}
    base = step(model, data)
    off = ActivationOffload("cuda", min_bytes=1024, staging=staging)
    off.wrap_layers(decoder_layers(model)).track_parameters(model)
    for _ in range(2):                       # the second step reuses the pool's buffers
        got = step(model, data, lambda: off)
        torch.cuda.synchronize()
        assert_exact(base, got)
    stats = off.stats()
    assert stats.tensors_offloaded > 0 and stats.bytes_offloaded == stats.bytes_reloaded
    assert stats.pool_new_allocations == 0
    buffers = [b for bufs in off.pool._free.values() for b in bufs]
    assert buffers and all(b.is_cuda == (staging == "device") for b in buffers)
    if staging == "host":
        assert all(b.is_pinned() for b in buffers)
    off.remove()


@pytest.mark.parametrize("prefetch", [0, 1, 2])
def test_backward_holds_only_the_prefetch_window(lora_model, baseline, prefetch):
    """While backward runs, reloaded tensors are on the device for the group in use and the
    ``prefetch_groups`` next ones only (not everything at once)."""
    model = twin(lora_model)
    off = _offload(model, prefetch_groups=prefetch)
    seen: list[int] = []
    original = off._unpack

    def counting_unpack(packed):
        out = original(packed)
        live = {h.group for refs in off._groups.values() for h in (r() for r in refs)
                if h is not None and h.device_tensor is not None}
        seen.append(len(live))
        return out

    off._unpack = counting_unpack
    assert_exact(baseline, step(model, batch(), lambda: off))
    assert seen and max(seen) <= prefetch + 1
    if prefetch:
        assert max(seen) == prefetch + 1       # and the window is really used


@pytest.mark.parametrize("keep", [1, 2])
def test_keep_last_layers_stays_on_device_and_stays_exact(lora_model, baseline, keep):
    """Backward needs the last layers' (and the head's) saved tensors first: kept on the device
    they cost no link time; the other layers are offloaded as before; gradients unchanged."""
    reference = twin(lora_model)
    everything = _offload(reference)
    step(reference, batch(), lambda: everything)
    full = everything.stats()
    model = twin(lora_model)
    off = _offload(model, keep_last_layers=keep)
    assert_exact(baseline, step(model, batch(), lambda: off))
    s = off.stats()
    assert s.groups == 4 - keep               # the head's group and the last layers' stay
    assert s.bytes_kept_last_layers > 0
    # a tensor saved by several consumers counts once, kept or offloaded
    assert s.bytes_offloaded < full.bytes_offloaded
    assert s.bytes_offloaded + s.bytes_kept_last_layers == full.bytes_offloaded
    assert s.bytes_offloaded == s.bytes_reloaded and off.pool.in_use_bytes == 0


def test_keep_last_layers_must_not_be_negative():
    with pytest.raises(ValueError, match="keep_last_layers"):
        ActivationOffload("cpu", keep_last_layers=-1)


def test_plan_offloads_the_excess_over_budget_and_reserve():
    off = ActivationOffload("cpu", budget_bytes=1000, reserve_bytes=100)
    off._alloc_at_forward_end, off._last_offloaded, off._last_eligible_bytes = 700, 600, 600
    # 700 + 600 would be allocated at forward's end had nothing gone; + 100 reserve - 98% of
    # the budget
    assert off._make_plan() == 700 + 600 + 100 - 980
    off._alloc_at_forward_end, off._last_offloaded = 200, 0
    assert off._make_plan() == 0            # fits: nothing to offload
    assert ActivationOffload("cpu")._make_plan() is None     # no budget, no plan
    # copies still running at forward's end: offloaded and still allocated, counted once
    off._alloc_at_forward_end, off._last_offloaded, off._inflight_at_forward_end = 900, 600, 400
    assert off._make_plan() == 900 + 600 - 400 + 100 - 980


def test_reserve_is_the_window_peak_over_forward_end_and_only_grows(monkeypatch):
    from hopperlab.memory import offload_budget as ao

    off = ActivationOffload("cpu", budget_bytes=1 << 30)
    window = {"peak": 350}
    monkeypatch.setattr(ao.peaks, "window_peak_allocated", lambda device: window["peak"])
    off._plan_bytes = 0                     # a planned step
    off._alloc_at_forward_end, off._window_open = 100, True
    off._close_window()
    assert off._learned_reserve == 250 and not off._window_open
    off._close_window()                     # closed: a second call changes nothing
    window["peak"] = 200
    off._window_open = True
    off._close_window()
    assert off._learned_reserve == 250      # the largest seen so far


def test_first_step_reserve_serves_until_a_planned_step_has_measured(monkeypatch):
    """The first step offloads everything (its need is another picture); its reserve is used
    by the second step, then only what planned steps measured."""
    from hopperlab.memory import offload_budget as ao

    off = ActivationOffload("cpu", budget_bytes=1 << 30, reserve_bytes=7)
    window = {"peak": 900}
    monkeypatch.setattr(ao.peaks, "window_peak_allocated", lambda device: window["peak"])
    off._alloc_at_forward_end, off._window_open = 100, True      # step 1: no plan
    off._close_window()
    assert off._reserve() == 800 + 7
    off._use_planned = off._planned_measured                     # step 2 begins
    off._plan_bytes, window["peak"] = 50, 400
    off._window_open = True
    off._close_window()                                          # step 2 measured 300
    assert off._reserve() == 800 + 7                             # step 2 still used step 1's
    off._use_planned = off._planned_measured                     # step 3 begins
    assert off._reserve() == 300 + 7


def _live_groups(off) -> set[int]:
    return {h.group for refs in off._groups.values() for h in (r() for r in refs)
            if h is not None and h.device_tensor is not None}


def test_loss_backward_starts_no_prefetch_beyond_the_head(lora_model, baseline):
    """The first unpack in the head's group (the loss's, the step's memory peak) reloads that
    group only; the last layer's group is started by the head's next unpack, ahead of use."""
    model = twin(lora_model)
    off = _offload(model, prefetch_groups=1)
    seen: list[tuple[int | None, set[int], set[int]]] = []
    original = off._unpack

    def recording_unpack(packed):
        before = _live_groups(off)
        out = original(packed)
        seen.append((getattr(packed, "group", None), before, _live_groups(off)))
        return out

    off._unpack = recording_unpack
    assert_exact(baseline, step(model, batch(), lambda: off))
    assert off._head_group == 8 and 8 in off._groups
    assert seen[0][0] == 8 and seen[0][2] == {8}     # the loss's unpack: the head's group alone
    first_of_last_layer = next(before for group, before, _ in seen if group == 7)
    assert 7 in first_of_last_layer                  # started before backward needed it


def test_kept_tensors_start_the_prefetch_of_the_next_groups(lora_model, baseline):
    """keep_last_layers: backward unpacks the kept last layer first; by the time it reaches the
    first offloaded group, that group's reload was already started."""
    model = twin(lora_model)
    off = _offload(model, keep_last_layers=1, prefetch_groups=1)
    first_offloaded_unpack: list[set[int]] = []
    original = off._unpack

    def recording_unpack(packed):
        live_before = _live_groups(off)
        if not isinstance(packed, torch.Tensor) and hasattr(packed, "host") \
                and not first_offloaded_unpack:
            first_offloaded_unpack.append(live_before)
        return original(packed)

    off._unpack = recording_unpack
    assert_exact(baseline, step(model, batch(), lambda: off))
    assert first_offloaded_unpack and first_offloaded_unpack[0]   # already on its way back


def test_the_head_reloads_nothing_when_the_last_layer_is_kept(lora_model, baseline):
    """With the last layer kept, the next group backward needs after the head is that kept
    layer: no offloaded group comes back during the loss's backward (the step's memory peak);
    the layer before the kept one starts coming back at the kept layer's first unpack."""
    model = twin(lora_model)
    off = _offload(model, keep_last_layers=1, prefetch_groups=1)
    seen: list[tuple[int | None, set[int]]] = []
    original = off._unpack

    def recording_unpack(packed):
        out = original(packed)
        seen.append((getattr(packed, "group", None), _live_groups(off)))
        return out

    off._unpack = recording_unpack
    assert_exact(baseline, step(model, batch(), lambda: off))
    head, last_kept = off._head_group, off._head_group - 1
    assert sorted(off._groups) == [1, 3, 5]                  # layer 4 and the head kept
    at_head = [live for group, live in seen if group is not None and group >= head]
    assert at_head and all(not live for live in at_head)    # nothing reloaded under the head
    first_kept = next(live for group, live in seen if group == last_kept)
    assert 5 in first_kept                                   # the layer before: on its way


def test_keep_head_keeps_only_what_follows_the_last_layer(lora_model, baseline):
    model = twin(lora_model)
    off = _offload(model, keep_head=True)
    assert_exact(baseline, step(model, batch(), lambda: off))
    s = off.stats()
    assert sorted(off._groups) == [1, 3, 5, 7]      # every layer offloaded, the head (8) kept
    assert s.bytes_kept_last_layers > 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_allocated_now_reads_what_memory_allocated_reads():
    from hopperlab.cuda.peaks import allocated_now

    held = torch.empty(3 << 20, device="cuda")
    index = torch.cuda.current_device()
    assert allocated_now(index) == torch.cuda.memory_allocated(index) >= held.numel() * 4


def test_reserve_window_spans_the_last_layers_backward(lora_model, monkeypatch):
    """The budget's reserve window (CUDA) stays open through the loss's and the last layer's
    backward and closes at the first unpack below the last layer; simulated here by opening it
    by hand after forward."""
    from hopperlab.memory import offload_budget as ao

    model = twin(lora_model)
    off = _offload(model, budget_bytes=1 << 40)
    monkeypatch.setattr(ao.peaks, "window_peak_allocated", lambda device: 0)
    seen: list[tuple[int, bool, bool]] = []
    original = off._prefetch_through

    def spy(group):
        before = off._window_open
        original(group)
        seen.append((group, before, off._window_open))

    off._prefetch_through = spy
    with off:
        loss = model(**batch(), use_cache=False).loss
    off._window_open = True
    loss.backward()
    last_layer = off._head_group - 1
    assert any(g >= last_layer for g, _, _ in seen)
    assert all(after for g, _, after in seen if g >= last_layer)      # open through them
    closed_at = [g for g, before, after in seen if before and not after]
    assert len(closed_at) == 1 and closed_at[0] < last_layer


@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
@pytest.mark.parametrize("keep", [{"keep_head": True}, {"keep_last_layers": 2},
                                  {"min_bytes": 1 << 40}])
def test_a_failed_step_leaves_no_activation_behind(lora_model, keep):
    """A step that fails between forward and backward (out of memory) must not keep its saved
    tensors: those kept on the device, and the small ones, are held as detached aliases (the
    tensor itself, saved by the node that made it, would close a cycle with that node)."""
    model = twin(lora_model)
    off = _offload(model, **keep)
    assert storages_left_by_a_failed_step(model, off, off) == 0
    assert off.stats().tensors_kept > 0
    # the offload still works afterwards, exactly
    assert_exact(step(model, batch()), step(model, batch(), lambda: off))


def test_remove_drops_what_an_unfinished_step_holds(lora_model):
    """``remove`` (the run's clean-up) lets go of the device tensors of an unfinished step's
    handles: the kept aliases and prefetched reloads."""
    model = twin(lora_model)
    off = _offload(model, keep_head=True)
    with off:
        loss = model(**batch(), use_cache=False).loss
    handles = [h() for h, _source in off._by_key.values()]
    kept = [h for h in handles if isinstance(h, _Kept)]
    assert kept and all(h.tensor is not None for h in kept)
    off.remove()
    assert all(h.tensor is None for h in kept)
    del loss


def test_the_pool_reuses_buffers_when_sizes_move_a_little():
    """An MoE expert's saved tensors change size with the router every step: the pool must
    serve them from the buffers of the step before, not pin new memory each step."""
    from hopperlab.memory.pinned import PinnedBufferPool, rounded_size

    pool = PinnedBufferPool(pin=False)
    sizes = [(1000_000, 1_050_000), (1_040_000, 1_010_000), (990_000, 1_060_000)]
    for step_sizes in sizes:
        bufs = [pool.acquire(n) for n in step_sizes]
        assert [b.numel() for b in bufs] == list(step_sizes)
        for b in bufs:
            pool.release(b)
    assert pool.allocations == 2 and pool.in_use_bytes == 0
    assert pool.allocated_bytes == rounded_size(1_000_000) + rounded_size(1_050_000)
    assert rounded_size(1_000_000) <= 1.125 * 1_000_000 and rounded_size(4096) == 4096
