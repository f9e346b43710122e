"""The finetune workload end to end on CPU at smoke scale: the loss falls, the records hold
the listed figures, the knobs reach the techniques, CUDA-only variants run their bookkeeping,
and the experiment file resolves at both scales."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from hopperlab.assets import materialize
from hopperlab.config.matrix import load_matrix
from hopperlab.core.rundir import Recorder, SkipRun, read_steps
from hopperlab.core.stats import percentile
from hopperlab.workloads.base import Contradiction, FakeSite, Knobs, RunView, fake_run
from hopperlab.workloads.finetune import FAMILY, FinetuneParams
from hopperlab.workloads.finetune.metrics import flops_per_token, link_floors
from hopperlab.workloads.finetune.torch.model import ModelCounts
from hopperlab.workloads.finetune.torch.techniques import Techniques
from hopperlab.workloads.finetune.torch.workload import run

ROOT = Path(__file__).resolve().parents[3]
SMOKE = FinetuneParams(weights="pretrained", dtype="float32", seq_len=128, micro_batch=8,
                       lora_rank=16, lora_alpha=64, learning_rate=0.005, warmup_steps=1,
                       measured_steps=12, data="prepared",
                       lora_targets=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                     "up_proj", "down_proj"))
ROLES = {"model": "tiny-llama", "data": "dolly-smoke-prepared", "records": "dolly-synthetic",
         "tokenizer": "tiny-tokenizer"}


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> Path:
    adir = tmp_path_factory.mktemp("assets")
    for name in ("tiny-llama", "dolly-smoke-prepared"):
        materialize(name, ROOT, adir, scale="smoke")
    return adir


def spec(assets: Path, params: FinetuneParams, run_dir: Path, **knobs) -> RunView:
    return fake_run(params, run_dir=run_dir,
                    assets={role: assets / name for role, name in ROLES.items()}, **knobs)


def run_it(assets, tmp_path, params=SMOKE, **knobs):
    rec = Recorder(tmp_path / "run")
    run(spec(assets, params, tmp_path / "run", **knobs), rec)
    rec.finish("ok")
    return rec


@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
def test_lora_loss_falls_and_metrics_are_recorded(assets, tmp_path):
    rec = run_it(assets, tmp_path)
    m = rec.metrics
    assert m["final_loss"] < 0.97 * m["first_loss"]
    for key in ("tokens_per_s", "step_time_p50_s", "step_time_p90_s", "data_wait_fraction",
                "peak_host_rss_gib", "flops_per_token", "loss_drop"):
        assert key in m and m[key] >= 0, key
    assert m["step_time_p90_s"] >= m["step_time_p50_s"]
    assert "mfu" not in m  # no GPU, no peak to divide by
    assert rec.tags["finetune.gpu_measured"] == "false"
    assert int(rec.tags["model.trainable_parameters"]) < int(rec.tags["model.parameters"])
    steps = read_steps(tmp_path / "run")
    assert len(steps) == SMOKE.warmup_steps + SMOKE.measured_steps
    assert [s["metrics"]["measured"] for s in steps[:2]] == [0.0, 1.0]
    assert {"loss", "step_time_s", "tokens_per_s", "data_wait_s"} <= set(steps[0]["metrics"])
    # the phases of a step (host clock here): each took time, together no more than the step
    phases = [m[f"{p}_s_per_step"] for p in ("forward", "backward", "optimizer")]
    assert all(t > 0 for t in phases)
    assert sum(phases) <= m["step_time_mean_s"]
    assert m["backward_s_per_step"] > m["optimizer_s_per_step"]


@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
def test_full_finetune_loss_falls_clearly(assets, tmp_path):
    m = run_it(assets, tmp_path, replace(SMOKE, method="full")).metrics
    assert m["final_loss"] < 0.85 * m["first_loss"]


@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
def test_workers_tokenize_and_give_the_same_batches(assets, tmp_path):
    materialize("dolly-synthetic", ROOT, assets, scale="smoke")
    materialize("tiny-tokenizer", ROOT, assets, scale="smoke")
    p = replace(SMOKE, data="tokenize", measured_steps=3)
    run_it(assets, tmp_path / "a", p)
    two = run_it(assets, tmp_path / "b", p, num_workers=2)
    assert two.tags["data.num_workers"] == "2"
    assert two.tags["data.source"].startswith("tokenize:")
    losses = [[s["metrics"]["loss"] for s in read_steps(d / "run")] for d in
              (tmp_path / "a", tmp_path / "b")]
    assert losses[0] == losses[1]  # same seeded order, whoever tokenizes


@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
def test_offload_records_bytes_per_step(assets, tmp_path):
    m = run_it(assets, tmp_path, replace(SMOKE, offload_min_bytes=0, measured_steps=2),
               offload="activations").metrics
    assert m["bytes_to_host_per_step"] > 0
    assert m["bytes_from_host_per_step"] == m["bytes_to_host_per_step"]


@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
def test_recompute_elementwise_moves_fewer_bytes_and_still_learns(assets, tmp_path):
    p = replace(SMOKE, offload_min_bytes=0, measured_steps=4)
    plain = run_it(assets, tmp_path / "p", p, offload="activations").metrics
    rec = run_it(assets, tmp_path / "r", replace(p, recompute_elementwise=True,
                                                 offload_keep_head=True),
                 offload="activations")
    assert rec.tags["finetune.recomputed_modules"] == "5 RMSNorms, 2 MLPs"
    assert rec.tags["finetune.recompute_elementwise"] == "true"
    lean = rec.metrics
    assert 0 < lean["bytes_to_host_per_step"] < plain["bytes_to_host_per_step"]
    assert lean["act_bytes_kept_last_layers_per_step"] > 0          # the head stayed
    assert lean["final_loss"] < lean["first_loss"]


@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
def test_chunked_loss_learns_the_same_and_offloads_less(assets, tmp_path):
    p = replace(SMOKE, offload_min_bytes=0, measured_steps=3)
    stock = run_it(assets, tmp_path / "s", p, offload="activations")
    chunked = run_it(assets, tmp_path / "c", replace(p, loss_chunk_tokens=100),
                     offload="activations")
    assert chunked.tags["finetune.chunked_loss"] == "LlamaForCausalLM, chunks of 100 tokens"
    assert chunked.tags["finetune.loss_chunk_tokens"] == "100"
    losses = [[s["metrics"]["loss"] for s in read_steps(d / "run")] for d in
              (tmp_path / "s", tmp_path / "c")]
    assert losses[1] == pytest.approx(losses[0], rel=1e-4)     # float32: summation order only
    # the stock loss saves the (tokens, vocabulary) log-probabilities; the chunked one does not
    assert chunked.metrics["bytes_to_host_per_step"] < stock.metrics["bytes_to_host_per_step"]


def test_allocator_cap_needs_a_budget():
    with pytest.raises(ValueError, match="offload_budget_caps_allocator: needs offload_budget_gib"):
        replace(SMOKE, offload_budget_caps_allocator=True)
    capped = replace(SMOKE, offload_budget_gib=1.0, offload_budget_caps_allocator=True)
    assert capped.offload_budget_caps_allocator


def test_allocator_cap_without_cuda_is_tagged_and_refused_with_managed(assets, tmp_path):
    capped = replace(SMOKE, offload_budget_gib=1.0, offload_budget_caps_allocator=True,
                     measured_steps=2)
    rec = run_it(assets, tmp_path / "c", capped, offload="activations")
    assert rec.tags["finetune.allocator_cap"] == "none: no CUDA device"
    assert rec.tags["finetune.offload_budget_caps_allocator"] == "true"
    with pytest.raises(Contradiction, match="not with memory: managed"):
        FAMILY.engine_of(capped).check(Knobs(offload="activations", memory="managed"), capped)


def test_offload_staging_is_checked_and_refused_under_a_budget():
    with pytest.raises(ValueError, match="offload_staging: expected one of host, device"):
        replace(SMOKE, offload_staging="disk")
    with pytest.raises(ValueError, match="offload_staging: device keeps the copies in GPU"):
        replace(SMOKE, offload_staging="device", offload_budget_gib=40.0)


def test_device_staging_runs_and_is_tagged_as_a_diagnostic(assets, tmp_path):
    rec = run_it(assets, tmp_path, replace(SMOKE, offload_staging="device", measured_steps=2),
                 offload="activations")
    assert "staging on the device: a diagnostic" in rec.tags["finetune.activation_offload"]
    assert rec.metrics["bytes_to_host_per_step"] > 0


def test_loss_chunk_tokens_must_be_positive():
    with pytest.raises(ValueError, match="loss_chunk_tokens: expected a whole number"):
        replace(SMOKE, loss_chunk_tokens=0)


def test_recompute_elementwise_refuses_compile():
    with pytest.raises(ValueError, match="recompute_elementwise: not with compile"):
        replace(SMOKE, recompute_elementwise=True, compile=True)


@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
def test_cuda_only_variants_run_their_bookkeeping(assets, tmp_path):
    managed = run_it(assets, tmp_path / "m", replace(SMOKE, measured_steps=2), memory="managed")
    assert managed.tags["finetune.managed"].startswith("not installed: no CUDA device")
    fp8 = run_it(assets, tmp_path / "f", replace(SMOKE, measured_steps=2), precision="fp8")
    assert int(fp8.tags["finetune.fp8_linears"]) == 2 * 7  # 2 layers x 7 frozen projections
    assert fp8.tags["finetune.compiled_layers"] == "2 (eager)"
    # issue 28, item 11: what a CPU run of the variant leaves out is said in its record
    assert "inductor code generation" in fp8.tags["finetune.compile_skipped"]
    assert "emulated on the CPU" in fp8.tags["finetune.fp8_matmul"]


def test_missing_data_becomes_synthetic_only_when_allowed(assets, tmp_path):
    p = replace(SMOKE, data="tokenize", measured_steps=2)
    bad = spec(assets, p, tmp_path, num_workers=0)
    bad.assets = {"model": "tiny-llama", "records": "nope", "tokenizer": "nope"}
    from hopperlab.core.errors import AssetMissing

    def missing(role):
        if role == "model":
            return assets / "tiny-llama"
        raise AssetMissing(role)
    bad.asset_path = missing
    with pytest.raises(AssetMissing):
        run(bad, Recorder(tmp_path / "x"))
    bad.params = replace(p, synthetic_if_missing=True)
    rec = Recorder(tmp_path / "y")
    run(bad, rec)
    assert rec.tags["data.source"] == "synthetic (asset nope,nope not built)"


def test_mcore_engine_without_megatron_core_is_skipped(assets, tmp_path, monkeypatch):
    import sys

    from hopperlab.workloads.finetune import McoreParams
    from hopperlab.workloads.finetune.mcore import engine

    # a None in sys.modules makes the import fail, as where megatron-core is not installed
    monkeypatch.setitem(sys.modules, "megatron", None)
    monkeypatch.setitem(sys.modules, "megatron.core", None)
    s = spec(assets, McoreParams(data="synthetic"), tmp_path)
    s.site = FakeSite(assets_dir=str(assets))
    with pytest.raises(SkipRun, match="megatron-core is not importable"):
        engine.run(s, Recorder(tmp_path / "n"))


@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
def test_a_peer_can_take_the_frozen_weights_and_still_train(assets, tmp_path):
    """``prepare``, ``TorchRun.adapt``, ``train``: the seam the benchmark's peers use; here
    accelerate's cpu_offload on every frozen linear module of the layers (the parameter
    offload's public peer), with checkpointing; the adapters keep training."""
    import torch
    from accelerate import cpu_offload

    from hopperlab.workloads.finetune.torch.workload import prepare, train

    taken = []

    def peer(model, layers):
        for layer in layers:
            for module in list(layer.modules()):
                if isinstance(module, torch.nn.Linear) and not module.weight.requires_grad:
                    cpu_offload(module, execution_device=torch.device("cpu"))
                    taken.append(module)
        return model
    peer.__name__ = "accelerate.cpu_offload(frozen linears)"
    params = replace(SMOKE, checkpointing=True)
    rec = Recorder(tmp_path / "run")
    job = prepare(spec(assets, params, tmp_path / "run"), params, rec)
    job.adapt(peer)
    final = train(job)
    rec.finish("ok")
    assert taken and all(m.weight.device.type == "meta" for m in taken)
    assert rec.tags["finetune.adapt_model"] == "accelerate.cpu_offload(frozen linears)"
    assert final["final_loss"] < 0.97 * final["first_loss"]


