"""The kv-cache study on the CPU: a reloaded cache equals the saved one, and greedy tokens after a
reload or a recompute are those of the resident cache; plus the pieces (host arena, LRU policy,
the layer-by-layer wait order) and the family's params and matrix."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hopperlab.core.rundir import Recorder  # noqa: E402
from hopperlab.workloads.base import RunView, fake_run  # noqa: E402
from hopperlab.workloads.inference import InferenceParams  # noqa: E402
from hopperlab.workloads.inference.generation import decode, prefill  # noqa: E402
from hopperlab.memory.host_arena import HostArena  # noqa: E402
from hopperlab.workloads.inference.kv_cache import (  # noqa: E402
    caches_equal,
    layer_tensors,
    make_layerwise_ready_cache,
    new_cache,
)
from hopperlab.workloads.inference.kv_policies import KvCachePolicy  # noqa: E402
from hopperlab.workloads.inference.layered_reload import PinnedHostStore  # noqa: E402
from hopperlab.workloads.inference.managed_kv import ManagedStore  # noqa: E402
from hopperlab.workloads.inference.runtime import probe  # noqa: E402
from hopperlab.workloads.inference.weight_streaming import decoder_layers  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> Path:
    from hopperlab.assets import materialize

    adir = tmp_path_factory.mktemp("assets")
    materialize("tiny-llama", ROOT, adir, scale="smoke")
    return adir


@pytest.fixture(scope="module")
def model(assets):
    from hopperlab.workloads.inference.model import load_run_model

    m, _ = load_run_model(assets / "tiny-llama", "cpu", "float32", 0)
    return m


@pytest.fixture()
def rt():
    return probe(torch, want_gpu=False)


def _spec(assets: Path, tmp: Path, memory: str = "device", profiler: str = "none",
          **params) -> RunView:
    return fake_run(InferenceParams(**params), run_dir=tmp, assets={"model": assets / "tiny-llama"},
                    memory=memory, profiler=profiler)


def _run(assets: Path, tmp: Path, name: str, memory: str = "device", profiler: str = "none",
         **params) -> dict:
    from hopperlab.workloads.inference.workload import run

    rec = Recorder(tmp / name, identity={"key": f"inference/kv-cache/{name}"})
    run(_spec(assets, tmp, memory, profiler, **params), rec)
    out = rec.finish("ok")
    out["replies"] = json.loads((tmp / name / "artifacts" / "replies.json").read_text())
    return out


def _filled_cache(model, tokens: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, model.config.vocab_size, (1, tokens), generator=g)
    cache = new_cache()
    with torch.inference_mode():
        prefill(model, ids, cache)
    return cache


# --------------------------------------------------------------------------- correctness
DIALOGUE = dict(study="kv-cache", sessions=3, rounds=3, context_tokens=40, turn_tokens=9,
                reply_tokens=6, gpu_sessions=1, warmup=0, dtype="float32", seed=3)


@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
def test_tokens_after_reload_and_recompute_equal_resident(assets, tmp_path):
    runs = {
        "resident": _run(assets, tmp_path, "resident", policy="resident", **DIALOGUE),
        "offload": _run(assets, tmp_path, "offload", policy="offload", **DIALOGUE),
        "offload-serial": _run(assets, tmp_path, "offload-serial", policy="offload",
                               layered_reload=False, **DIALOGUE),
        "recompute": _run(assets, tmp_path, "recompute", policy="recompute", **DIALOGUE),
        "managed": _run(assets, tmp_path, "managed", memory="managed", policy="offload",
                        **DIALOGUE),
    }
    reference = runs["resident"]["replies"]
    assert set(reference) == {"0", "1", "2"}
    assert all(len(r) == 3 and all(len(t) == 6 for t in r) for r in reference.values())
    for name, out in runs.items():
        assert out["replies"] == reference, name
    # the policies did what they are named for: with one GPU slot and three sessions every
    # resumed round (2 rounds x 3 sessions) is a reload or a recompute
    assert runs["resident"]["metrics"]["evictions"] == 0
    assert runs["resident"]["metrics"]["reloads"] == 0
    for name in ("offload", "offload-serial", "managed"):
        m = runs[name]["metrics"]
        assert m["reloads"] == 6 and m["recomputes"] == 0, name
        assert m["reload_bytes"] > 0 and m["host_cache_bytes_peak"] > 0, name
    assert runs["recompute"]["metrics"]["recomputes"] == 6
    assert runs["recompute"]["metrics"]["host_cache_bytes_peak"] == 0
    assert runs["resident"]["metrics"]["sessions_served"] == 3
    # the resident policy holds all three caches on the "GPU", the others at most two
    assert runs["resident"]["metrics"]["gpu_cache_bytes_peak"] > \
        runs["offload"]["metrics"]["gpu_cache_bytes_peak"]


def test_torch_profiler_trace_names_the_pipeline(assets, tmp_path):
    params = {**DIALOGUE, "sessions": 2, "rounds": 2, "context_tokens": 16, "reply_tokens": 3}
    _run(assets, tmp_path, "prof", profiler="torch", policy="offload", **params)
    trace = (tmp_path / "prof" / "artifacts" / "profile" / "torch_trace.json").read_text()
    for name in ("pipeline.prefill", "pipeline.decode", "offload.copy", "offload.prefetch"):
        assert f'"{name}"' in trace, name


@pytest.mark.parametrize("layered", [True, False])
def test_reloaded_cache_equals_saved(model, rt, layered):
    cache = _filled_cache(model, 23)
    saved = [(k.clone(), v.clone()) for k, v in layer_tensors(cache)]
    store = PinnedHostStore(rt, HostArena(pinned=False, chunk_bytes=2**16))
    copy = store.save(layer_tensors(cache))
    assert store.held_bytes == sum(2 * k.numel() * k.element_size() for k, _ in saved)
    with torch.inference_mode():  # the device copy is gone or reused: nothing may alias it
        for k, v in layer_tensors(cache):
            k.fill_(7.0)
            v.fill_(-7.0)
    reload = store.load(copy, layered=layered)
    reloaded = layer_tensors(reload.cache)
    assert caches_equal(reloaded, saved)
    assert not caches_equal(reloaded, layer_tensors(cache))
    assert reload.cache.get_seq_length() == 23
    assert reload.nbytes == store.held_bytes
    reload.finish(rt)
    assert store.held_bytes == 0
    assert store.arena.held_bytes == 0


def test_managed_store_roundtrip_emulated_on_cpu(model, rt):
    cache = _filled_cache(model, 17, seed=1)
    saved = [(k.clone(), v.clone()) for k, v in layer_tensors(cache)]
    store = ManagedStore(rt, allow_oversubscription=False)
    assert store.emulated
    copy = store.save(layer_tensors(cache))
    reload = store.load(copy, layered=True)
    assert caches_equal(layer_tensors(reload.cache), saved)
    reload.finish(rt)
    assert store.held_bytes == 0


def test_reload_then_generate_equals_uninterrupted(model, rt):
    """The same conversation, with and without an eviction in between: same greedy tokens."""
    g = torch.Generator().manual_seed(5)
    ctx = torch.randint(4, model.config.vocab_size, (1, 30), generator=g)
    turn = torch.randint(4, model.config.vocab_size, (1, 7), generator=g)
    with torch.inference_mode():
        a = new_cache()
        first = prefill(model, ctx, a)
        reply_a = decode(model, first, a, 5)
        b = new_cache()
        reply_b = decode(model, prefill(model, ctx, b), b, 5)
        store = PinnedHostStore(rt, HostArena(pinned=False, chunk_bytes=2**16))
        reload = store.load(store.save(layer_tensors(b)), layered=True)
        nxt = torch.cat([reply_a[:, -1:], turn], dim=1)
        out_a = decode(model, prefill(model, nxt, a), a, 6)
        out_b = decode(model, prefill(model, nxt, reload.cache), reload.cache, 6)
    assert torch.equal(reply_a, reply_b)
    assert torch.equal(out_a, out_b)


# --------------------------------------------------------------------------- the pieces
def test_layerwise_cache_waits_for_each_layer_just_before_its_attention(model, rt):
    """Layer i's wait comes after layer i-1 ran: the prefill is not held for the whole cache."""
    log: list[str] = []
    fake_rt = SimpleNamespace(compute_waits=lambda event: log.append(f"wait {event}"))
    cache = _filled_cache(model, 11)
    layers = [(k.clone(), v.clone()) for k, v in layer_tensors(cache)]
    ready = [f"e{i}" for i in range(len(layers))]
    lw = make_layerwise_ready_cache(layers, ready, fake_rt)
    hooks = [m.register_forward_pre_hook(lambda mod, args, i=i: log.append(f"layer {i}"))
             for i, m in enumerate(decoder_layers(model))]
    try:
        with torch.inference_mode():
            prefill(model, torch.tensor([[5, 6, 7]]), lw)
    finally:
        for h in hooks:
            h.remove()
    n = len(layers)
    assert log == [x for i in range(n) for x in (f"layer {i}", f"wait e{i}")]
    assert lw._pending == {}
    assert lw.get_seq_length() == 14


