"""weights: random: Llama 2 built from its architecture alone, on the meta device (no memory)."""

from __future__ import annotations

import json
from pathlib import Path

from hopperlab.assets import build_random_model
from hopperlab.cli.main import main
from hopperlab.assets.random_weights import format_count, read_architecture

ROOT = Path(__file__).resolve().parents[2]
LLAMA_7B = ROOT / "models" / "llama-2-7b" / "config.json"
LLAMA_70B = ROOT / "models" / "llama-2-70b" / "config.json"


def test_llama_2_7b_on_meta_has_6_74_billion_parameters():
    model, n = build_random_model(LLAMA_7B, "meta")
    assert n == 6_738_415_616
    assert format_count(n) == "6.74 B"
    assert all(p.is_meta for p in model.parameters())  # nothing was allocated
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.config.num_hidden_layers == 32 and model.config.hidden_size == 4096


def test_llama_2_70b_architecture():
    arch = read_architecture(LLAMA_70B)
    assert (arch["hidden_size"], arch["intermediate_size"], arch["num_hidden_layers"],
            arch["num_attention_heads"], arch["num_key_value_heads"], arch["vocab_size"]) == \
        (8192, 28672, 80, 64, 8, 32000)
    model, n = build_random_model(LLAMA_70B, "meta")
    assert n == 68_976_648_192 and format_count(n) == "68.98 B"


def test_configs_are_the_published_numbers():
    arch = json.loads(LLAMA_7B.read_text())
    assert (arch["hidden_size"], arch["intermediate_size"], arch["num_hidden_layers"],
            arch["num_attention_heads"], arch["vocab_size"], arch["max_position_embeddings"],
            arch["rms_norm_eps"]) == (4096, 11008, 32, 32, 32000, 4096, 1e-5)


def test_small_random_model_runs_on_cpu(tmp_path):
    cfg = dict(json.loads(LLAMA_7B.read_text()), hidden_size=32, intermediate_size=64,
               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, vocab_size=100)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    import torch

    model, n = build_random_model(tmp_path, "cpu", dtype="float32", seed=0)
    again, _ = build_random_model(tmp_path, "cpu", dtype="float32", seed=0)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters()))
    out = model(torch.tensor([[1, 2, 3]]))
    assert out.logits.shape == (1, 3, 100)


def test_cli_reports_the_count(capsys):
    assert main(["assets", "params", str(LLAMA_7B)]) == 0
    assert "6738415616 parameters (6.74 B)" in capsys.readouterr().out