def test_flop_formula():
    """Causal attention: half of the 12 L d T square, the count of the sharded engine too."""
    c = ModelCounts(total=1100, trainable=100, matmul=1000, layers=2, hidden=8, vocab=10)
    assert flops_per_token(c, 16, "full") == 6 * 1000 + 12 * 2 * 8 * 16 / 2
    assert flops_per_token(c, 16, "lora") == 4 * 900 + 6 * 100 + 12 * 2 * 8 * 16 / 2
    assert percentile([1, 2, 3, 4], 50) == 2.5 and percentile([5], 90) == 5


def test_link_floors_of_an_offload_step():
    # the fourth series' offload of everything: 34.1 GB out, the same back, 1.247 s a step
    final = {"bytes_to_host_per_step": 34.1e9, "bytes_from_host_per_step": 34.1e9,
             "step_time_p50_s": 1.247}
    f = link_floors(final, h2d_gbps=55.0, d2h_gbps=55.0, two_phase=True)
    assert f["link_floor_s"] == pytest.approx(0.62)
    assert f["link_two_phase_s"] == pytest.approx(1.24)
    assert f["step_over_link_floor"] == pytest.approx(1.247 / 0.62)
    assert f["step_over_link_two_phase"] == pytest.approx(1.247 / 1.24)
    assert f["link_h2d_gbps"] == f["link_d2h_gbps"] == 55.0
    # parameter streaming: host -> device only, the slower direction decides
    streamed = {"bytes_to_host_per_step": 0.0, "bytes_from_host_per_step": 130.06e9,
                "step_time_p50_s": 2.433}
    g = link_floors(streamed, h2d_gbps=55.4, d2h_gbps=60.0, two_phase=False)
    assert g["link_floor_s"] == pytest.approx(130.06 / 55.4)
    assert "link_two_phase_s" not in g and "step_over_link_two_phase" not in g
    assert g["step_over_link_floor"] == pytest.approx(2.433 / (130.06 / 55.4))


