"""CPU feature augmentation: the user's and the candidates' features gathered into the ranking
batch, ``candidates x words`` int32 (``ranking.BatchLayout``), in a host staging buffer.

Two implementations, the "before" and the "after" of making this CPU work fast:

* ``PandasAugmenter``: DataFrame lookups by id (``.loc``), the user's row repeated, joined to the
  candidates' rows, converted to arrays, then written to the staging buffer. How such code often
  starts out.
* ``NumpyAugmenter``: the tables packed once into row-major int32 word matrices (floats as their
  bits), then per query one broadcast of the user's row and one row gather of the candidates'
  straight into the (pinned) staging buffer. With ``workers`` > 0 the candidate rows are split
  over that many threads (numpy releases the GIL while it copies).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from hopperlab.workloads.recommender.data import RecsysData
from hopperlab.workloads.recommender.ranking import BatchLayout


@dataclass
class PackedTables:
    user_words: np.ndarray  # int32 [users, user_continuous + user_categorical]
    item_words: np.ndarray  # int32 [items, item_continuous + item_categorical]
    layout: BatchLayout


def pack(data: RecsysData) -> PackedTables:
    """Continuous features (as float32 bits) then categorical ids, one int32 row per id."""
    layout = BatchLayout(data.user_cont.shape[1], data.user_cat.shape[1],
                         data.item_cont.shape[1], data.item_cat.shape[1])
    user = np.ascontiguousarray(np.concatenate([data.user_cont.view(np.int32), data.user_cat], 1))
    item = np.ascontiguousarray(np.concatenate([data.item_cont.view(np.int32), data.item_cat], 1))
    return PackedTables(user, item, layout)


class NumpyAugmenter:
    def __init__(self, tables: PackedTables, staging: np.ndarray, workers: int) -> None:
        self.user_words = tables.user_words
        self.item_words = tables.item_words
        self.split = tables.layout.user_words
        self.staging = staging
        self.workers = workers
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="augment") if workers else None

    def _fill(self, user: int, cands: np.ndarray, start: int, stop: int) -> None:
        out = self.staging[start:stop]
        out[:, :self.split] = self.user_words[user]
        out[:, self.split:] = self.item_words[cands[start:stop]]

    def __call__(self, user: int, cands: np.ndarray) -> None:
        n = len(cands)
        if self.pool is None:
            self._fill(user, cands, 0, n)
            return
        bounds = np.linspace(0, n, self.workers + 1).astype(int)
        jobs = [self.pool.submit(self._fill, user, cands, int(a), int(b))
                for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
        for job in jobs:
            job.result()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True)


class PandasAugmenter:
    def __init__(self, data: RecsysData, tables: PackedTables, staging: np.ndarray) -> None:
        import pandas as pd

        lay = tables.layout
        ucont = [f"user_cont_{j:02d}" for j in range(lay.user_continuous)]
        ucat = [f"user_cat_{j:02d}" for j in range(lay.user_categorical)]
        icont = [f"item_cont_{j:02d}" for j in range(lay.item_continuous)]
        icat = [f"item_cat_{j:02d}" for j in range(lay.item_categorical)]
        self.users = pd.concat([pd.DataFrame(data.user_cont, columns=ucont),
                                pd.DataFrame(data.user_cat, columns=ucat)], axis=1)
        self.items = pd.concat([pd.DataFrame(data.item_cont, columns=icont),
                                pd.DataFrame(data.item_cat, columns=icat)], axis=1)
        self.dense_cols, self.sparse_cols = ucont + icont, ucat + icat
        self.layout = lay
        self.staging = staging

    def __call__(self, user: int, cands: np.ndarray) -> None:
        lay = self.layout
        user_rows = self.users.loc[[user] * len(cands)].reset_index(drop=True)
        batch = user_rows.join(self.items.loc[cands].reset_index(drop=True))
        dense = batch[self.dense_cols].to_numpy(np.float32)
        sparse = batch[self.sparse_cols].to_numpy(np.int32)
        floats = self.staging.view(np.float32)
        u, uc = lay.user_words, lay.user_continuous
        floats[:, :uc] = dense[:, :uc]
        floats[:, u:u + lay.item_continuous] = dense[:, uc:]
        self.staging[:, uc:u] = sparse[:, :lay.user_categorical]
        self.staging[:, u + lay.item_continuous:] = sparse[:, lay.user_categorical:]

    def close(self) -> None:
        pass
