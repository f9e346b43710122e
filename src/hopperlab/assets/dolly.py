"""Dolly records made ready for fine-tuning: prompt template, tokens, loss mask, pad or pack.

Each record becomes ``prompt + response + EOS``; the prompt is the instruction, the context
when there is one, and a response header. The loss is computed on the response only (labels
are -100 over the prompt and padding). Sequences are padded to ``seq_len`` one record each, or
packed: records concatenated and cut into ``seq_len`` chunks (records then attend across their
boundaries, the usual trade for no padding). Prepared arrays are cached on disk, keyed by the
tokenizer's files and the parameters; ``DollyDataset`` tokenizes in ``__getitem__`` instead, so
that data-loader workers have real work to do.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Literal, Mapping, Sequence

from hopperlab.assets.registry import AssetKind, AssetSpec, BuildContext, register_kind
from hopperlab.core.errors import SpecError

IGNORE_INDEX = -100
TEMPLATE_VERSION = "hopperlab-dolly-1"
PROMPT = "### Instruction:\n{instruction}\n\n### Response:\n"
PROMPT_WITH_CONTEXT = ("### Instruction:\n{instruction}\n\n### Context:\n{context}\n\n"
                       "### Response:\n")
ARRAYS = ("input_ids", "labels", "attention_mask")
META = "meta.json"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json",
                    "special_tokens_map.json", "added_tokens.json")
Packing = Literal["pad", "pack"]


# --------------------------------------------------------------------------- the template
def prompt_text(instruction: str, context: str | None = "") -> str:
    """The prompt of one record: instruction, the context if any, and the response header."""
    instruction, context = instruction.strip(), (context or "").strip()
    if context:
        return PROMPT_WITH_CONTEXT.format(instruction=instruction, context=context)
    return PROMPT.format(instruction=instruction)


def read_records(path: Path | str, max_records: int | None = None) -> list[dict[str, str]]:
    """Dolly records from a ``.jsonl`` file, or from the one ``.jsonl`` of an asset folder."""
    path = Path(path)
    if path.is_dir():
        found = sorted(path.rglob("*.jsonl"))
        if len(found) != 1:
            raise ValueError(f"{path}: expected exactly one .jsonl file of Dolly records, "
                             f"found {len(found)}")
        path = found[0]
    out = []
    with open(path) as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            rec = json.loads(line)
            if not isinstance(rec.get("instruction"), str) or not isinstance(
                    rec.get("response"), str):
                raise ValueError(f"{path}:{n}: a Dolly record needs 'instruction' and "
                                 f"'response' strings")
            out.append({"instruction": rec["instruction"], "context": rec.get("context") or "",
                        "response": rec["response"], "category": rec.get("category") or ""})
            if max_records is not None and len(out) >= max_records:
                break
    return out


# --------------------------------------------------------------------------- tokenizers
def _token_name(value: Any) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def tokenizer_fingerprint(folder: Path | str) -> str:
    """A hash of a tokenizer's files: what prepared data is keyed by."""
    h = hashlib.sha256()
    for name in _TOKENIZER_FILES:
        path = Path(folder) / name
        if path.is_file():
            h.update(name.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()[:16]


class TextTokenizer:
    """The little a Dolly preparation needs of a tokenizer, loaded from a model or tokenizer
    folder: ``tokenizer.json`` through ``tokenizers`` (fast, the same in every transformers
    version), else ``transformers.AutoTokenizer`` (e.g. a sentencepiece ``tokenizer.model``)."""

    def __init__(self, folder: Path | str) -> None:
        self.folder = Path(folder)
        config: dict[str, Any] = {}
        for name in ("special_tokens_map.json", "tokenizer_config.json"):
            path = self.folder / name
            if path.is_file():
                config.update({k: v for k, v in json.loads(path.read_text()).items()
                               if v is not None})
        self._fast = None
        self._hf = None
        if (self.folder / "tokenizer.json").is_file():
            from tokenizers import Tokenizer

            self._fast = Tokenizer.from_file(str(self.folder / "tokenizer.json"))
        else:
            from transformers import AutoTokenizer

            self._hf = AutoTokenizer.from_pretrained(str(self.folder))
        self.bos_id = self._id(_token_name(config.get("bos_token")))
        self.eos_id = self._id(_token_name(config.get("eos_token")))
        if self.eos_id is None:
            raise ValueError(f"{self.folder}: the tokenizer names no eos_token "
                             f"(tokenizer_config.json / special_tokens_map.json)")
        pad = self._id(_token_name(config.get("pad_token")))
        self.pad_id = pad if pad is not None else self.eos_id  # Llama has no pad token
        self.fingerprint = tokenizer_fingerprint(self.folder)

    def _id(self, token: str | None) -> int | None:
        if token is None:
            return None
        if self._fast is not None:
            return self._fast.token_to_id(token)
        tid = self._hf.convert_tokens_to_ids(token)
        return tid if tid != self._hf.unk_token_id or token == self._hf.unk_token else None

    @property
    def vocab_size(self) -> int:
        return self._fast.get_vocab_size() if self._fast is not None else len(self._hf)

    def encode(self, text: str, *, special: bool) -> list[int]:
        if self._fast is not None:
            return list(self._fast.encode(text, add_special_tokens=special).ids)
        return list(self._hf.encode(text, add_special_tokens=special))

    def describe(self) -> dict[str, Any]:
        return {"fingerprint": self.fingerprint, "vocab_size": self.vocab_size,
                "bos_id": self.bos_id, "eos_id": self.eos_id, "pad_id": self.pad_id}


# --------------------------------------------------------------------------- one record
def fit(prompt: Sequence[int], response: Sequence[int], seq_len: int,
        bos_id: int | None = None) -> tuple[list[int], list[int]]:
    """Cut prompt and response to at most ``seq_len`` tokens together.

    The response keeps up to ``max(seq_len - len(prompt), seq_len // 2)`` tokens (from its
    start); the prompt keeps the rest from its end (where the response header is), and its
    leading BOS.
    """
    keep_r = min(len(response), max(seq_len - len(prompt), seq_len // 2))
    keep_p = min(len(prompt), seq_len - keep_r)
    if keep_p < len(prompt):
        keeps_bos = bos_id is not None and prompt[0] == bos_id and keep_p > 1
        lead = [prompt[0]] if keeps_bos else []
        prompt = (lead + list(prompt[len(prompt) - (keep_p - len(lead)):])) if keep_p else []
    return list(prompt), list(response[:keep_r])


def encode_record(tok: TextTokenizer, record: Mapping[str, str],
                  seq_len: int) -> tuple[list[int], list[int]]:
    """``(input_ids, labels)`` of one record: labels are the ids over the response (and its
    EOS) and IGNORE_INDEX over the prompt. At most ``seq_len`` tokens, unpadded."""
    prompt = tok.encode(prompt_text(record["instruction"], record.get("context")), special=True)
    response = tok.encode(record["response"].strip(), special=False) + [tok.eos_id]
    prompt, response = fit(prompt, response, seq_len, tok.bos_id)
    return prompt + response, [IGNORE_INDEX] * len(prompt) + response


def pad(ids: Sequence[int], labels: Sequence[int], seq_len: int,
        pad_id: int) -> tuple[list[int], list[int], list[int]]:
    """Right-pad to ``seq_len``: ``(input_ids, labels, attention_mask)``."""
    n = seq_len - len(ids)
    if n < 0:
        raise ValueError(f"{len(ids)} tokens do not fit in seq_len {seq_len}")
    return (list(ids) + [pad_id] * n, list(labels) + [IGNORE_INDEX] * n,
            [1] * len(ids) + [0] * n)


def pack(examples: Iterable[tuple[Sequence[int], Sequence[int]]], seq_len: int,
         pad_id: int) -> list[tuple[list[int], list[int], list[int]]]:
    """Concatenate examples and cut into ``seq_len`` rows; the last row is padded."""
    ids: list[int] = []
    labels: list[int] = []
    for i, l in examples:
        ids.extend(i)
        labels.extend(l)
    rows = []
    for start in range(0, len(ids), seq_len):
        rows.append(pad(ids[start:start + seq_len], labels[start:start + seq_len], seq_len,
                        pad_id))
    return rows


# --------------------------------------------------------------------------- whole data sets
def prepare(records: Iterable[Mapping[str, str]], tok: TextTokenizer, seq_len: int,
            packing: Packing = "pad") -> tuple[dict[str, Any], dict[str, Any]]:
    """Arrays (``input_ids``, ``labels``, ``attention_mask``: rows x seq_len) and statistics."""
    import numpy as np

    if packing not in ("pad", "pack"):
        raise ValueError(f"packing: expected 'pad' or 'pack', got {packing!r}")
    examples = [encode_record(tok, rec, seq_len) for rec in records]
    if packing == "pad":
        rows = [pad(i, l, seq_len, tok.pad_id) for i, l in examples]
    else:
        rows = pack(examples, seq_len, tok.pad_id)
    arrays = {
        "input_ids": np.array([r[0] for r in rows], dtype=np.int32).reshape(-1, seq_len),
        "labels": np.array([r[1] for r in rows], dtype=np.int32).reshape(-1, seq_len),
        "attention_mask": np.array([r[2] for r in rows], dtype=np.uint8).reshape(-1, seq_len),
    }
    tokens = int(arrays["attention_mask"].sum())
    stats = {
        "template": TEMPLATE_VERSION, "seq_len": seq_len, "packing": packing,
        "records": len(examples), "rows": len(rows), "tokens": tokens,
        "response_tokens": int((arrays["labels"] != IGNORE_INDEX).sum()),
        "fill": round(tokens / max(1, len(rows) * seq_len), 4),
        "tokenizer": tok.describe(),
    }
    return arrays, stats


def write_prepared(out: Path, arrays: Mapping[str, Any], stats: Mapping[str, Any]) -> None:
    import numpy as np

    out.mkdir(parents=True, exist_ok=True)
    for name in ARRAYS:
        np.save(out / f"{name}.npy", arrays[name])
    (out / META).write_text(json.dumps(stats, indent=2) + "\n")


def prepare_cached(records_path: Path | str, tokenizer_dir: Path | str, *, seq_len: int,
                   packing: Packing = "pad", cache_dir: Path | str,
                   max_records: int | None = None) -> Path:
    """Prepared arrays in ``cache_dir``, made once per (records, tokenizer, parameters)."""
    records_path = Path(records_path)
    tok = TextTokenizer(tokenizer_dir)
    src = records_path if records_path.is_file() else sorted(records_path.rglob("*.jsonl"))[0]
    key = json.dumps({"template": TEMPLATE_VERSION, "seq_len": seq_len, "packing": packing,
                      "max_records": max_records, "tokenizer": tok.fingerprint,
                      "records": hashlib.sha256(src.read_bytes()).hexdigest()}, sort_keys=True)
    folder = Path(cache_dir) / f"dolly-{hashlib.sha256(key.encode()).hexdigest()[:16]}"
    if (folder / META).is_file():
        return folder
    tmp = Path(cache_dir) / f".{folder.name}.{os.getpid()}.{secrets.token_hex(4)}"
    try:
        arrays, stats = prepare(read_records(src, max_records), tok, seq_len, packing)
        write_prepared(tmp, arrays, {**stats, "key": json.loads(key)})
        try:
            os.rename(tmp, folder)
        except OSError:  # another process made it first: theirs is the same
            if not (folder / META).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


# --------------------------------------------------------------------------- datasets
class PreparedDolly:
    """A map-style dataset over prepared arrays (memory-mapped): rows of int64 numpy arrays,
    which torch's default collate turns into tensors."""

    def __init__(self, folder: Path | str) -> None:
        import numpy as np

        self.folder = Path(folder)
        self.meta = json.loads((self.folder / META).read_text())
        self._arrays = {n: np.load(self.folder / f"{n}.npy", mmap_mode="r") for n in ARRAYS}

    def __len__(self) -> int:
        return int(self._arrays["input_ids"].shape[0])

    def __getitem__(self, i: int) -> dict[str, Any]:
        import numpy as np

        return {n: np.asarray(a[i], dtype=np.int64) for n, a in self._arrays.items()}


class DollyDataset:
    """A map-style dataset that tokenizes one record in ``__getitem__`` (padded to ``seq_len``).

    The tokenizer is loaded lazily in each process, so that data-loader workers each hold
    their own and the tokenization cost lands in the workers.
    """

    def __init__(self, records: Sequence[Mapping[str, str]] | Path | str,
                 tokenizer_dir: Path | str, seq_len: int) -> None:
        self.records = records if isinstance(records, Sequence) and not isinstance(
            records, str) else read_records(records)
        self.tokenizer_dir = Path(tokenizer_dir)
        self.seq_len = seq_len
        self._tok: TextTokenizer | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_tok"] = None
        return state

    @property
    def tokenizer(self) -> TextTokenizer:
        if self._tok is None:
            self._tok = TextTokenizer(self.tokenizer_dir)
        return self._tok

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int) -> dict[str, Any]:
        import numpy as np

        tok = self.tokenizer
        ids, labels, mask = pad(*encode_record(tok, self.records[i], self.seq_len),
                                self.seq_len, tok.pad_id)
        return {"input_ids": np.array(ids, dtype=np.int64),
                "labels": np.array(labels, dtype=np.int64),
                "attention_mask": np.array(mask, dtype=np.int64)}


# --------------------------------------------------------------------------- the asset kind
@dataclass(frozen=True, kw_only=True)
class DollyPreparedSpec(AssetSpec):
    data: str  # an asset of Dolly records
    tokenizer: str  # an asset holding tokenizer files (a tokenizer or a model)
    seq_len: int = 512
    packing: Packing = "pad"
    max_records: int | None = None


def _validate(spec: DollyPreparedSpec, specs: Mapping[str, AssetSpec]) -> None:
    if spec.seq_len < 8:
        raise SpecError(f"{spec.where}.seq_len: expected at least 8, got {spec.seq_len}")
    if spec.max_records is not None and spec.max_records < 1:
        raise SpecError(f"{spec.where}.max_records: expected a positive number")
    tok = specs.get(spec.tokenizer)
    if tok is not None and getattr(tok, "weights", None) == "random":
        raise SpecError(f"{spec.where}.tokenizer: {spec.tokenizer!r} has weights: random and so "
                        f"no tokenizer files; name a tokenizer asset (kind hf-tokenizer)")


def _build(spec: DollyPreparedSpec, ctx: BuildContext) -> dict[str, Any]:
    tok = TextTokenizer(ctx.inputs["tokenizer"])
    records = read_records(ctx.inputs["data"], spec.max_records)
    arrays, stats = prepare(records, tok, spec.seq_len, spec.packing)
    write_prepared(ctx.out, arrays, stats)
    return {"from": "prepared", **{k: stats[k] for k in ("records", "rows", "tokens")}}


register_kind(AssetKind(
    name="dolly-prepared", spec=DollyPreparedSpec, build=_build,
    produces=lambda spec: tuple(f"{n}.npy" for n in ARRAYS) + (META,),
    input_kinds={"data": ("hf-dataset", "dolly-synthetic"),
                 "tokenizer": ("hf-tokenizer", "hf-model", "tiny-tokenizer", "tiny-llama")},
    validate=_validate, summary="Dolly records tokenized, masked, padded or packed"))
