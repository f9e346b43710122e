"""The recsys tables loaded into columnar numpy arrays, row i = id i, ready for gathers.

Feature tables are row-major (``[rows, features]``) so that one user's or one item's features
are contiguous: the feature-augmentation gathers then read whole rows. Categorical values keep
their per-feature ids (``int32``: half the bytes to gather and copy); the models add per-feature
offsets themselves. The interactions are split by time (``split`` column written by the asset).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


@dataclass
class Interactions:
    user: np.ndarray  # int64
    item: np.ndarray  # int64
    label: np.ndarray  # float32, 1 = clicked

    def positives(self) -> "Interactions":
        keep = self.label > 0.5
        return Interactions(self.user[keep], self.item[keep], self.label[keep])

    def __len__(self) -> int:
        return int(self.user.shape[0])


@dataclass
class RecsysData:
    user_cont: np.ndarray  # float32 [users, user_continuous]
    user_cat: np.ndarray  # int32 [users, user_categorical]
    item_cont: np.ndarray  # float32 [items, item_continuous]
    item_cat: np.ndarray  # int32 [items, item_categorical]
    user_cards: list[int]
    item_cards: list[int]
    train: Interactions
    test: Interactions
    schema: dict[str, Any]

    @property
    def users(self) -> int:
        return int(self.user_cont.shape[0])

    @property
    def items(self) -> int:
        return int(self.item_cont.shape[0])

    def feature_bytes(self) -> int:
        return sum(a.nbytes for a in (self.user_cont, self.user_cat, self.item_cont, self.item_cat))


def _matrix(table: Any, prefix: str, dtype: Any) -> np.ndarray:
    names = sorted(n for n in table.column_names if n.startswith(prefix))
    out = np.empty((table.num_rows, len(names)), dtype=dtype)
    for j, name in enumerate(names):
        out[:, j] = table.column(name).to_numpy()
    return out


def _ids(table: Any, name: str, what: str) -> None:
    ids = table.column(name).to_numpy()
    if not np.array_equal(ids, np.arange(len(ids))):
        raise ValueError(f"{what}: {name} must be 0..n-1 in order (row i = id i)")


def load(folder: Path | str) -> RecsysData:
    """Read a built ``recsys`` asset folder."""
    import pyarrow.parquet as pq

    folder = Path(folder)
    schema = json.loads((folder / "schema.json").read_text())
    users = pq.read_table(folder / "users.parquet")
    items = pq.read_table(folder / "items.parquet")
    inter = pq.read_table(folder / "interactions.parquet")
    _ids(users, "user_id", "users.parquet")
    _ids(items, "item_id", "items.parquet")
    user = inter.column("user_id").to_numpy().astype(np.int64)
    item = inter.column("item_id").to_numpy().astype(np.int64)
    label = inter.column("label").to_numpy().astype(np.float32)
    test = inter.column("split").to_numpy() == 1
    return RecsysData(
        user_cont=_matrix(users, "user_cont_", np.float32),
        user_cat=_matrix(users, "user_cat_", np.int32),
        item_cont=_matrix(items, "item_cont_", np.float32),
        item_cat=_matrix(items, "item_cat_", np.int32),
        user_cards=list(schema["user_cardinalities"]),
        item_cards=list(schema["item_cardinalities"]),
        train=Interactions(user[~test], item[~test], label[~test]),
        test=Interactions(user[test], item[test], label[test]),
        schema=schema,
    )
