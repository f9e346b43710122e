"""DLRM-style ranking: embedding tables for the categorical features, a bottom MLP for the
continuous ones, pairwise dot-product feature interaction, a top MLP to one click logit.

The ranking batch travels as one ``int32`` word matrix per query (``BatchLayout``): the user's
packed row (continuous as float32 bits, then categorical ids) repeated per candidate, followed by
the candidate's packed row. One buffer means one gather destination and one host->device copy;
``split`` turns it back into (dense float32, sparse ids) on whatever device it sits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import nn


@dataclass(frozen=True)
class BatchLayout:
    user_continuous: int
    user_categorical: int
    item_continuous: int
    item_categorical: int

    @property
    def user_words(self) -> int:
        return self.user_continuous + self.user_categorical

    @property
    def item_words(self) -> int:
        return self.item_continuous + self.item_categorical

    @property
    def words(self) -> int:
        return self.user_words + self.item_words

    def split(self, words: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(dense float32 [B, uc+ic], sparse int32 [B, ucat+icat]) from the word matrix."""
        u, uc, ic = self.user_words, self.user_continuous, self.item_continuous
        dense = torch.cat([words[:, :uc], words[:, u:u + ic]], 1).view(torch.float32)
        sparse = torch.cat([words[:, uc:u], words[:, u + ic:]], 1)
        return dense, sparse


class DLRM(nn.Module):
    def __init__(self, cardinalities: Sequence[int], dense_features: int, *, embedding_dim: int,
                 hidden_dim: int) -> None:
        super().__init__()
        offsets = torch.tensor([0, *list(cardinalities)[:-1]], dtype=torch.int64).cumsum(0)
        self.register_buffer("offsets", offsets.to(torch.int32), persistent=False)
        self.embedding = nn.Embedding(int(sum(cardinalities)), embedding_dim, sparse=True)
        nn.init.normal_(self.embedding.weight, std=0.05)
        self.bottom = nn.Sequential(nn.Linear(dense_features, 64), nn.ReLU(),
                                    nn.Linear(64, embedding_dim), nn.ReLU())
        vectors = len(cardinalities) + 1
        rows, cols = torch.triu_indices(vectors, vectors, offset=1)
        self.register_buffer("pair_rows", rows, persistent=False)
        self.register_buffer("pair_cols", cols, persistent=False)
        self.top = nn.Sequential(nn.Linear(rows.numel() + embedding_dim, hidden_dim), nn.ReLU(),
                                 nn.Linear(hidden_dim, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        bottom = self.bottom(dense)
        ids = sparse + self.offsets  # int32 at inference; sparse gradients want int64 ids
        vectors = torch.cat([bottom[:, None], self.embedding(ids.long() if self.training else ids)], 1)
        dots = torch.bmm(vectors, vectors.transpose(1, 2))[:, self.pair_rows, self.pair_cols]
        return self.top(torch.cat([bottom, dots], 1)).squeeze(1)

    def score_words(self, words: torch.Tensor, layout: BatchLayout) -> torch.Tensor:
        return self(*layout.split(words))
