"""The nemo backend (megatron-core): the settings its knobs map onto, the Llama shape it reads,
the tokens it hands the runner, and the parser of the runner's Megatron-LM log lines, on real
logs (tests/data/finetune/mcore_lora_*.log, each with the command that made it in
README.md there). The runner itself needs megatron-core (Python >= 3.12 on the package index):
its test is skipped where megatron.core cannot be imported (CI's Python 3.11)."""

from __future__ import annotations

import importlib.util
import json
import re
import statistics
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from hopperlab.core.rundir import SkipRun
from hopperlab.workloads.base import Knobs, fake_run
from hopperlab.workloads.finetune import McoreParams
from hopperlab.workloads.finetune.mcore import engine as nemo
from hopperlab.workloads.finetune.mcore.engine import (mcore_settings, mcore_targets, model_shape,
                                               parse_log, parse_peak_gib, run_nemo,
                                               runner_config, summarize_log, write_tokens)

DATA = Path(__file__).parents[2] / "data" / "finetune"
CPU_LOG = DATA / "mcore_lora_tiny_cpu.log"
H200_LOG = DATA / "mcore_lora_baseline_nvidiah200.log"
#: full recompute with the fix, from the same workflow call as H200_LOG
H200_RECOMPUTE_LOG = DATA / "mcore_lora_checkpointing_nvidiah200.log"
#: the pre-fix full-recompute run: backward skipped (see README.md there)
H200_DEFECT_LOG = DATA / "mcore_lora_checkpointing_defect_nvidiah200.log"
REAL_LOGS = sorted(DATA.glob("mcore_lora_*.log"))
PARAMS = McoreParams(seq_len=2048, micro_batch=4,
                     warmup_steps=3, measured_steps=10, lora_rank=32, lora_alpha=64)
LLAMA2_7B = {"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
             "num_key_value_heads": 32, "intermediate_size": 11008, "vocab_size": 32000,
             "rms_norm_eps": 1e-5, "rope_theta": 10000.0}
HAVE_MCORE = importlib.util.find_spec("megatron") is not None and \
    importlib.util.find_spec("megatron.core") is not None


def test_baseline_settings_are_bf16_without_recompute_or_offload():
    s = mcore_settings(PARAMS, Knobs(), num_layers=32, te_available=False)
    assert s["bf16"] is True and s["params_dtype"] == "bfloat16"
    assert "recompute_granularity" not in s and "cpu_offloading" not in s
    assert mcore_settings(replace(PARAMS, dtype="float32"), Knobs(), num_layers=2,
                          te_available=False)["bf16"] is False


def test_checkpointing_is_full_uniform_recompute_of_each_layer():
    s = mcore_settings(replace(PARAMS, checkpointing=True), Knobs(), num_layers=32,
                       te_available=False)
    assert (s["recompute_granularity"], s["recompute_method"], s["recompute_num_layers"]) == \
        ("full", "uniform", 1)


def test_offload_needs_transformer_engine_and_maps_onto_cpu_offloading():
    with pytest.raises(ValueError, match="needs TransformerEngine's cpu_offload"):
        mcore_settings(PARAMS, Knobs(offload="activations"), num_layers=32, te_available=False)
    s = mcore_settings(PARAMS, Knobs(offload="activations"), num_layers=32, te_available=True)
    assert s["cpu_offloading"] is True
    assert s["cpu_offloading_num_layers"] == 31  # megatron-core: fewer than num_layers
    assert s["cpu_offloading_activations"] is True and s["cpu_offloading_weights"] is False
    both = mcore_settings(PARAMS, Knobs(offload="both"), num_layers=32, te_available=True)
    assert both["cpu_offloading_weights"] is True
    with pytest.raises(ValueError, match="recomputation"):
        mcore_settings(replace(PARAMS, checkpointing=True), Knobs(offload="activations"),
                       num_layers=32, te_available=True)


@pytest.mark.parametrize("change, knobs, match", [
    ({}, {"precision": "fp8"}, "fp8 needs TransformerEngine"),
    ({}, {"memory": "managed"}, "managed"),
    ({"method": "full"}, {}, "method: expected one of lora"),  # McoreParams refuses it first
    ({"weights": "pretrained"}, {}, "weights: expected one of random"),
])
def test_what_megatron_core_cannot_do_here_is_refused_with_the_reason(change, knobs, match):
    with pytest.raises(ValueError, match=match):
        mcore_settings(replace(PARAMS, **change), Knobs(**knobs), num_layers=32,
                       te_available=False)


