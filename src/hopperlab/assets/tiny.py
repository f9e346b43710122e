"""Smoke-scale stand-ins that need no network: Dolly-format records, a tokenizer, a tiny Llama.

The records are generated from templates whose response follows from the instruction (and
context) by a fixed rule, so a tiny model can learn them and a fine-tuning test can watch the
loss fall. Everything is seeded: the same definition gives the same records and tokenizer.
"""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from hopperlab.assets.dolly import prompt_text
from hopperlab.assets.registry import AssetKind, AssetSpec, BuildContext, register_kind
from hopperlab.core.errors import SpecError

DOLLY_FIELDS = ("instruction", "context", "response", "category")
RECORDS_FILE = "dolly.jsonl"
SPECIAL_TOKENS = {"unk": "<unk>", "bos": "<s>", "eos": "</s>", "pad": "<pad>"}

_NAMES = ["Ada", "Ben", "Cleo", "Dan", "Eva", "Finn", "Gus", "Hana", "Ivo", "Jill", "Kai", "Lena"]
_COLORS = ["red", "blue", "green", "yellow", "black", "white", "orange", "purple"]
_ANIMALS = ["cat", "dog", "horse", "rabbit", "fox", "owl", "goat", "duck"]
_FRUITS = ["apple", "banana", "cherry", "grape", "lemon", "mango", "pear", "plum"]
_CITIES = ["Paris", "Oslo", "Rome", "Lima", "Cairo", "Tokyo", "Quito", "Dublin"]
_JOBS = ["baker", "pilot", "nurse", "farmer", "teacher", "painter", "driver", "cook"]
_NUMBERS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine",
            "ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen",
            "seventeen", "eighteen", "nineteen", "twenty"]


# --------------------------------------------------------------------------- Dolly records
def _closed_qa(r: random.Random) -> dict[str, str]:
    a, b = r.sample(_NAMES, 2)
    ca, cb = r.sample(_COLORS, 2)
    xa, xb = r.sample(_ANIMALS, 2)
    who, color, animal = r.choice([(a, ca, xa), (b, cb, xb)])
    return {"instruction": f"What color is the {animal} of {who}?",
            "context": f"{a} has a {ca} {xa}. {b} has a {cb} {xb}.",
            "response": f"The {animal} of {who} is {color}.", "category": "closed_qa"}


def _extraction(r: random.Random) -> dict[str, str]:
    who, city, job = r.choice(_NAMES), r.choice(_CITIES), r.choice(_JOBS)
    ask_city = r.random() < 0.5
    return {"instruction": f"Where does {who} live?" if ask_city else f"What is the job of {who}?",
            "context": f"{who} lives in {city} and works as a {job}.",
            "response": f"{who} lives in {city}." if ask_city else f"{who} is a {job}.",
            "category": "information_extraction"}


def _classification(r: random.Random) -> dict[str, str]:
    word = r.choice(_FRUITS + _ANIMALS)
    group = "fruit" if word in _FRUITS else "animal"
    return {"instruction": f"Is {word} a fruit or an animal?", "context": "",
            "response": f"{word.capitalize()} is an {group}." if group == "animal"
            else f"{word.capitalize()} is a {group}.", "category": "classification"}


def _open_qa(r: random.Random) -> dict[str, str]:
    n = r.randrange(len(_NUMBERS) - 1)
    return {"instruction": f"What number comes after {_NUMBERS[n]}?", "context": "",
            "response": f"{_NUMBERS[n + 1].capitalize()} comes after {_NUMBERS[n]}.",
            "category": "open_qa"}


def _generation(r: random.Random) -> dict[str, str]:
    words = r.sample(_FRUITS + _COLORS, r.randint(3, 5))
    return {"instruction": "Write these words in reverse order: " + " ".join(words),
            "context": "", "response": " ".join(reversed(words)) + ".",
            "category": "creative_writing"}


def _brainstorming(r: random.Random) -> dict[str, str]:
    word, n = r.choice(_ANIMALS + _FRUITS), r.randint(2, 5)
    return {"instruction": f"Say the word {word} {_NUMBERS[n]} times.", "context": "",
            "response": " ".join([word] * n) + ".", "category": "brainstorming"}


def _summarization(r: random.Random) -> dict[str, str]:
    who, city, fruit, color = r.choice(_NAMES), r.choice(_CITIES), r.choice(_FRUITS), \
        r.choice(_COLORS)
    return {"instruction": f"Summarize what {who} did.",
            "context": f"{who} went to {city}. It was a sunny day. {who} bought a {color} "
                       f"{fruit} at the market.",
            "response": f"{who} went to {city} and bought a {color} {fruit}.",
            "category": "summarization"}


_TEMPLATES: tuple[Callable[[random.Random], dict[str, str]], ...] = (
    _closed_qa, _extraction, _classification, _open_qa, _generation, _brainstorming,
    _summarization)


def synthetic_dolly(n: int, seed: int) -> Iterator[dict[str, str]]:
    """``n`` Dolly-format records (instruction, context, response, category), seeded."""
    r = random.Random(seed)
    for _ in range(n):
        yield r.choice(_TEMPLATES)(r)


