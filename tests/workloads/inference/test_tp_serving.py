"""The tensor-parallel serving path on one CPU process at float64: the static-cache decode step
(the one a GPU replays as a CUDA graph) gives the logits of prefilling the longer prompt, the
server's greedy tokens are the reference's; and the floors from recorded inputs."""

from __future__ import annotations

import pytest
import torch

from hopperlab.workloads.inference import tensor_parallel as tp
from hopperlab.workloads.inference.tp_floor import (NodeRates, TPShape, decode_floor_s,
                                                    layers_that_fit, prefill_allreduce_floor_s,
                                                    prefill_floor_s)

SHAPE = tp.Shape(hidden=64, heads=8, kv_heads=2, ffn=96, vocab=128, layers=3)


def _model() -> tp.TPDecoder:
    return tp.build(SHAPE, seed=4, dtype=torch.float64, device="cpu", cuda=False)


@pytest.mark.parametrize("kv_slice", [4, 256])
def test_decode_steps_through_the_static_cache_equal_prefilling_the_whole_sequence(
        monkeypatch, kv_slice):
    monkeypatch.setattr(tp, "KV_SLICE", kv_slice)  # 4: the weighted sum in 4 slices of 4
    model = _model()
    seq = torch.randint(0, SHAPE.vocab, (2, 10), generator=torch.Generator().manual_seed(2))
    whole = model.prefill(seq, model.new_cache(2, 10), last_only=False)
    cache = model.new_cache(2, 16)  # longer than needed: the tail must be masked out
    model.prefill(seq[:, :7], cache)
    for pos in range(7, 10):
        step = model.decode_step(seq[:, pos:pos + 1], cache, torch.tensor([pos]))
        torch.testing.assert_close(step[:, 0], whole[:, pos], rtol=1e-10, atol=1e-10)


def test_the_server_generates_the_greedy_tokens_of_the_reference():
    model = _model()
    prompts = torch.randint(0, SHAPE.vocab, (3, 5), generator=torch.Generator().manual_seed(3))
    server = tp.Server(model, batch=3, max_len=9, graphs=False)
    server.prefill(prompts)
    first = server.token.clone()
    server.decode(3)
    seq = torch.cat([prompts, first], dim=1)
    for _ in range(3):  # reference: prefill the whole sequence again for every token
        nxt = model.prefill(seq, model.new_cache(3, seq.shape[1])).argmax(-1)
        seq = torch.cat([seq, nxt], dim=1)
    assert torch.equal(server.generated(3), seq[:, 6:])
    # a second request through the same server and cache gives the same answer again
    server.prefill(prompts)
    server.decode(3)
    assert torch.equal(server.generated(3), seq[:, 6:])


def test_blocks_hold_only_their_slice_and_fused_projections_are_whole():
    model = _model()
    blk = model.blocks[0]
    d = SHAPE.head_dim
    assert blk.qkv.shape == ((SHAPE.heads + 2 * SHAPE.kv_heads) * d, SHAPE.hidden)
    assert blk.gate_up.shape == (2 * SHAPE.ffn, SHAPE.hidden)
    assert model.weight_bytes() == (SHAPE.layers * SHAPE.layer_params
                                    + 2 * SHAPE.vocab * SHAPE.hidden) * 8


# the 70B at TP 4 on a node measured at 4,000 GB/s HBM, 700 TFLOP/s, 20 us / 2 ms all-reduces
B70 = TPShape(hidden=8192, heads=64, kv_heads=8, ffn=28672, vocab=32000, layers=80, world=4,
              dtype_bytes=2)
RATES = NodeRates(hbm_gbps=4000.0, matmul_tflops=700.0, allreduce_decode_s=20e-6,
                  allreduce_prefill_s=2e-3)


