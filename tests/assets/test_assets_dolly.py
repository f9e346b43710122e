"""Dolly preparation on hand-checked examples: template, tokens, loss mask, pad, pack, cache."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest

from hopperlab.assets.dolly import (
    IGNORE_INDEX,
    DollyDataset,
    PreparedDolly,
    TextTokenizer,
    encode_record,
    fit,
    pack,
    pad,
    prepare,
    prepare_cached,
    prompt_text,
)

WORDS = ["<unk>", "<s>", "</s>", "<pad>", "###", "Instruction", ":", "Context", "Response",
         "Say", "hi", "Hello", "there", ".", "Be", "kind", "Bye"]
ID = {w: i for i, w in enumerate(WORDS)}
M = IGNORE_INDEX


@pytest.fixture(scope="module")
def word_tokenizer(tmp_path_factory) -> Path:
    """One token per word or punctuation run, <s> in front: ids can be checked by hand."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    folder = tmp_path_factory.mktemp("words")
    tok = Tokenizer(models.WordLevel(vocab=ID, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A",
                                                       special_tokens=[("<s>", ID["<s>"])])
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": {"content": "</s>"}, "pad_token": "<pad>"}))
    return folder


SAY_HI = {"instruction": "Say hi", "context": "", "response": "Hello there.", "category": "x"}
WITH_CONTEXT = {"instruction": "Say hi", "context": "Be kind", "response": "Bye",
                "category": "y"}


def test_prompt_template():
    assert prompt_text("Say hi") == "### Instruction:\nSay hi\n\n### Response:\n"
    assert prompt_text(" Say hi ", "  ") == "### Instruction:\nSay hi\n\n### Response:\n"
    assert prompt_text("Say hi", "Be kind") == \
        "### Instruction:\nSay hi\n\n### Context:\nBe kind\n\n### Response:\n"


def test_loss_mask_covers_the_response_only(word_tokenizer):
    tok = TextTokenizer(word_tokenizer)
    assert (tok.bos_id, tok.eos_id, tok.pad_id) == (1, 2, 3)
    ids, labels = encode_record(tok, SAY_HI, 64)
    #        <s> ### Instruction :  Say hi ### Response :   Hello there .  </s>
    assert ids == [1, 4, 5, 6, 9, 10, 4, 8, 6, 11, 12, 13, 2]
    assert labels == [M, M, M, M, M, M, M, M, M, 11, 12, 13, 2]
    ids, labels = encode_record(tok, WITH_CONTEXT, 64)
    #        <s> ### Instruction : Say hi ### Context : Be kind ### Response : Bye </s>
    assert ids == [1, 4, 5, 6, 9, 10, 4, 7, 6, 14, 15, 4, 8, 6, 16, 2]
    assert labels == [M] * 14 + [16, 2]


def test_pad_and_pack(word_tokenizer):
    tok = TextTokenizer(word_tokenizer)
    a = encode_record(tok, SAY_HI, 64)
    b = encode_record(tok, WITH_CONTEXT, 64)
    ids, labels, mask = pad(*a, 16, tok.pad_id)
    assert ids == a[0] + [3, 3, 3]
    assert labels == a[1] + [M, M, M]
    assert mask == [1] * 13 + [0] * 3
    with pytest.raises(ValueError):
        pad(*a, 8, tok.pad_id)
    rows = pack([a, b], 16, tok.pad_id)  # 13 + 16 = 29 tokens: one full row, one of 13
    assert [r[0] for r in rows] == [(a[0] + b[0])[:16], (a[0] + b[0])[16:] + [3, 3, 3]]
    assert [r[1] for r in rows] == [(a[1] + b[1])[:16], (a[1] + b[1])[16:] + [M, M, M]]
    assert [r[2] for r in rows] == [[1] * 16, [1] * 13 + [0] * 3]


def test_truncation_keeps_response_header_bos_and_some_response():
    # the response fits: the prompt loses tokens from its front (after BOS)
    assert fit(list(range(10)), [100, 101, 102], 8, bos_id=0) == ([0, 6, 7, 8, 9],
                                                                    [100, 101, 102])
    assert fit(list(range(10)), [100, 101, 102], 8) == ([5, 6, 7, 8, 9], [100, 101, 102])
    # a long response keeps at least half the sequence, the prompt keeps the rest
    assert fit([0, 1, 2], list(range(100, 110)), 8) == ([0, 1, 2], [100, 101, 102, 103, 104])
    assert fit(list(range(10)), list(range(100, 110)), 8, bos_id=0) == (
        [0, 7, 8, 9], [100, 101, 102, 103])
    # what fits is left alone
    assert fit([0, 1], [5], 8) == ([0, 1], [5])


def test_prepare_arrays_and_statistics(word_tokenizer):
    tok = TextTokenizer(word_tokenizer)
    arrays, stats = prepare([SAY_HI, WITH_CONTEXT, SAY_HI], tok, 16, "pad")
    assert arrays["input_ids"].shape == (3, 16) and arrays["input_ids"].dtype == np.int32
    assert stats["records"] == 3 and stats["rows"] == 3
    assert stats["tokens"] == 13 + 16 + 13
    assert stats["response_tokens"] == 4 + 2 + 4
    packed, pstats = prepare([SAY_HI, WITH_CONTEXT, SAY_HI], tok, 16, "pack")
    assert packed["input_ids"].shape == (3, 16) and pstats["tokens"] == 42
    assert pstats["response_tokens"] == 10 and pstats["fill"] == round(42 / 48, 4)
    with pytest.raises(ValueError):
        prepare([SAY_HI], tok, 16, "stack")


def test_cache_is_keyed_by_tokenizer_and_parameters(word_tokenizer, tmp_path):
    records = tmp_path / "d.jsonl"
    records.write_text("".join(json.dumps(r) + "\n" for r in [SAY_HI, WITH_CONTEXT] * 5))
    cache = tmp_path / "cache"
    one = prepare_cached(records, word_tokenizer, seq_len=16, cache_dir=cache)
    stamp = (one / "meta.json").stat().st_mtime_ns
    assert prepare_cached(records, word_tokenizer, seq_len=16, cache_dir=cache) == one
    assert (one / "meta.json").stat().st_mtime_ns == stamp  # reused, not rebuilt
    assert prepare_cached(records, word_tokenizer, seq_len=32, cache_dir=cache) != one
    assert prepare_cached(records, word_tokenizer, seq_len=16, packing="pack",
                          cache_dir=cache) != one
    other_tok = tmp_path / "tok2"
    other_tok.mkdir()
    for f in word_tokenizer.iterdir():
        (other_tok / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((other_tok / "tokenizer_config.json").read_text())
    (other_tok / "tokenizer_config.json").write_text(json.dumps({**cfg, "pad_token": "<unk>"}))
    assert prepare_cached(records, other_tok, seq_len=16, cache_dir=cache) != one
    data = PreparedDolly(one)
    assert len(data) == 10 and data[1]["input_ids"].dtype == np.int64
    assert data.meta["key"]["seq_len"] == 16


def test_on_the_fly_dataset_matches_prepared_rows_in_workers(word_tokenizer):
    import torch
    from torch.utils.data import DataLoader

    records = [SAY_HI, WITH_CONTEXT] * 4
    ds = DollyDataset(records, word_tokenizer, 16)
    arrays, _ = prepare(records, TextTokenizer(word_tokenizer), 16, "pad")
    item = ds[1]
    assert item["input_ids"].tolist() == arrays["input_ids"][1].tolist()
    assert item["labels"].tolist() == arrays["labels"][1].tolist()
    assert pickle.loads(pickle.dumps(ds))._tok is None  # each worker loads its own tokenizer
    batches = list(DataLoader(ds, batch_size=4, num_workers=2))
    assert len(batches) == 2 and batches[0]["input_ids"].shape == (4, 16)
    assert torch.equal(batches[1]["labels"], torch.as_tensor(arrays["labels"][4:8],
                                                             dtype=torch.int64))
