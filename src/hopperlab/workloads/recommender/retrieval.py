"""Two-tower retrieval: a user tower and an item tower map features to unit vectors whose dot
product scores a (user, item) pair; retrieval is top-k of one user's vector against every item's.

Each tower embeds its categorical features (one table, per-feature offsets), concatenates the
continuous ones and runs a two-layer MLP. Training (``training.py``) uses in-batch negatives with
the logQ correction, so the score estimates log p(item | user) and keeps item popularity in it.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn


class Tower(nn.Module):
    def __init__(self, cardinalities: Sequence[int], continuous: int, embedding_dim: int,
                 hidden_dim: int, out_dim: int) -> None:
        super().__init__()
        offsets = torch.tensor([0, *list(cardinalities)[:-1]], dtype=torch.int64).cumsum(0)
        self.register_buffer("offsets", offsets.to(torch.int32), persistent=False)
        self.embedding = nn.Embedding(int(sum(cardinalities)), embedding_dim, sparse=True)
        nn.init.normal_(self.embedding.weight, std=0.05)
        self.mlp = nn.Sequential(
            nn.Linear(len(cardinalities) * embedding_dim + continuous, hidden_dim), nn.ReLU(),
            nn.Linear(hidden_dim, out_dim))

    def forward(self, cont: torch.Tensor, cat: torch.Tensor) -> torch.Tensor:
        ids = cat + self.offsets
        emb = self.embedding(ids.long() if self.training else ids).flatten(1)
        return nn.functional.normalize(self.mlp(torch.cat([emb, cont], 1)), dim=-1)


class TwoTower(nn.Module):
    def __init__(self, user_cards: Sequence[int], user_continuous: int,
                 item_cards: Sequence[int], item_continuous: int, *, embedding_dim: int,
                 hidden_dim: int, tower_dim: int) -> None:
        super().__init__()
        self.user = Tower(user_cards, user_continuous, embedding_dim, hidden_dim, tower_dim)
        self.item = Tower(item_cards, item_continuous, embedding_dim, hidden_dim, tower_dim)
        #: 1/temperature, learned (log scale): normalised vectors need a wide score range
        self.log_scale = nn.Parameter(torch.tensor(3.0))

    def scale(self) -> torch.Tensor:
        return self.log_scale.exp()


@torch.no_grad()
def item_embeddings(model: TwoTower, item_cont: torch.Tensor, item_cat: torch.Tensor,
                    batch: int = 65536) -> torch.Tensor:
    """Every item's vector times the learned scale ([items, tower_dim]), on the inputs' device."""
    out = []
    for start in range(0, item_cont.shape[0], batch):
        out.append(model.item(item_cont[start:start + batch], item_cat[start:start + batch]))
    return torch.cat(out) * model.scale()


def top_k(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k best scores, best first."""
    return torch.topk(scores, k, dim=-1, sorted=True).indices