def test_lora_targets_are_nemos_fused_names():
    assert mcore_targets(("q_proj", "k_proj", "v_proj", "o_proj")) == ["linear_qkv",
                                                                      "linear_proj"]
    assert mcore_targets(("gate_proj", "up_proj", "down_proj")) == ["linear_fc1", "linear_fc2"]
    with pytest.raises(ValueError, match="no megatron-core equivalent"):
        mcore_targets(("qkv",))


def test_model_shape_from_a_llama_config():
    shape = model_shape(LLAMA2_7B)
    assert shape == {"num_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
                     "num_query_groups": 32, "ffn_hidden_size": 11008, "vocab_size": 32000,
                     "layernorm_epsilon": 1e-5, "rotary_base": 10000.0}
    gqa = model_shape({**LLAMA2_7B, "num_key_value_heads": 8})
    assert gqa["num_query_groups"] == 8
    with pytest.raises(ValueError, match="intermediate_size"):
        model_shape({k: v for k, v in LLAMA2_7B.items() if k != "intermediate_size"})


def test_runner_config_is_json_and_carries_the_torch_backends_run():
    cfg = runner_config(PARAMS, Knobs(), model_shape(LLAMA2_7B), tokens_path="/r/tokens.pt",
                        te_available=False)
    back = json.loads(json.dumps(cfg))
    assert back["lora"] == {"targets": ["linear_qkv", "linear_proj"], "rank": 32, "alpha": 64}
    assert (back["seq_len"], back["micro_batch"]) == (2048, 4)
    assert (back["warmup_steps"], back["measured_steps"]) == (3, 10)
    assert back["settings"]["bf16"] is True and back["tokens"] == "/r/tokens.pt"


def test_tokens_are_the_next_token_with_no_loss_on_the_last(tmp_path):
    params = replace(PARAMS, data="synthetic", seq_len=16, micro_batch=2, warmup_steps=1,
                     measured_steps=2)
    spec = fake_run(params, run_dir=tmp_path)
    path = tmp_path / "tokens.pt"
    assert write_tokens(spec, params, 50, path) == "synthetic"
    import torch

    t = torch.load(path)
    assert tuple(t["input_ids"].shape) == (3, 2, 16)
    assert torch.equal(t["labels"][..., :-1], t["input_ids"][..., 1:])
    assert bool((t["labels"][..., -1] == -100).all())


def test_parser_reads_the_cpu_log_of_the_runner():
    lines = CPU_LOG.read_text().splitlines()
    steps = parse_log(lines)
    assert [s.step for s in steps] == list(range(13))  # iterations 1..13: 1 warm-up + 12
    assert all(s.step_s > 0 and s.loss is not None for s in steps)
    first = next(ln for ln in lines if "iteration        1/" in ln)
    ms = float(re.search(r"per iteration \(ms\): ([0-9.]+)", first).group(1))
    assert steps[0].step_s == pytest.approx(ms / 1000)
    out = summarize_log(steps, warmup_steps=1, tokens_per_step=8 * 128)
    assert out["measured_steps"] == 12
    assert out["loss_drop"] > 0  # the adapters learn
    assert parse_peak_gib(lines) == {}  # no CUDA on that machine: no memory line
    with pytest.raises(ValueError, match="warm-up"):
        summarize_log(steps, warmup_steps=13, tokens_per_step=1)


def test_parser_reads_the_h200_log_of_the_runner():
    lines = H200_LOG.read_text().splitlines()
    assert "device: cuda:0 NVIDIA H200" in lines
    config = json.loads(H200_LOG.with_suffix(".config.json").read_text())
    steps = parse_log(lines)
    assert len(steps) == config["warmup_steps"] + config["measured_steps"]
    times = [float(m.group(1)) / 1000 for ln in lines
             if (m := re.search(r"per iteration \(ms\): ([0-9.]+)", ln))]
    assert [s.step_s for s in steps] == times
    tokens = config["seq_len"] * config["micro_batch"]
    out = summarize_log(steps, warmup_steps=config["warmup_steps"], tokens_per_step=tokens)
    assert out["measured_steps"] == config["measured_steps"]
    assert out["step_time_p50_s"] == pytest.approx(statistics.median(times[3:]))
    assert out["loss_drop"] > 0  # without recompute the adapters learn
    mem = next(ln for ln in lines if "memory (MB)" in ln)
    max_mb = float(re.search(r"max allocated: ([0-9.]+)", mem).group(1))
    assert parse_peak_gib(lines)["peak_gpu_allocated_gib"] == pytest.approx(max_mb / 1024)
    assert all(s.grad_norm is not None and s.grad_norm > 0 for s in steps)


