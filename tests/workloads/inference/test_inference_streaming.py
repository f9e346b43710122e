"""Weight streaming on the CPU: logits with the double buffer (and with accelerate's offload
hooks) equal those of the whole model resident, at every split, over prefill and decode."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hopperlab.core.rundir import Recorder  # noqa: E402
from hopperlab.workloads.base import fake_run  # noqa: E402
from hopperlab.workloads.inference import InferenceParams  # noqa: E402
from hopperlab.workloads.inference.generation import forward_last  # noqa: E402
from hopperlab.memory.host_arena import HostArena  # noqa: E402
from hopperlab.workloads.inference.kv_cache import new_cache  # noqa: E402
from hopperlab.workloads.inference.runtime import probe  # noqa: E402
from hopperlab.workloads.inference.weight_streaming import (LayerStreamer,  # noqa: E402
                                                            decoder_layers, module_bytes,
                                                            resident_layer_count)

ROOT = Path(__file__).resolve().parents[3]
LAYERS = 4


def _small_llama(seed: int = 0):
    config = transformers.LlamaConfig(
        vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=LAYERS,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(config).eval()


def _logits_over_steps(model, ids, steps: int = 4) -> list:
    """Prefill logits, then the logits of ``steps`` greedy decode steps (one forward each)."""
    out = []
    cache = new_cache()
    with torch.inference_mode():
        logits = forward_last(model, ids, cache)
        out.append(logits.clone())
        for _ in range(steps):
            logits = forward_last(model, logits.argmax(-1, keepdim=True), cache)
            out.append(logits.clone())
    return out


@pytest.fixture()
def rt():
    return probe(torch, want_gpu=False)


IDS = torch.tensor([[3, 14, 15, 92, 65, 35, 89, 79], [2, 71, 82, 81, 82, 84, 59, 4]])


@pytest.mark.parametrize("resident", [0, 1, 2, 3])  # 4, 3 (odd: wraps onto one buffer), 2, 1
def test_streamed_logits_equal_resident(rt, resident):
    model = _small_llama()
    reference = _logits_over_steps(model, IDS)
    arena = HostArena(pinned=False, chunk_bytes=2**16)
    streamer = LayerStreamer(model, rt, arena, resident).attach()
    streamed = LAYERS - resident
    assert streamer.n_streamed == streamed
    # the streamed layers' weights now live in the two buffers (the memory saving is real)
    spans = [(b.data_ptr(), b.data_ptr() + b.numel()) for b in streamer.buffers]
    for k, module in enumerate(decoder_layers(model)[resident:]):
        lo, hi = spans[k % 2]
        assert all(lo <= p.data_ptr() < hi for p in module.parameters())
    got = _logits_over_steps(model, IDS)
    for a, b in zip(reference, got):
        assert torch.equal(a, b)
    # every forward moved every streamed layer once (and one copy is issued ahead)
    per_forward = sum(module_bytes(m) for m in decoder_layers(model)[resident:])
    assert streamer.bytes_per_forward() == per_forward
    forwards = len(got)
    assert streamer.bytes_copied == forwards * per_forward + streamer.layer_bytes[0]
    streamer.detach()
    assert arena.held_bytes == 0
    again = _logits_over_steps(model, IDS)
    for a, b in zip(reference, again):
        assert torch.equal(a, b)


def test_streaming_detects_a_wrong_buffer(rt):
    """The check above can fail: a streamer that skips one copy gives other logits."""
    model = _small_llama()
    reference = _logits_over_steps(model, IDS, steps=1)
    streamer = LayerStreamer(model, rt, HostArena(pinned=False, chunk_bytes=2**16),
                             1).attach()
    real = streamer._prefetch
    skipped = []

    def skip_layer_two(k):
        if k == 2 and not skipped:  # leave layer 2's weights as layer 0's (same buffer)
            skipped.append(k)
            streamer.pending.add(k)
            return
        real(k)

    streamer._prefetch = skip_layer_two
    got = _logits_over_steps(model, IDS, steps=1)
    assert not torch.equal(reference[0], got[0])


def test_resident_layer_count():
    assert resident_layer_count(32, 0.5) == 16
    assert resident_layer_count(32, 0.75) == 24
    assert resident_layer_count(32, 0.0) == 0
    assert resident_layer_count(32, 1.0) == 32
    assert resident_layer_count(2, 0.5) == 1


def test_accelerate_dispatch_gives_the_same_logits(rt):
    pytest.importorskip("accelerate")
    from hopperlab.workloads.inference.accelerate_peer import device_map_for, dispatch_offloaded

    model = _small_llama(seed=1)
    reference = _logits_over_steps(model, IDS)
    dm = device_map_for(model, 2, 0)
    assert dm["model.layers.1"] == 0 and dm["model.layers.2"] == "cpu"
    assert {"model.embed_tokens", "model.norm", "lm_head"} <= set(dm)
    dispatched, streamed = dispatch_offloaded(model, rt, 2)
    assert streamed == sum(module_bytes(m) for m in decoder_layers(model)[2:])
    assert hasattr(decoder_layers(dispatched)[3], "_hf_hook")  # accelerate's hooks are on
    got = _logits_over_steps(dispatched, IDS)
    for a, b in zip(reference, got):
        assert torch.equal(a, b)


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> Path:
    from hopperlab.assets import materialize

    adir = tmp_path_factory.mktemp("assets")
    materialize("tiny-llama", ROOT, adir, scale="smoke")
    return adir


@pytest.mark.parametrize("streamer", ["double-buffer", "accelerate"])
def test_workload_records_the_sweep(assets, tmp_path, streamer):
    from hopperlab.workloads.inference.workload import run

    fractions = [1.0, 0.5] if streamer == "double-buffer" else [0.5]
    params = InferenceParams(study="weight-streaming", streamer=streamer,
                             resident_fractions=fractions, batch_sizes=[1, 2], prompt_tokens=8,
                             decode_tokens=3, warmup=1, dtype="float32")
    spec = fake_run(params, run_dir=tmp_path, assets={"model": assets / "tiny-llama"})
    rec = Recorder(tmp_path / "run")
    run(spec, rec)
    out = rec.finish("ok")
    m = out["metrics"]
    assert m["tokens_per_s_r50_b1"] > 0 and m["tokens_per_s_r50_b2"] > 0
    assert m["bytes_streamed_per_forward"] > 0
    assert "floor_fraction" not in m  # no link on a CPU node: no floor claimed
    assert out["tags"]["inference.target"] == "host"
    if streamer == "double-buffer":
        assert m["tokens_per_s_r100_b1"] > 0
    steps = (tmp_path / "run" / "steps.jsonl").read_text().splitlines()
    assert len(steps) == len(fractions) * 2


def test_the_tokens_counted_are_the_tokens_generated_inside_the_energy_window(
        assets, tmp_path, monkeypatch):
    """Issue 36: a weight-streaming run's work done is every token its model generated while
    the measured window was open (every point, each point's warm-up too: it runs inside),
    counted at the prefill and decode calls, and its first tokens."""
    from hopperlab.workloads.inference import workload
    from tests.workloads.inference.generated_tokens import TokensByWindow

    counted = TokensByWindow(monkeypatch, workload)
    tokens, firsts = counted.tokens, counted.firsts
    params = InferenceParams(study="weight-streaming", resident_fractions=[1.0, 0.5],
                             batch_sizes=[1, 2], prompt_tokens=8, decode_tokens=3, warmup=1,
                             dtype="float32")
    spec = fake_run(params, run_dir=tmp_path, assets={"model": assets / "tiny-llama"})
    rec = Recorder(tmp_path / "run")
    with counted.listen():
        workload.run(spec, rec)
    m = rec.finish("ok")["metrics"]
    assert counted.events == ["start", "end"]
    assert tokens[True] > 0 and tokens[False] == 0
    assert m["measured_generated_tokens"] == tokens[True]
    assert m["measured_first_tokens"] == firsts[True]