def write_jsonl(path: Path, records: Iterator[Mapping[str, Any]]) -> int:
    n = 0
    with open(path, "w") as fh:
        for rec in records:
            fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
            n += 1
    return n


# --------------------------------------------------------------------------- kinds: specs
@dataclass(frozen=True, kw_only=True)
class DollySyntheticSpec(AssetSpec):
    records: int = 2000
    seed: int = 0


@dataclass(frozen=True, kw_only=True)
class TinyTokenizerSpec(AssetSpec):
    vocab_size: int = 512
    #: texts to train on: records of the synthetic Dolly generator with this seed
    training_records: int = 4000
    seed: int = 1
    model_max_length: int = 512


@dataclass(frozen=True, kw_only=True)
class TinyLlamaSpec(AssetSpec):
    tokenizer: str
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 512
    seed: int = 0


# --------------------------------------------------------------------------- builds
def _build_dolly(spec: DollySyntheticSpec, ctx: BuildContext) -> dict[str, Any]:
    n = write_jsonl(ctx.out / RECORDS_FILE, synthetic_dolly(spec.records, spec.seed))
    return {"from": "generated", "records": n, "seed": spec.seed}


def training_texts(n: int, seed: int) -> Iterator[str]:
    """What the tiny tokenizer learns from: prompts and responses, as Dolly prep makes them."""
    for rec in synthetic_dolly(n, seed):
        yield prompt_text(rec["instruction"], rec["context"]) + rec["response"]


def train_tokenizer(texts: Iterator[str], vocab_size: int, out: Path,
                    model_max_length: int = 512) -> Path:
    """A byte-level BPE tokenizer (``tokenizers``) that adds ``<s>`` in front, saved so that
    both ``tokenizers.Tokenizer.from_file`` and ``transformers.AutoTokenizer`` load it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token=SPECIAL_TOKENS["unk"]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS.values()),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    bos = SPECIAL_TOKENS["bos"]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.token_to_id(bos))])
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    names = {f"{k}_token": v for k, v in SPECIAL_TOKENS.items()}
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": model_max_length,
        "add_bos_token": True, "add_eos_token": False, **names}, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(json.dumps(names, indent=2) + "\n")
    return out / "tokenizer.json"


def _build_tokenizer(spec: TinyTokenizerSpec, ctx: BuildContext) -> dict[str, Any]:
    train_tokenizer(training_texts(spec.training_records, spec.seed), spec.vocab_size, ctx.out,
                    spec.model_max_length)
    return {"from": "generated", "vocab_size": spec.vocab_size}


def _build_tiny_llama(spec: TinyLlamaSpec, ctx: BuildContext) -> dict[str, Any]:
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoConfig, AutoModelForCausalLM

    tok_dir = ctx.inputs["tokenizer"]
    tok = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    config = AutoConfig.for_model(
        "llama", vocab_size=tok.get_vocab_size(), hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size, num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings, rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=tok.token_to_id(SPECIAL_TOKENS["bos"]),
        eos_token_id=tok.token_to_id(SPECIAL_TOKENS["eos"]),
        pad_token_id=tok.token_to_id(SPECIAL_TOKENS["pad"]))
    torch.manual_seed(spec.seed)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(str(ctx.out))
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copyfile(tok_dir / name, ctx.out / name)
    n = sum(p.numel() for p in model.parameters())
    return {"from": "generated", "weights": "generated", "parameters": n, "seed": spec.seed}


def _validate_tiny_llama(spec: TinyLlamaSpec, specs: Mapping[str, AssetSpec]) -> None:
    if spec.hidden_size % spec.num_attention_heads:
        raise SpecError(f"{spec.where}.hidden_size: {spec.hidden_size} is not a multiple of "
                        f"num_attention_heads {spec.num_attention_heads}")
    if spec.num_attention_heads % spec.num_key_value_heads:
        raise SpecError(f"{spec.where}.num_key_value_heads: {spec.num_key_value_heads} must "
                        f"divide num_attention_heads {spec.num_attention_heads}")


def _validate_tokenizer(spec: TinyTokenizerSpec, specs: Mapping[str, AssetSpec]) -> None:
    if spec.vocab_size < 300:  # 256 bytes + special tokens + some merges
        raise SpecError(f"{spec.where}.vocab_size: expected at least 300 (a byte-level BPE "
                        f"needs 256 byte tokens first), got {spec.vocab_size}")


register_kind(AssetKind(
    name="dolly-synthetic", spec=DollySyntheticSpec, build=_build_dolly,
    produces=lambda spec: (RECORDS_FILE,), summary="generated Dolly-format records (smoke)"))
register_kind(AssetKind(
    name="tiny-tokenizer", spec=TinyTokenizerSpec, build=_build_tokenizer,
    produces=lambda spec: ("tokenizer.json", "tokenizer_config.json"),
    validate=_validate_tokenizer, summary="a BPE tokenizer trained on generated text (smoke)"))
register_kind(AssetKind(
    name="tiny-llama", spec=TinyLlamaSpec, build=_build_tiny_llama,
    produces=lambda spec: ("config.json", "*.safetensors", "tokenizer.json"),
    input_kinds={"tokenizer": ("tiny-tokenizer",)}, validate=_validate_tiny_llama,
    summary="a tiny randomly initialised Llama (smoke)"))
