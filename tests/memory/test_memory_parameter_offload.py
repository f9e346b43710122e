"""Parameter offload (hopperlab.memory.parameter_offload): frozen weights streamed layer by layer
give exactly the baseline's loss and gradients on CPU, alone and with activation offload and
checkpointing; the schedule streams what it should."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from hopperlab.memory.layers import decoder_layers  # noqa: E402
from hopperlab.memory.activation_offload import ActivationOffload  # noqa: E402
from hopperlab.memory.checkpointing import checkpoint_layers  # noqa: E402
from hopperlab.memory.parameter_offload import ParameterOffload  # noqa: E402

from tests.memory_helpers import (  # noqa: E402
    assert_exact, batch, step, storages_left_by_a_failed_step, twin)


@pytest.mark.parametrize("resident,prefetch", [(1, 1), (0, 1), (0, 2), (2, 1), (4, 1)])
def test_exact_gradients(lora_model, baseline, resident, prefetch):
    model = twin(lora_model)
    po = ParameterOffload(decoder_layers(model), "cpu", resident_layers=resident, prefetch=prefetch)
    assert_exact(baseline, step(model, batch(), lambda: po))
    first = po.stats()
    assert_exact(baseline, step(model, batch(), lambda: po))
    s = po.stats()
    assert s.streamed_layers == 4 - resident and s.resident_layers == resident
    if s.streamed_layers:
        assert s.slots == min(prefetch + 1, s.streamed_layers)
        assert s.host_bytes > 0 and first.bytes_streamed >= s.host_bytes   # each layer at least once
        if s.streamed_layers <= s.slots:
            assert s.bytes_streamed == 0          # they all fit: nothing moves in steady state
        else:
            assert 0 < s.bytes_streamed < 2 * s.host_bytes
    else:
        assert first.bytes_streamed == s.bytes_streamed == 0


def test_weights_are_off_device_between_uses(lora_model):
    model = twin(lora_model)
    layers = decoder_layers(model)
    po = ParameterOffload(layers, "cpu", resident_layers=1, prefetch=1)
    frozen = [p for p in layers[0].parameters() if not p.requires_grad]
    trainable = [p for p in layers[0].parameters() if p.requires_grad]
    assert frozen and trainable
    assert all(p.numel() == 0 for p in frozen)            # placeholders until the layer runs
    assert all(p.numel() > 0 for p in trainable)          # adapters stay
    assert all(p.numel() > 0 for p in layers[3].parameters())   # the resident layer
    step(model, batch(), lambda: po)
    # two slots, three streamed layers: at most two layers' weights are present at a time
    present = [i for i in range(3) if all(p.numel() > 0 for p in layers[i].parameters())]
    assert len(present) <= 2


def test_steady_state_streams_less_than_everything(lora_model):
    """Slots that still hold a layer at the turns (forward->backward, backward->forward) need
    no copy: 3 streamed layers through 2 slots cost 2 fetches a step, not 6."""
    model = twin(lora_model)
    po = ParameterOffload(decoder_layers(model), "cpu", resident_layers=1, prefetch=1)
    step(model, batch(), lambda: po)
    step(model, batch(), lambda: po)
    s = po.stats()
    per_layer = s.host_bytes // 3
    assert s.layer_fetches == 2 and s.bytes_streamed == 2 * per_layer


def test_with_activation_offload_and_checkpointing(lora_model, baseline):
    model = twin(lora_model)
    layers = decoder_layers(model)
    po = ParameterOffload(layers, "cpu", resident_layers=1, prefetch=1)
    off = ActivationOffload("cpu", min_bytes=1024, parameter_offload=po).wrap_layers(layers)
    assert_exact(baseline, step(model, batch(), lambda: off))
    assert off.stats().tensors_offloaded > 0
    checkpoint_layers(layers)
    assert_exact(baseline, step(model, batch(), lambda: off))
    assert_exact(baseline, step(model, batch(), lambda: po))      # checkpointing + parameters only


def test_checkpointing_recomputes_with_weights_present(lora_model, baseline):
    """With checkpointing the layer's weights are needed again in backward (recomputation):
    a schedule that forgot them would compute with empty placeholders and fail."""
    model = twin(lora_model)
    layers = decoder_layers(model)
    checkpoint_layers(layers)            # order of wrapping does not matter
    po = ParameterOffload(layers, "cpu", resident_layers=0, prefetch=1)
    assert_exact(baseline, step(model, batch(), lambda: po))


def test_remove_restores_weights(lora_model, baseline):
    model = twin(lora_model)
    po = ParameterOffload(decoder_layers(model), "cpu", resident_layers=1, prefetch=1)
    step(model, batch(), lambda: po)
    po.remove()
    assert all(p.numel() > 0 for p in model.parameters())
    assert_exact(baseline, step(model, batch()))


def test_refuses_bad_arguments(lora_model):
    with pytest.raises(ValueError):
        ParameterOffload(decoder_layers(twin(lora_model)), "cpu", prefetch=0)


@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
def test_a_failed_step_leaves_no_activation_behind(lora_model):
    """Alone, the parameter offload's hooks pass every activation through: as detached aliases,
    so a step that fails before backward leaves no reference cycle holding them."""
    model = twin(lora_model)
    po = ParameterOffload(decoder_layers(model), "cpu", resident_layers=1, prefetch=1)
    assert storages_left_by_a_failed_step(model, po, po) == 0