def test_the_host_link_is_judged_only_where_bytes_are_counted():
    def tech(offload, **kw):
        return Techniques(Knobs(offload=offload), replace(SMOKE, **kw), "cpu", cuda=False)
    assert tech("activations").uses_host_link and tech("parameters").uses_host_link
    assert not tech("activations", activation_offload="save_on_cpu").uses_host_link
    assert not tech("activations", offload_staging="device").uses_host_link
    assert not tech("none").uses_host_link


@pytest.mark.parametrize("bad", [{"method": "qlora"}, {"lora_rank": 0}, {"measured_steps": 1},
                                 {"offload_budget_gib": 0.0}, {"data": "hub"},
                                 {"managed_advise": "yes"}, {"num_layers": 0}])
def test_params_are_checked(bad):
    with pytest.raises(ValueError):
        FinetuneParams(**bad)


@pytest.mark.parametrize("scale", ["smoke", "full"])
def test_experiments_resolve(scale):
    matrix = load_matrix(ROOT, {"families": ["finetune"], "scale": scale})
    runs = matrix.runs
    # bf16-compile (the reference of lora-llama2-7b/fp8), two managed-oversubscribed (issue 21),
    # four sharded full fine-tunes (issue 20), seven MoE fine-tunes (issue 19: five techniques,
    # two layer counts), four NeMo-backend peers of lora-llama2-7b (issue 39); and the sweep
    # (issue 49): 4 techniques at each micro-batch of its scale
    swept = [s for s in runs.values() if s.experiment == "lora-sweep"]
    assert len(runs) - len(swept) <= 36
    assert len(swept) == 4 * (2 if scale == "smoke" else 5)
    assert {s.experiment for s in runs.values()} == {
        "lora-llama2-7b", "full-llama2-7b", "lora-llama2-70b", "full-1b", "full-llama2-13b-sharded",
        "moe-sft", "lora-sweep"}
    soc = runs["finetune/lora-llama2-7b/save-on-cpu"]
    assert soc.knobs.offload == "activations" and soc.params.activation_offload == "save_on_cpu"
    assert runs["finetune/lora-llama2-70b/offload-both"].knobs.offload == "both"
    assert runs["finetune/full-1b/fp8"].knobs.precision == "fp8"
    base = runs["finetune/lora-llama2-7b/baseline"]
    if scale == "full":
        assert (base.params.seq_len, base.params.micro_batch, base.params.lora_rank) == \
            (2048, 4, 32)
        assert base.resources.gpus == 1 and base.params.weights == "random"
        assert runs["finetune/lora-llama2-7b/offload-budget"].params.offload_budget_gib == 40.0
        lean = runs["finetune/lora-llama2-7b/offload-budget-recompute"].params
        assert lean.offload_budget_gib == 40.0 and lean.recompute_elementwise
        assert lean.expandable_segments and lean.offload_budget_caps_allocator
        assert lean.loss_chunk_tokens == 1024
    else:
        assert base.resources.gpus == 0 and base.params.dtype == "float32"
    assert set(FAMILY.supported_knobs) == {"num_workers", "offload", "memory", "precision",
                                           "profiler"}
    json.dumps(base.to_dict(), default=str)