def test_decode_floor_is_bytes_over_hbm_plus_the_all_reduces():
    per_block = 8192 * 128 * (2 * 64 + 2 * 8) + 3 * 8192 * 28672
    weights = (80 * per_block // 4 + 32000 * 8192) * 2
    kv_per_token = 2 * 80 * (8 // 4) * 128 * 2
    assert B70.weight_read_bytes() == weights
    assert B70.kv_bytes(1, 1) == kv_per_token
    expected = (weights + kv_per_token * 31292) / 4000e9 + 160 * 20e-6
    assert decode_floor_s(B70, RATES, 1, 31292) == pytest.approx(expected)
    assert 0.0115 < expected < 0.0135  # ~35 GB a rank read per token: about 12.5 ms


def test_prefill_floor_is_flops_over_the_matmul_rate():
    t = 31242
    per_block = (8192 * 128 * (2 * 64 + 2 * 8) + 3 * 8192 * 28672) // 4
    flops = 2 * t * per_block * 80 + 2 * 16 * t * t * 128 * 80 + 2 * 8192 * 32000
    assert B70.prefill_flops(1, t) == pytest.approx(flops)
    assert prefill_floor_s(B70, RATES, 1, t) == pytest.approx(flops / 700e12)
    assert prefill_allreduce_floor_s(B70, RATES) == pytest.approx(160 * 2e-3)


def test_layers_that_fit_follow_the_free_memory():
    one = TPShape(8192, 64, 8, 28672, 32000, 80, 1, 2)
    assert layers_that_fit(B70, 140 * 2**30, 1, 31342) == 80  # TP 4: all of them
    on_h200 = layers_that_fit(one, 140 * 2**30, 1, 31342)
    on_h100 = layers_that_fit(one, 79 * 2**30, 1, 31342)
    assert 0 < on_h100 < on_h200 < 80
    assert layers_that_fit(one, 1 * 2**30, 1, 31342) == 0


def test_the_timed_requests_record_the_work_their_window_holds(tmp_path):
    """Issue 36: J per generated token of a TP run = the window's joules (every rank's GPU) /
    the tokens its timed requests generated, not the mean power over the p50 decode rate."""
    from hopperlab.config.energy import energy_basis, energy_figures
    from hopperlab.core import energy_names as N
    from hopperlab.core.rundir import Recorder
    from hopperlab.workloads.base import fake_run
    from hopperlab.workloads.inference import FAMILY, InferenceParams
    from hopperlab.workloads.inference import tp_serving

    params = InferenceParams(study="tensor-parallel", model_shape="tiny", dtype="float32",
                             prompt_tokens=12, decode_tokens=4, requests=3, warmup=1,
                             concurrency=2)
    rec = Recorder(tmp_path / "run", identity={"family": "inference"})
    tp_serving.run(fake_run(params), rec, params)
    record = rec.finish("ok")
    m = record["metrics"]
    assert m["measured_generated_tokens"] == 3 * 2 * 4      # requests x concurrency x tokens
    assert m["measured_first_tokens"] == 3 * 2
    assert len([s for s in (tmp_path / "run" / "steps.jsonl").read_text().splitlines()]) == 3
    metrics = {**m, N.ENERGY_GPU_J: 240.0, N.ENERGY_WINDOW_S: 2.0}
    assert energy_basis(metrics, FAMILY.work_units).startswith("work done: 24 units")
    figures = energy_figures(metrics, FAMILY.work_units)
    assert figures["energy_per_1m_generated_tokens_j"] == pytest.approx(240.0 / 24 * 1e6)
    assert figures["energy_per_1k_first_tokens_j"] == pytest.approx(240.0 / 6 * 1e3)


def test_repeats_are_windows_of_timed_requests_on_the_one_built_model(tmp_path, monkeypatch):
    """repeats=3: the model is built once and its requests timed in 3 windows (3 samples, each
    window's own figures; the run's work done is every window's), not 3 rebuilds."""
    from hopperlab.core.rundir import Recorder, read_samples
    from hopperlab.run.repeats import measure
    from hopperlab.workloads.base import fake_run
    from hopperlab.workloads.inference import FAMILY, InferenceParams
    from hopperlab.workloads.inference import workload

    builds = []
    real_build = tp.build
    monkeypatch.setattr(tp, "build", lambda *a, **k: builds.append(1) or real_build(*a, **k))
    params = InferenceParams(study="tensor-parallel", model_shape="tiny", dtype="float32",
                             prompt_tokens=8, decode_tokens=3, requests=2, warmup=1)
    rec = Recorder(tmp_path / "run", identity={"family": "inference"})
    measure(workload.run, fake_run(params, repeats=3), rec, FAMILY)
    record = rec.finish("ok")
    assert len(builds) == 1
    assert record["tags"]["repeat_unit"] == "windows" and record["tags"]["repeats"] == "3"
    samples = read_samples(tmp_path / "run")
    assert len(samples) == 3
    assert all(s["measured_generated_tokens"] == 2 * 1 * 3 for s in samples)
    m = record["metrics"]
    assert m["measured_generated_tokens"] == 3 * 2 * 3        # every window's, summed
    assert m["request_latency_ms_p50_n"] == 3
    steps = [s["step"] for s in map(__import__("json").loads,
                                    (tmp_path / "run" / "steps.jsonl").read_text().splitlines())]
    assert steps == list(range(6))                           # one step per timed request


def test_the_tokens_counted_are_the_tokens_generated_inside_the_energy_window(tmp_path,
                                                                               monkeypatch):
    """Issue 36: the TP run's work done is what its server generated while the measured window
    was open (every window of a repeated run, summed; the warm-up request outside), counted
    here at the server's prefill and decode steps, not from the params."""
    from hopperlab.config.energy import energy_basis, energy_figures
    from hopperlab.core import energy_names as N
    from hopperlab.core.rundir import Recorder
    from hopperlab.core.window import MEASURED, listening
    from hopperlab.run.repeats import measure
    from hopperlab.workloads.base import fake_run
    from hopperlab.workloads.inference import FAMILY, InferenceParams
    from hopperlab.workloads.inference import workload

    events: list[str] = []
    tokens = {True: 0, False: 0}      # by whether the window was open
    firsts = {True: 0, False: 0}
    real_prefill, real_decode = tp.Server.prefill, tp.Server.decode

    def is_open() -> bool:
        return bool(events) and events[-1] == "start"

    def prefill(self, prompts):
        tokens[is_open()] += prompts.shape[0]
        firsts[is_open()] += prompts.shape[0]
        real_prefill(self, prompts)

    def decode(self, steps):
        tokens[is_open()] += steps * self.batch
        real_decode(self, steps)

    monkeypatch.setattr(tp.Server, "prefill", prefill)
    monkeypatch.setattr(tp.Server, "decode", decode)
    params = InferenceParams(study="tensor-parallel", model_shape="tiny", dtype="float32",
                             prompt_tokens=8, decode_tokens=5, requests=2, warmup=1,
                             concurrency=3)
    rec = Recorder(tmp_path / "run", identity={"family": "inference"})
    with listening(lambda event, name: events.append(event) if name == MEASURED else None):
        measure(workload.run, fake_run(params, repeats=2), rec, FAMILY)
    m = rec.finish("ok")["metrics"]
    assert events == ["start", "end"] * 2
    assert tokens[False] > 0                   # the warm-up ran, outside the windows
    assert m["measured_generated_tokens"] == tokens[True]
    assert m["measured_first_tokens"] == firsts[True]
    joules = 90.0
    metrics = {**m, N.ENERGY_GPU_J: joules, N.ENERGY_WINDOW_S: 3.0}
    assert energy_basis(metrics, FAMILY.work_units).startswith(f"work done: {tokens[True]:g}")
    figures = energy_figures(metrics, FAMILY.work_units)
    assert figures["energy_per_1m_generated_tokens_j"] == pytest.approx(
        joules / tokens[True] * 1e6)
    assert figures["energy_per_1k_first_tokens_j"] == pytest.approx(joules / firsts[True] * 1e3)