def test_host_arena_reuses_power_of_two_chunks():
    arena = HostArena(pinned=False, chunk_bytes=4096)
    a = arena.block()
    x = a.empty((100,), torch.float32)  # 400 B
    y = a.empty((10, 10), torch.float64)  # 800 B, same chunk, aligned
    assert y.data_ptr() - x.data_ptr() == 512  # slices start on 512-byte offsets in a chunk
    assert a.chunk_bytes == 4096 and arena.reserved_bytes == 4096
    big = a.empty((3000,), torch.float32)  # 12000 B: its own chunk of 16384
    assert a.chunk_bytes == 4096 + 16384
    x.fill_(1.0), y.fill_(2.0), big.fill_(3.0)
    assert float(x.sum()) == 100 and float(y.sum()) == 200  # no overlap
    a.release()
    assert arena.held_bytes == 0 and arena.peak_held_bytes == 4096 + 16384
    b = arena.block()
    b.empty((1000,), torch.uint8)
    b.empty((3000,), torch.float32)
    assert arena.reserved_bytes == 4096 + 16384  # both chunks reused, nothing new pinned
    with pytest.raises(ValueError):
        HostArena(pinned=False, chunk_bytes=3000)


class _CountingStore:
    held_bytes = 0

    def __init__(self):
        self.saved, self.dropped = [], []

    def save(self, layers):
        self.saved.append(layers)
        return len(self.saved) - 1

    def load(self, copy, layered):
        return SimpleNamespace(cache=f"reloaded {copy}", layered=layered)

    def drop(self, copy):
        self.dropped.append(copy)


