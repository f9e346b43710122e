"""Smoke-scale assets, offline: generated Dolly records, a trained tokenizer, a tiny Llama,
the prepared data set, and a few fine-tuning steps whose loss falls."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hopperlab.assets import load_scales, materialize, read_info, verify
from hopperlab.assets.tiny import synthetic_dolly

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> Path:
    adir = tmp_path_factory.mktemp("assets")
    for name in load_scales(ROOT)["smoke"]:
        materialize(name, ROOT, adir, scale="smoke")
    return adir


def test_synthetic_records_are_seeded_and_rule_derived():
    a = list(synthetic_dolly(300, seed=5))
    assert a == list(synthetic_dolly(300, seed=5))
    assert a != list(synthetic_dolly(300, seed=6))
    assert all(set(r) == {"instruction", "context", "response", "category"} for r in a)
    assert len({r["category"] for r in a}) >= 6
    for r in a:
        if r["category"] == "classification":  # "Is X a fruit or an animal?" -> "X is a ..."
            word = r["instruction"].split()[1]
            assert r["response"].lower().startswith(word)
        if r["category"] == "creative_writing":  # reverse the words
            words = r["instruction"].split(": ")[1].split()
            assert r["response"] == " ".join(reversed(words)) + "."
        if r["category"] == "closed_qa":  # the answer is in the context
            assert r["response"].split()[-1].rstrip(".") in r["context"]


@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
def test_smoke_assets_are_complete(smoke):
    for name in load_scales(ROOT)["smoke"]:
        assert verify(smoke / name) == [], name
    assert read_info(smoke / "tiny-llama")["weights"] == "generated"
    lines = (smoke / "dolly-synthetic" / "dolly.jsonl").read_text().splitlines()
    assert len(lines) == 2000 and set(json.loads(lines[0])) == {
        "instruction", "context", "response", "category"}
    meta = json.loads((smoke / "dolly-smoke-prepared" / "meta.json").read_text())
    assert meta["seq_len"] == 128 and meta["rows"] == 2000 and meta["packing"] == "pad"
    tok = json.loads((smoke / "tiny-tokenizer" / "tokenizer.json").read_text())
    assert len(tok["model"]["vocab"]) == 512


@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
def test_tiny_tokenizer_loads_in_transformers(smoke):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(smoke / "tiny-llama"))
    ids = tok("### Instruction:\nSay the word owl two times.").input_ids
    assert ids[0] == tok.bos_token_id == 1 and tok.eos_token_id == 2
    text = "### Instruction:\nSay the word owl two times."
    assert tok.decode(ids, skip_special_tokens=True) == text
    assert len(ids) < 20  # the tokenizer learned words of this text, not bytes


@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
def test_fine_tuning_the_tiny_llama_lowers_the_loss(smoke):
    import torch
    from torch.utils.data import DataLoader
    from transformers import AutoModelForCausalLM

    from hopperlab.assets.dolly import PreparedDolly

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(str(smoke / "tiny-llama"))
    data = PreparedDolly(smoke / "dolly-smoke-prepared")
    loader = DataLoader(data, batch_size=16, shuffle=True,
                        generator=torch.Generator().manual_seed(0))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for step, batch in enumerate(loader):
        out = model(**{k: v for k, v in batch.items()})
        out.loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(out.loss.item())
        if step == 59:
            break
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < 0.6 * first, losses
    print(f"loss {first:.2f} -> {last:.2f}")