def test_torch_profiler_traces_the_measured_steps(assets, tmp_path):
    run_it(assets, tmp_path, replace(SMOKE, measured_steps=2), profiler="torch")
    trace = tmp_path / "run" / "artifacts" / "profile" / "torch_trace.json"
    names = {e.get("name") for e in json.loads(trace.read_text())["traceEvents"]}
    assert {"step", "forward", "backward", "optimizer", "data.wait"} <= names


def test_repeats_are_windows_of_measured_steps_after_one_warm_up(assets, tmp_path):
    """repeats: 3 builds the model once and measures 3 x measured_steps (issue 29)."""
    from hopperlab.run import repeats
    from hopperlab.workloads.finetune import FAMILY as FT

    s = spec(assets, replace(SMOKE, measured_steps=2), tmp_path / "run")
    s.repeats, s.headline_metrics = 3, FT.headline_metrics
    rec = Recorder(tmp_path / "run")
    repeats.measure(run, s, rec, FT)
    assert len(rec.samples) == 3 and rec.tags["repeat_unit"] == "windows"
    assert all(smp["measured_steps"] == 2 for smp in rec.samples)
    assert rec.metrics["tokens_per_s_n"] == 3
    assert len(read_steps(tmp_path / "run")) == SMOKE.warmup_steps + 6
