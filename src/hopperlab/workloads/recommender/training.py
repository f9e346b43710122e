"""Brief training of both models and their evaluation against a popularity baseline.

* Retrieval: in-batch sampled softmax over the clicked training interactions with the logQ
  correction (each logit minus the log of the item's share of the batch sampling), so the learned
  score ranks items by p(item | user) including popularity. Evaluated by recall@k over held-out
  (later in time) clicked interactions: the share of them whose item is in the user's top-k.
  Baseline: the k most clicked items of the training period, for everyone.
* Ranking: binary cross-entropy on all training impressions (clicked or not). Evaluated by AUC on
  held-out impressions. Baseline: the item's click count in the training period as the score.

Embedding tables get sparse gradients (SparseAdam); the MLPs Adam. Seeded; on the given device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from hopperlab.workloads.recommender.data import Interactions, RecsysData
from hopperlab.workloads.recommender.ranking import DLRM
from hopperlab.workloads.recommender.retrieval import TwoTower, item_embeddings

#: at most this many held-out impressions are scored for the AUC (a seeded sample)
AUC_ROWS = 200_000


@dataclass
class Trained:
    two_tower: TwoTower
    dlrm: DLRM
    metrics: dict[str, float]


def _optimizers(model: torch.nn.Module, lr: float) -> list[torch.optim.Optimizer]:
    sparse = [p for n, p in model.named_parameters() if n.endswith("embedding.weight")]
    dense = [p for n, p in model.named_parameters() if not n.endswith("embedding.weight")]
    return [torch.optim.SparseAdam(sparse, lr=lr), torch.optim.Adam(dense, lr=lr)]


def _step(opts: list[torch.optim.Optimizer], loss: torch.Tensor) -> float:
    for opt in opts:
        opt.zero_grad(set_to_none=True)
    loss.backward()
    for opt in opts:
        opt.step()
    return float(loss.detach())


class DeviceTables:
    """The feature tables as tensors on the training device (one copy, reused by both models)."""

    def __init__(self, data: RecsysData, device: torch.device) -> None:
        self.user_cont = torch.from_numpy(data.user_cont).to(device)
        self.user_cat = torch.from_numpy(data.user_cat).to(device)
        self.item_cont = torch.from_numpy(data.item_cont).to(device)
        self.item_cat = torch.from_numpy(data.item_cat).to(device)


def train_retrieval(data: RecsysData, tables: DeviceTables, p: Any, device: torch.device,
                    gen: torch.Generator, log: Any = None) -> TwoTower:
    model = TwoTower(data.user_cards, data.user_cont.shape[1], data.item_cards,
                     data.item_cont.shape[1], embedding_dim=p.embedding_dim,
                     hidden_dim=p.hidden_dim, tower_dim=p.tower_dim).to(device)
    pos = data.train.positives()
    users = torch.from_numpy(pos.user).to(device)
    items = torch.from_numpy(pos.item).to(device)
    counts = np.bincount(pos.item, minlength=data.items).astype(np.float64)
    log_q = torch.from_numpy(np.log(np.maximum(counts, 1.0) / len(pos)).astype(np.float32)).to(device)
    opts = _optimizers(model, p.learning_rate)
    batch = min(p.batch_size, len(pos))
    model.train()
    for step in range(p.retrieval_steps):
        pick = torch.randint(0, len(pos), (batch,), generator=gen, device="cpu").to(device)
        u, i = users[pick], items[pick]
        uvec = model.user(tables.user_cont[u], tables.user_cat[u])
        ivec = model.item(tables.item_cont[i], tables.item_cat[i])
        logits = uvec @ ivec.T * model.scale() - log_q[i][None, :]
        same = i[None, :] == i[:, None]  # the positive's duplicates are not negatives
        logits = logits.masked_fill(same & ~torch.eye(batch, dtype=torch.bool, device=device),
                                    float("-inf"))
        loss = torch.nn.functional.cross_entropy(logits, torch.arange(batch, device=device))
        value = _step(opts, loss)
        if log is not None:
            log("retrieval", step, value)
    model.eval()
    return model


def train_ranking(data: RecsysData, tables: DeviceTables, p: Any, device: torch.device,
                  gen: torch.Generator, log: Any = None) -> DLRM:
    cards = data.user_cards + data.item_cards
    model = DLRM(cards, data.user_cont.shape[1] + data.item_cont.shape[1],
                 embedding_dim=p.embedding_dim, hidden_dim=p.hidden_dim).to(device)
    users = torch.from_numpy(data.train.user).to(device)
    items = torch.from_numpy(data.train.item).to(device)
    labels = torch.from_numpy(data.train.label).to(device)
    opts = _optimizers(model, p.learning_rate)
    batch = min(p.batch_size, len(data.train))
    model.train()
    for step in range(p.ranking_steps):
        pick = torch.randint(0, len(data.train), (batch,), generator=gen, device="cpu").to(device)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(
            model(*_ranking_inputs(tables, users[pick], items[pick])), labels[pick])
        value = _step(opts, loss)
        if log is not None:
            log("ranking", step, value)
    model.eval()
    return model


def _ranking_inputs(tables: DeviceTables, u: torch.Tensor,
                    i: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    dense = torch.cat([tables.user_cont[u], tables.item_cont[i]], 1)
    sparse = torch.cat([tables.user_cat[u], tables.item_cat[i]], 1)
    return dense, sparse


# --------------------------------------------------------------------------- evaluation
def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve (Mann-Whitney), ties counted half: right for constant scores."""
    order = np.argsort(scores, kind="stable")
    sorted_scores = scores[order]
    _, first, counts = np.unique(sorted_scores, return_index=True, return_counts=True)
    ranks = np.empty(len(scores), dtype=np.float64)
    ranks[order] = np.repeat(first + (counts + 1) / 2.0, counts)  # 1-based average ranks
    pos = labels > 0.5
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def _eval_positives(test: Interactions, max_users: int, seed: int) -> Interactions:
    pos = test.positives()
    users = np.unique(pos.user)
    if len(users) > max_users:
        users = np.random.default_rng(seed).choice(users, size=max_users, replace=False)
    keep = np.isin(pos.user, users)
    return Interactions(pos.user[keep], pos.item[keep], pos.label[keep])