def test_the_fixed_recompute_log_learns_like_the_baseline():
    """Full recompute on the H200 after the fix: every adapter gets a gradient, and recompute
    changes no number (same batches, same seed: losses and grad norms equal the baseline's)."""
    lines = H200_RECOMPUTE_LOG.read_text().splitlines()
    config = json.loads(H200_RECOMPUTE_LOG.with_suffix(".config.json").read_text())
    assert config["settings"]["recompute_granularity"] == "full"
    steps = parse_log(lines)
    assert len(steps) == config["warmup_steps"] + config["measured_steps"]
    times = [float(m.group(1)) / 1000 for ln in lines
             if (m := re.search(r"per iteration \(ms\): ([0-9.]+)", ln))]
    assert [s.step_s for s in steps] == times and all(t > 0 for t in times)
    assert all(s.grad_norm is not None and s.grad_norm > 0 for s in steps)
    tokens = config["seq_len"] * config["micro_batch"]
    out = summarize_log(steps, warmup_steps=config["warmup_steps"], tokens_per_step=tokens)
    assert out["loss_drop"] > 0 and steps[-1].loss < steps[0].loss
    assert out["step_time_p50_s"] == pytest.approx(statistics.median(times[3:]))
    base = parse_log(H200_LOG.read_text().splitlines())
    assert [s.loss for s in steps] == [s.loss for s in base]
    assert [s.grad_norm for s in steps] == [s.grad_norm for s in base]


def test_the_defective_recompute_log_shows_no_learning():
    """The record of the defect the runner now refuses: same batches as the baseline, the
    first loss equal, then no fall."""
    base = parse_log(H200_LOG.read_text().splitlines())
    bad = parse_log(H200_DEFECT_LOG.read_text().splitlines())
    assert bad[0].loss == base[0].loss
    out = summarize_log(bad, warmup_steps=3, tokens_per_step=8192)
    assert out["loss_drop"] < 0 < summarize_log(base, warmup_steps=3,
                                                 tokens_per_step=8192)["loss_drop"]


@pytest.mark.parametrize("log", REAL_LOGS, ids=lambda p: p.name)
def test_every_real_log_has_one_line_per_iteration(log):
    lines = log.read_text().splitlines()
    steps = parse_log(lines)
    total = max(int(m.group(1)) for ln in lines
                if (m := re.search(r"iteration\s+\d+/\s*(\d+)", ln)))
    assert [s.step for s in steps] == list(range(total))
    if any(ln.startswith("device: cuda") for ln in lines):
        assert parse_peak_gib(lines)["peak_gpu_allocated_gib"] > 0


def test_memory_line_in_gib():
    line = ("[Rank 0] (after 13 iterations) memory (MB) | allocated: 13000.0 | max allocated: "
            "40960.0 | reserved: 42000.0 | max reserved: 43008.0")
    assert parse_peak_gib([line]) == {"peak_gpu_allocated_gib": 40.0,
                                      "peak_gpu_reserved_gib": 42.0}


def test_without_megatron_core_the_run_is_skipped_with_the_reason(tmp_path, monkeypatch):
    # a None in sys.modules makes the import fail, as where megatron-core is not installed
    monkeypatch.setitem(sys.modules, "megatron", None)
    monkeypatch.setitem(sys.modules, "megatron.core", None)
    spec = fake_run(PARAMS, run_dir=tmp_path)
    with pytest.raises(SkipRun, match="megatron-core is not importable in Python 3"):
        run_nemo(spec, PARAMS, recorder=None)


@pytest.mark.skipif(not HAVE_MCORE, reason="megatron-core not importable (needs Python >= 3.12; "
                    "on 3.11 its cp312 wheel unpacked on PYTHONPATH imports)")
