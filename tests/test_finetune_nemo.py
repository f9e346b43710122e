"""The NeMo backend: the command it builds from a run's knobs and params, and the parser of
NeMo's step lines (on a log written for this test). NeMo itself cannot run here."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from hopperlab.core.rundir import SkipRun
from hopperlab.workloads.finetune import FinetuneParams
from hopperlab.workloads.finetune.nemo import (nemo_command, parse_log, run_nemo,
                                               summarize_log)
from hopperlab.workloads.base import FakeSite, Knobs, fake_run

LOG = Path(__file__).parent / "data" / "finetune" / "nemo_lora_llama2_7b.log"
PARAMS = FinetuneParams(backend="nemo", seq_len=2048, micro_batch=4, warmup_steps=2,
                        measured_steps=10, lora_rank=32, lora_alpha=64)


def _args(cmd: list[str]) -> dict[str, str]:
    return dict(a.split("=", 1) for a in cmd if "=" in a)


def test_baseline_command_is_the_lora_recipe_on_dolly():
    cmd = nemo_command(PARAMS, Knobs(), experiment_dir="/r/nemo")
    assert cmd[:5] == ["nemo", "llm", "finetune", "--factory", "llama2_7b"]
    args = _args(cmd)
    assert args["data"] == "dolly"
    assert args["data.seq_length"] == "2048"
    assert args["data.micro_batch_size"] == "4" and args["data.global_batch_size"] == "4"
    assert args["data.num_workers"] == "0"
    assert args["trainer.max_steps"] == "12"
    assert args["peft.dim"] == "32" and args["peft.alpha"] == "64"
    assert args["peft.target_modules"] == "[linear_qkv,linear_proj]"
    assert args["trainer.plugins"] == "bf16_mixed"
    assert not any(a.startswith("model.config.cpu_offloading") for a in cmd)
    assert all(isinstance(a, str) for a in cmd)  # an argument list, never a shell string


def test_knobs_map_onto_nemo_settings():
    args = _args(nemo_command(PARAMS, Knobs(num_workers=4, offload="activations",
                                            precision="fp8"), experiment_dir="/r"))
    assert args["data.num_workers"] == "4"
    assert args["model.config.cpu_offloading"] == "True"
    assert args["model.config.cpu_offloading_num_layers"] == "31"  # < 32 layers (Megatron)
    assert args["model.config.cpu_offloading_activations"] == "True"
    assert args["model.config.cpu_offloading_weights"] == "False"
    assert args["trainer.plugins"] == "bf16_with_fp8_mixed"
    both = _args(nemo_command(PARAMS, Knobs(offload="both"), experiment_dir="/r"))
    assert both["model.config.cpu_offloading_weights"] == "True"
    ckpt = _args(nemo_command(replace(PARAMS, checkpointing=True), Knobs(), experiment_dir="/r"))
    assert ckpt["model.config.recompute_granularity"] == "full"


def test_what_nemo_cannot_do_is_refused():
    with pytest.raises(ValueError, match="managed"):
        nemo_command(PARAMS, Knobs(memory="managed"), experiment_dir="/r")
    with pytest.raises(ValueError, match="lora"):
        nemo_command(replace(PARAMS, method="full"), Knobs(), experiment_dir="/r")
    with pytest.raises(ValueError, match="no NeMo equivalent"):
        nemo_command(replace(PARAMS, lora_targets=("qkv",)), Knobs(), experiment_dir="/r")


def test_log_parser_reads_both_line_forms():
    steps = parse_log(LOG.read_text().splitlines())
    assert [s.step for s in steps] == list(range(12))
    assert steps[0].step_s == pytest.approx(9.812)
    assert steps[8].step_s == pytest.approx(0.703)  # the progress-bar form
    assert steps[8].loss == pytest.approx(1.760)
    assert steps[11].step_s == pytest.approx(0.701)  # exponent notation


def test_log_summary_excludes_warmup():
    steps = parse_log(LOG.read_text().splitlines())
    out = summarize_log(steps, warmup_steps=2, tokens_per_step=4 * 2048)
    assert out["measured_steps"] == 10
    assert out["step_time_p50_s"] == pytest.approx(0.7015)  # the 9.8 s first step is out
    assert out["tokens_per_s"] == pytest.approx(8192 / 0.7015, rel=1e-3)
    assert out["first_loss"] == pytest.approx(2.105) and out["final_loss"] == pytest.approx(1.69)
    with pytest.raises(ValueError, match="warm-up"):
        summarize_log(steps, warmup_steps=12, tokens_per_step=1)


def test_without_the_image_the_run_is_skipped(tmp_path, monkeypatch):
    monkeypatch.delenv("HOPPERLAB_IMAGE", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no apptainer / singularity
    spec = fake_run(PARAMS, run_dir=tmp_path, site=FakeSite(assets_dir=str(tmp_path)))
    with pytest.raises(SkipRun, match="nemo image"):
        run_nemo(spec, PARAMS, recorder=None)