@torch.no_grad()
def recall_at_k(model: TwoTower, tables: DeviceTables, items_emb: torch.Tensor,
                test: Interactions, k: int, chunk: int = 64) -> float:
    """Share of held-out clicked (user, item) pairs whose item is in the user's top-k."""
    users = np.unique(test.user)
    hits = 0
    for start in range(0, len(users), chunk):
        u = torch.from_numpy(users[start:start + chunk]).to(items_emb.device)
        top = torch.topk(model.user(tables.user_cont[u], tables.user_cat[u]) @ items_emb.T,
                         k, dim=1).indices.cpu().numpy()
        row = {int(x): r for r, x in enumerate(users[start:start + chunk])}
        sel = np.isin(test.user, users[start:start + chunk])
        for uu, ii in zip(test.user[sel], test.item[sel]):
            hits += bool(np.any(top[row[int(uu)]] == ii))
    return hits / max(len(test), 1)


def popularity_recall_at_k(train: Interactions, test: Interactions, n_items: int, k: int) -> float:
    counts = np.bincount(train.positives().item, minlength=n_items)
    top = np.argsort(-counts, kind="stable")[:k]
    return float(np.isin(test.item, top).mean()) if len(test) else float("nan")


@torch.no_grad()
def ranking_auc(model: DLRM, tables: DeviceTables, test: Interactions, device: torch.device,
                seed: int, batch: int = 65536) -> tuple[float, np.ndarray]:
    rows = np.arange(len(test))
    if len(rows) > AUC_ROWS:
        rows = np.sort(np.random.default_rng(seed).choice(rows, AUC_ROWS, replace=False))
    scores = []
    for start in range(0, len(rows), batch):
        r = rows[start:start + batch]
        u = torch.from_numpy(test.user[r]).to(device)
        i = torch.from_numpy(test.item[r]).to(device)
        scores.append(model(*_ranking_inputs(tables, u, i)).float().cpu().numpy())
    return auc(np.concatenate(scores), test.label[rows]), rows


def train_and_evaluate(data: RecsysData, p: Any, device: torch.device,
                       log: Any = None) -> Trained:
    """Train both models on ``device`` and measure them; metrics use the names the run logs."""
    torch.manual_seed(p.seed)
    gen = torch.Generator().manual_seed(p.seed)
    tables = DeviceTables(data, device)
    two_tower = train_retrieval(data, tables, p, device, gen, log)
    dlrm = train_ranking(data, tables, p, device, gen, log)
    k = min(p.recall_k, data.items)
    held_out = _eval_positives(data.test, p.eval_users, p.seed)
    emb = item_embeddings(two_tower, tables.item_cont, tables.item_cat)
    rank_auc, rows = ranking_auc(dlrm, tables, data.test, device, p.seed)
    counts = np.bincount(data.train.positives().item, minlength=data.items).astype(np.float64)
    metrics = {
        "recall_at_k": recall_at_k(two_tower, tables, emb, held_out, k),
        "recall_at_k_popularity": popularity_recall_at_k(data.train, held_out, data.items, k),
        "recall_k": float(k),
        "recall_eval_pairs": float(len(held_out)),
        "rank_auc": rank_auc,
        "rank_auc_popularity": auc(counts[data.test.item[rows]], data.test.label[rows]),
    }
    return Trained(two_tower, dlrm, metrics)
