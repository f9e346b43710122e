"""Parameter offload keeps at most its slots and resident layers of frozen weights on the device:
during a step (forward, checkpoint recomputation, backward) and when the technique is taken away.

The 70b run (offload: both, checkpointing, resident_layers 0, prefetch 1) measured a peak of
40 layers' weights on the GPU: ``Techniques.close()`` (``ParameterOffload.remove()``) copied every
streamed layer to the device before the workload read ``max_memory_allocated``. On the CPU that
copy is invisible (``Tensor.to("cpu")`` of a host tensor is the tensor itself), so ``remove()`` is
checked with the compute device swapped for ``meta``, a device that is not the host. The step itself is checked by
an independent probe: every storage that holds a frozen weight and is not a host buffer, alive at
once (weak references), found by content in every op of forward and backward.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from torch.multiprocessing.reductions import StorageWeakRef  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402

from hopperlab.memory.layers import decoder_layers  # noqa: E402
from hopperlab.memory.parameter_offload import ParameterOffload  # noqa: E402
from hopperlab.workloads.finetune import FinetuneParams  # noqa: E402
from hopperlab.workloads.finetune.torch import model as model_mod  # noqa: E402
from hopperlab.workloads.finetune.torch.loop import forward_backward, to_device  # noqa: E402
from hopperlab.workloads.base import Knobs  # noqa: E402
from hopperlab.workloads.finetune.torch.techniques import Techniques  # noqa: E402

from tests.memory_helpers import architecture_dir  # noqa: E402

LAYERS = 6
CONFIG = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
          "num_hidden_layers": LAYERS, "num_attention_heads": 4, "num_key_value_heads": 2,
          "vocab_size": 256, "max_position_embeddings": 128, "tie_word_embeddings": False}
#: the 70b variant's techniques, at toy size (float32: CPU)
PARAMS = FinetuneParams(weights="random", dtype="float32", lora_rank=4, lora_alpha=8, seq_len=32,
                        micro_batch=1, offload_min_bytes=0, checkpointing=True,
                        resident_layers=0, prefetch_layers=1)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return architecture_dir(tmp_path_factory.mktemp("tiny-arch"), CONFIG)


@pytest.fixture(scope="module")
def batch():
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, CONFIG["vocab_size"], (1, 32), generator=g)
    return {"input_ids": ids, "labels": ids.clone()}


def prepared(model_dir, params: FinetuneParams, device: str = "cpu") -> tuple[Any, Techniques]:
    """The model as the finetune workload builds it for parameter offload, techniques applied."""
    tech = Techniques(Knobs(offload="both"), params, torch.device(device), cuda=False)
    model, _ = model_mod.build_host_layers_model(model_dir, params, "cpu")
    model = model_mod.make_trainable(model, params)
    tech.prepare_model(model, decoder_layers(model))
    return model, tech


class FrozenWeightProbe(TorchDispatchMode):
    """The most bytes of storages holding frozen weights (2-D, recognised by content, not by
    address) alive at once, host buffers excepted: what the step keeps of them on the device."""

    def __init__(self, weights: list[torch.Tensor], host: set[int]):
        super().__init__()
        self.weights: dict[tuple[int, ...], list[torch.Tensor]] = {}
        for w in weights:
            self.weights.setdefault(tuple(w.shape), []).append(w.detach().clone())
        self.host = host
        self.storages: dict[int, tuple[StorageWeakRef, int]] = {}
        self.peak = 0

    def _is_weight(self, t: torch.Tensor) -> bool:
        for cand in (t, t.t()):
            if any(torch.equal(cand, w) for w in self.weights.get(tuple(cand.shape), ())):
                return True
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten((args, kwargs, out))[0]:
            if not isinstance(t, torch.Tensor) or t.dim() != 2 or t.device.type != "cpu":
                continue
            storage = t.untyped_storage()
            ptr = storage.data_ptr()
            seen = self.storages.get(ptr)
            if ptr in self.host or (seen is not None and not seen[0].expired()):
                continue
            if self._is_weight(t):
                self.storages[ptr] = (StorageWeakRef(storage), storage.nbytes())
        live = sum(n for ref, n in self.storages.values() if not ref.expired())
        self.peak = max(self.peak, live)
        return out


def probe_for(tech: Techniques) -> FrozenWeightProbe:
    """A probe for the offload's frozen weights: their values from the host buffers (streamed
    layers) and from the parameters themselves (resident layers)."""
    po: ParameterOffload = tech._param_offload
    weights = [po._host[i][e.param.dtype][e.offset:e.offset + e.numel].view(e.shape)
               for i, layer in enumerate(po._entries) for entries in layer.values()
               for e in entries if len(e.shape) == 2]
    for layer in po.layers[po.n_streamed:]:
        weights += [p for p in layer.parameters() if not p.requires_grad and p.dim() == 2]
    host = {h.untyped_storage().data_ptr() for layer in po._host for h in layer.values()}
    return FrozenWeightProbe(weights, host)


def layer_bytes(po: ParameterOffload) -> int:
    s = po.stats()
    return s.slot_bytes // s.slots


@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
@pytest.mark.parametrize("checkpointing", [True, False])
@pytest.mark.parametrize("resident,prefetch", [(0, 1), (1, 1), (0, 2)])
def test_step_keeps_only_slots_and_resident_layers(model_dir, batch, checkpointing, resident,
                                                   prefetch):
    params = replace(PARAMS, checkpointing=checkpointing, resident_layers=resident,
                     prefetch_layers=prefetch)
    model, tech = prepared(model_dir, params)
    po: ParameterOffload = tech._param_offload
    bound = (resident + prefetch + 1) * layer_bytes(po)
    inputs = to_device(batch, torch.device("cpu"))
    forward_backward(model, inputs, tech.forward_context)          # warm-up: slots filled
    model.zero_grad(set_to_none=True)
    probe = probe_for(tech)
    with probe:
        forward_backward(model, inputs, tech.forward_context)
    stats = tech.step_stats()
    assert 0 < probe.peak <= bound
    assert stats["param_peak_device_bytes"] <= bound
    # the slots and the resident layers' frozen weights, nothing beyond
    assert stats["param_peak_device_bytes"] == stats["param_device_bytes"]
    assert stats["param_layer_fetches"] > 0
    assert stats["param_peak_device_bytes"] == (po.n_slots + resident) * layer_bytes(po)
    tech.close()                     # what the workload does before it reads the peak
    after = po.stats()
    assert after.peak_device_bytes <= bound
    assert after.device_bytes == resident * layer_bytes(po)      # the slots are released


def test_close_leaves_host_weights_on_the_host(model_dir, batch):
    """``remove()`` (``Techniques.close()``) must not copy the streamed layers to the device:
    there they would all be at once (the 70b run's 68.7 GiB peak). On the CPU such a copy is the
    identity, so the compute device is swapped for ``meta`` (not the host) before closing: a copy
    to it would show, as the streamed weights ending there (or failing to)."""
    model, tech = prepared(model_dir, PARAMS)
    reference, _ = model_mod.build_host_layers_model(model_dir, PARAMS, "cpu")
    po: ParameterOffload = tech._param_offload
    forward_backward(model, to_device(batch, torch.device("cpu")), tech.forward_context)
    po.device = torch.device("meta")
    tech.close()
    host = {h.untyped_storage().data_ptr() for layer in po._host for h in layer.values()}
    for layer, ref in zip(decoder_layers(model), decoder_layers(reference)):
        frozen = {n: p for n, p in layer.named_parameters() if not p.requires_grad}
        ref_frozen = dict(ref.named_parameters())
        assert frozen
        for name, p in frozen.items():
            assert p.device.type == "cpu", name
            assert p.untyped_storage().data_ptr() in host, name     # a view, not a copy
            assert torch.equal(p, ref_frozen[name.replace(".base_layer", "")]), name
    s = po.stats()
    assert s.device_bytes == 0 and s.peak_device_bytes == 2 * layer_bytes(po)   # slots released


@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
def test_probe_and_counter_catch_fetched_copies_kept_for_backward(model_dir, batch, monkeypatch):
    """The check has teeth: a fetch that hands out fresh copies instead of slot views, which
    autograd keeps for backward (every layer's, until backward reaches it), breaks both the
    probe's and the counter's bound."""
    fetch, unpack = ParameterOffload._fetch, ParameterOffload.unpack

    def fetch_copies(self: ParameterOffload, j: int) -> None:
        fetch(self, j)
        for entries in self._entries[j].values():
            for e in entries:
                e.param.data = e.param.data.clone()

    def keep_copies(self: ParameterOffload, t: torch.Tensor) -> Any:
        # a saved frozen parameter itself would follow its .data: keep its copy instead
        return t.detach() if isinstance(t, torch.nn.Parameter) and not t.requires_grad else None

    monkeypatch.setattr(ParameterOffload, "_fetch", fetch_copies)
    monkeypatch.setattr(ParameterOffload, "try_pack", keep_copies)
    monkeypatch.setattr(ParameterOffload, "unpack", lambda self, packed: packed if isinstance(
        packed, torch.Tensor) else unpack(self, packed))
    params = replace(PARAMS, checkpointing=False)
    model, tech = prepared(model_dir, params)
    po: ParameterOffload = tech._param_offload
    bound = 2 * layer_bytes(po)
    inputs = to_device(batch, torch.device("cpu"))
    forward_backward(model, inputs, tech.forward_context)
    model.zero_grad(set_to_none=True)
    probe = probe_for(tech)
    with probe:
        forward_backward(model, inputs, tech.forward_context)
    assert probe.peak > bound
    assert tech.step_stats()["param_peak_device_bytes"] > bound
    tech.close()