def test_policy_keeps_the_most_recent_sessions():
    store = _CountingStore()
    cache = new_cache()
    p = KvCachePolicy("offload", capacity=2, store=store, layered=True)
    for s in (0, 1, 2):
        assert p.resume(s, has_history=False).cache is None
        p.park(s, cache)
    assert p.evictions == 1 and len(store.saved) == 1  # session 0 left
    assert p.resume(2, True).cache is cache  # still on the GPU
    r0 = p.resume(0, True)
    assert r0.cache == "reloaded 0" and r0.reload.layered is True
    p.park(2, cache)
    p.park(0, cache)
    assert p.evictions == 2  # session 1, the least recently used
    p.end(1)
    assert store.dropped == [1]

    resident = KvCachePolicy("resident", capacity=1)
    for s in range(5):
        resident.park(s, cache)
    assert resident.evictions == 0
    recompute = KvCachePolicy("recompute", capacity=1)
    recompute.park(0, cache)
    recompute.park(1, cache)
    r = recompute.resume(0, has_history=True)
    assert r.cache is None and r.recompute
    with pytest.raises(ValueError):
        KvCachePolicy("offload", capacity=1, store=None)


# --------------------------------------------------------------------------- params, matrix
@pytest.mark.parametrize("bad", [
    {"study": "chat"}, {"policy": "swap"}, {"sessions": 0}, {"turn_tokens": 1.5},
    {"resident_fractions": [1.5]}, {"batch_sizes": [0]}, {"pinned_gbps": 0},
    {"streamer": "accelerate"},  # a weight-streaming peer in the kv-cache study
    {"study": "weight-streaming", "streamer": "accelerate", "resident_fractions": [0.5, 0.25]},
    {"warmup": -1}, {"dtype": "int8"},
])
def test_params_refuse_bad_values(bad):
    with pytest.raises(ValueError):
        InferenceParams(**bad)


def test_managed_knob_only_with_offload():
    from hopperlab.workloads.base import Contradiction, Knobs
    from hopperlab.workloads.inference import check

    check(Knobs(memory="managed"), InferenceParams(policy="offload"))
    for params in (InferenceParams(policy="recompute"), InferenceParams(study="weight-streaming")):
        with pytest.raises(Contradiction, match="managed"):
            check(Knobs(memory="managed"), params)