def test_the_runner_trains_adapters_of_a_tiny_megatron_gpt_with_and_without_recompute(tmp_path):
    """Under megatron's full recompute with a frozen base the loss used to have no graph and
    megatron's backward_step skipped backward: no adapter gradient, no learning (the H200's
    nemo-checkpointing run, 2026-11-28: 2x faster than no recompute, loss_drop -0.22). Recompute
    changes no number: in float32 both runs see the same losses."""
    import torch

    torch.manual_seed(0)
    ids = torch.randint(0, 64, (5, 2, 16))
    labels = torch.full_like(ids, -100)
    labels[..., :-1] = ids[..., 1:]
    torch.save({"input_ids": ids, "labels": labels}, tmp_path / "tokens.pt")
    shape = model_shape({**LLAMA2_7B, "num_hidden_layers": 2, "hidden_size": 32,
                         "num_attention_heads": 4, "num_key_value_heads": 2,
                         "intermediate_size": 64, "vocab_size": 64})
    runs = {}
    for checkpointing in (False, True):
        params = replace(PARAMS, dtype="float32", seq_len=16, micro_batch=2, warmup_steps=1,
                         measured_steps=4, lora_rank=4, lora_alpha=8, learning_rate=0.02,
                         checkpointing=checkpointing)
        cfg = runner_config(params, Knobs(), shape, tokens_path=str(tmp_path / "tokens.pt"),
                            te_available=False)
        assert ("recompute_granularity" in cfg["settings"]) is checkpointing
        config = tmp_path / f"config-{checkpointing}.json"
        config.write_text(json.dumps(cfg))
        proc = subprocess.run([sys.executable, "-m", nemo.RUNNER, str(config)],
                              capture_output=True, text=True, env=nemo._child_env(), timeout=600)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        lines = proc.stdout.splitlines()
        assert any("trainable in 4 adapters (linear_qkv,linear_proj, r=4)" in ln for ln in lines)
        steps = parse_log(lines)
        assert [s.step for s in steps] == list(range(5))
        assert all(s.grad_norm is not None and s.grad_norm > 0 for s in steps)
        assert steps[-1].loss < steps[0].loss
        runs[checkpointing] = steps
    assert [s.loss for s in runs[True]] == pytest.approx([s.loss for s in runs[False]], rel=1e-5)
    assert [s.grad_norm for s in runs[True]] == pytest.approx(
        [s.grad_norm for s in runs[False]], rel=1e-3, abs=2e-3)


def test_an_adapter_without_a_gradient_stops_the_run():
    import torch

    from hopperlab.workloads.finetune.mcore.runner import adapter_grad_norm

    a, b = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(3))
    with pytest.raises(RuntimeError, match="iteration 4: 2 of 2 adapter tensors got no gradient"):
        adapter_grad_norm([a, b], 4)
    a.grad, b.grad = torch.tensor([3.0, 0.0]), torch.tensor([0.0, 4.0, 0.0])
    assert adapter_grad_norm([a, b], 4) == pytest.approx(5.0)
    b.grad = None
    with pytest.raises(RuntimeError, match="1 of 2"):
        adapter_grad_norm([a, b], 5)


def test_grad_norm_is_read_where_the_line_has_one():
    line = (" [2026-11-28 06:00:00] iteration        2/      13 | consumed samples:            8 |"
            " elapsed time per iteration (ms): 700.5 | learning rate: 1.000000E-04 | global batch"
            " size:     4 | lm loss: 1.094736E+01 | loss scale: 1.0 | grad norm: 0.412 | number"
            " of skipped iterations:   0 | number of nan iterations:   0 |")
    (step,) = parse_log([line])
    assert (step.step, step.step_s, step.loss, step.grad_norm) == (1, 0.7005, 10.94736, 0.412)
    assert parse_log([line.replace("grad norm: 0.412 | ", "")])[0].grad_norm is None


def test_the_runners_markers_open_the_measured_window_here(tmp_path):
    from hopperlab.core.window import MEASURED, listening

    heard: list[tuple[str, str]] = []
    script = (f"print('warm-up'); print({nemo.WINDOW_START!r}); print('step');"
              f"print({nemo.WINDOW_END!r}); print('after')")
    with listening(lambda event, name: heard.append((event, name))):
        rc = nemo.run_logged([sys.executable, "-c", script], tmp_path / "log")
    assert rc == 0
    assert heard == [("start", MEASURED), ("end", MEASURED)]
    assert (tmp_path / "log").read_text().splitlines()[0] == "warm-up"
    heard.clear()
    with listening(lambda event, name: heard.append((event, name))):  # a crash inside: closed
        rc = nemo.run_logged([sys.executable, "-c", f"print({nemo.WINDOW_START!r}); exit(3)"],
                             tmp_path / "log")
    assert rc == 3 and heard == [("start", MEASURED), ("end", MEASURED)]
