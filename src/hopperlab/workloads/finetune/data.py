"""The training batches: a DataLoader over Dolly, and a timed iterator that measures data waits.

Three sources (``LoraParams.data``: the torch and mcore engines'):

* ``prepared``: the pre-tokenized arrays of the asset of role ``data`` (``PreparedDolly``);
  the loader's workers only slice memory-mapped rows.
* ``tokenize``: the Dolly records of the asset of role ``records``, tokenized in ``__getitem__``
  with the tokenizer of role ``tokenizer`` (``DollyDataset``): with ``num_workers > 0`` the
  tokenization runs in the workers, with 0 in the training loop — the num_workers study.
* ``synthetic``: random token ids of the right shape, labels = inputs (performance runs where
  the data set is not available; the run is tagged so).

The loader cycles over epochs forever (``batches``): a measured step never sees the end of an
epoch. ``timed_batches`` says how long the loop waited for each batch (the ``data.wait`` NVTX
range): that time over the step time is the data-wait fraction.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Iterator

from hopperlab.assets.dolly import DollyDataset, PreparedDolly
from hopperlab.core.errors import AssetMissing
from hopperlab.cuda.nvtx import DATA_WAIT, nvtx_range
from hopperlab.workloads.base import RunView
from hopperlab.workloads.finetune.common import LoraParams


class SyntheticTokens:
    """``n`` rows of random token ids in ``[0, vocab)``, seeded per row (workers agree)."""

    def __init__(self, n: int, seq_len: int, vocab_size: int, seed: int = 0) -> None:
        self.n, self.seq_len, self.vocab_size, self.seed = n, seq_len, vocab_size, seed

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        import numpy as np

        ids = np.random.default_rng((self.seed, i)).integers(
            0, self.vocab_size, self.seq_len, dtype=np.int64)
        return {"input_ids": ids, "labels": ids.copy(),
                "attention_mask": np.ones(self.seq_len, dtype=np.int64)}


@dataclass
class DataSource:
    dataset: Any
    #: what the run records as tag ``data.source``
    description: str
    #: tokens of one row as the model sees it
    seq_len: int


def _asset(spec: RunView, role: str) -> Any:
    """``spec.asset_path(role)``, or None when the asset is missing (AssetMissing)."""
    try:
        return spec.asset_path(role)
    except AssetMissing:
        return None


def open_source(spec: RunView, params: LoraParams, vocab_size: int) -> DataSource:
    """The dataset the run's params name, or synthetic tokens when allowed and needed."""
    missing = None
    if params.data == "prepared":
        folder = _asset(spec, "data") if params.synthetic_if_missing else spec.asset_path("data")
        if folder is not None:
            ds = PreparedDolly(folder)
            seq = int(ds.meta["seq_len"])
            if seq != params.seq_len:
                raise ValueError(f"seq_len: the params say {params.seq_len}, but the prepared "
                                 f"data {folder.name} has rows of {seq} tokens")
            return DataSource(ds, f"prepared:{folder.name}", seq)
        missing = spec.assets.get("data")
    elif params.data == "tokenize":
        get = _asset if params.synthetic_if_missing else (lambda s, r: s.asset_path(r))
        records, tok = get(spec, "records"), get(spec, "tokenizer")
        if records is not None and tok is not None:
            ds = DollyDataset(records, tok, params.seq_len)
            return DataSource(ds, f"tokenize:{records.name}+{tok.name}", params.seq_len)
        missing = ",".join(spec.assets.get(r, r) for r in ("records", "tokenizer"))
    rows = max(64, params.micro_batch * (params.warmup_steps + params.measured_steps))
    what = "synthetic" if missing is None else f"synthetic (asset {missing} not built)"
    return DataSource(SyntheticTokens(rows, params.seq_len, vocab_size, params.seed), what,
                      params.seq_len)


def make_loader(source: DataSource, params: LoraParams, num_workers: int,
                pin_memory: bool) -> Any:
    """A shuffling DataLoader (seeded), full batches only, workers kept across epochs."""
    import torch
    from torch.utils.data import DataLoader

    if len(source.dataset) < params.micro_batch:
        raise ValueError(f"micro_batch {params.micro_batch} is larger than the data set "
                         f"({len(source.dataset)} rows)")
    generator = torch.Generator()
    generator.manual_seed(params.seed)
    return DataLoader(source.dataset, batch_size=params.micro_batch, shuffle=True,
                      drop_last=True, num_workers=num_workers, pin_memory=pin_memory,
                      persistent_workers=num_workers > 0, generator=generator,
                      prefetch_factor=4 if num_workers > 0 else None)


def batches(loader: Any) -> Iterator[dict[str, Any]]:
    """The loader's batches, epoch after epoch, forever."""
    while True:
        yield from loader


def timed_batches(loader: Any) -> Iterator[tuple[dict[str, Any], float]]:
    """``(batch, seconds waited for it)``; the wait is an NVTX ``data.wait`` range."""
    it = batches(loader)
    while True:
        t0 = time.perf_counter()
        with nvtx_range(DATA_WAIT):
            batch = next(it)
        yield batch, time.perf_counter() - t0