def test_matrix_resolves_the_smoke_runs():
    from hopperlab.config.matrix import load_matrix

    matrix = load_matrix(ROOT, {"families": "inference", "scale": "smoke"})
    keys = sorted(matrix.runs)
    assert len(keys) <= 14  # 8 single-GPU studies + the 6 tensor-parallel rows (TP 4, 2, 1)
    assert "inference/kv-cache/offload" in keys and "inference/weight-streaming/accelerate" in keys
    managed = matrix.get("inference/kv-cache/managed")
    assert managed.knobs.memory == "managed" and managed.params.policy == "offload"
    # the tensor-parallel study builds its 70B shape in the job: it names no model asset
    studies = [s for s in matrix.runs.values() if s.experiment != "tp-long-context"]
    assert all(s.assets == {"model": "tiny-llama"} for s in studies)
    full = load_matrix(ROOT, {"families": "inference", "scale": "full"})
    assert all(s.assets["model"] == "llama-2-7b-random" for s in full.runs.values()
               if s.experiment != "tp-long-context")
    assert full.get("inference/weight-streaming/stream").params.resident_fractions == \
        (0.75, 0.5, 0.25)


@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
def test_repeats_are_windows_on_one_loaded_model(assets, tmp_path):
    """repeats: 2 loads the model once and serves the sessions twice (issue 29)."""
    from hopperlab.run import repeats
    from hopperlab.workloads.inference import FAMILY as INF
    from hopperlab.workloads.inference.workload import run

    s = _spec(assets, tmp_path, policy="offload")
    s.repeats, s.headline_metrics = 2, INF.headline_metrics
    rec = Recorder(tmp_path / "run")
    repeats.measure(run, s, rec, INF)
    assert len(rec.samples) == 2 and "model_load_s" not in rec.samples[0]
    assert rec.metrics["ttft_ms_p50_n"] == 2


# --------------------------------------------------------------------------- energy's work done
def test_a_kv_cache_window_counts_every_reply_token_and_one_first_token_a_round():
    """Issue 36: a round generates its whole reply inside the window (the prefill's first token,
    then the decode steps), as the other studies count; ``decode_tokens`` leaves the first out."""
    from hopperlab.workloads.inference.dialogue import RoundRecord
    from hopperlab.workloads.inference.workload import kv_window_work

    records = [RoundRecord(session=s, round=r, how="fresh", cached_tokens=0, prefill_tokens=9,
                           ttft_s=0.1, decode_s=0.2, decode_tokens=4, reply=[7] * 5)
               for s in range(2) for r in range(3)]
    assert kv_window_work(records) == {"measured_generated_tokens": 6 * 5.0,
                                       "measured_first_tokens": 6.0}


@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
def test_the_tokens_counted_are_the_tokens_generated_inside_the_energy_window(
        assets, tmp_path, monkeypatch):
    """The kv-cache run's work done is what its model generated while the measured window was
    open (the warm-up sessions outside), counted at the prefill and decode calls; J per unit =
    the window's joules / those tokens."""
    from hopperlab.config.energy import energy_figures
    from hopperlab.core import energy_names as N
    from hopperlab.workloads.inference import FAMILY
    from hopperlab.workloads.inference import dialogue
    from tests.workloads.inference.generated_tokens import TokensByWindow

    counted = TokensByWindow(monkeypatch, dialogue)
    tokens, firsts = counted.tokens, counted.firsts
    params = {**DIALOGUE, "sessions": 2, "rounds": 2, "context_tokens": 16, "reply_tokens": 4,
              "warmup": 1}
    with counted.listen():
        m = _run(assets, tmp_path, "work", policy="offload", **params)["metrics"]
    assert counted.events == ["start", "end"]
    assert tokens[False] > 0                   # the warm-up sessions, outside the window
    assert m["measured_generated_tokens"] == tokens[True] == 2 * 2 * 4
    assert m["measured_first_tokens"] == firsts[True] == 2 * 2
    joules = 40.0
    figures = energy_figures({**m, N.ENERGY_GPU_J: joules, N.ENERGY_WINDOW_S: 2.0},
                             FAMILY.work_units)
    assert figures["energy_per_1m_generated_tokens_j"] == pytest.approx(
        joules / tokens[True] * 1e6)
    assert figures["energy_per_1k_first_tokens_j"] == pytest.approx(joules / firsts[True] * 1e3)
