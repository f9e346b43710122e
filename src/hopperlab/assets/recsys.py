"""Recommender tables with learnable structure (asset kind ``recsys``): users, items,
interactions.

Tables of the source slides' shape whose rows carry signal a model can learn (topics, power-law
popularity, favourite topics, labels that follow from the features), so that the recommender
family trains real models instead of timing a shell. Vectorised numpy from one seeded generator:
the same spec gives the same bytes. The generator and its files: docs/benchmarks/recommender.md.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from typing import Any, Mapping

from hopperlab.assets.registry import AssetKind, AssetSpec, BuildContext, register_kind
from hopperlab.core.errors import SpecError

FILES = ("users.parquet", "items.parquet", "interactions.parquet", "schema.json", "summary.csv")
#: categorical features that carry the signal (the rest are noise); their cardinality is fixed
USER_SIGNAL_CATEGORICAL = 3  # the three favourite topics
ITEM_SIGNAL_CATEGORICAL = 1  # the item's topic
#: continuous features that carry the signal: the topic vector's dimensions (+ one more each)
TOPIC_VECTOR_DIM = 8
FAVOURITE_WEIGHTS = (0.5, 0.3, 0.2)
NOISE_REPLACED = 0.10  # share of signal categorical values replaced by a random topic
SECONDS = 90 * 24 * 3600  # the interactions span 90 days


@dataclass(frozen=True, kw_only=True)
class RecsysSpec(AssetSpec):
    users: int
    items: int
    interactions: int
    user_continuous: int = 40
    user_categorical: int = 44
    item_continuous: int = 20
    item_categorical: int = 16
    topics: int = 200
    #: the largest categorical cardinality (noise features are log-spaced from 10 up to it)
    max_cardinality: int = 200_000
    popularity_exponent: float = 1.05
    favourite_share: float = 0.8
    test_fraction: float = 0.1
    seed: int = 0


def _validate(spec: RecsysSpec, specs: Mapping[str, AssetSpec]) -> None:
    for name in ("users", "items", "interactions", "topics", "max_cardinality"):
        if getattr(spec, name) < 1:
            raise SpecError(f"{spec.where}.{name}: expected a positive number")
    minimum = {"user_continuous": TOPIC_VECTOR_DIM + 2, "item_continuous": TOPIC_VECTOR_DIM + 3,
               "user_categorical": USER_SIGNAL_CATEGORICAL + 1,
               "item_categorical": ITEM_SIGNAL_CATEGORICAL + 1}
    for name, low in minimum.items():
        if getattr(spec, name) < low:
            raise SpecError(f"{spec.where}.{name}: expected at least {low} (the features that "
                            f"carry the signal plus one), got {getattr(spec, name)}")
    if spec.topics > spec.items:
        raise SpecError(f"{spec.where}.topics: more topics ({spec.topics}) than items")
    if spec.max_cardinality < max(10, spec.topics):
        raise SpecError(f"{spec.where}.max_cardinality: expected at least 10 and the topics")
    for name in ("favourite_share", "test_fraction"):
        if not 0.0 < getattr(spec, name) < 1.0:
            raise SpecError(f"{spec.where}.{name}: expected a number between 0 and 1")


# --------------------------------------------------------------------------- generation
def cardinalities(count: int, signal: int, topics: int, max_cardinality: int) -> list[int]:
    """Per categorical feature: the signal features have ``topics`` values, the others are
    log-spaced from 10 to ``max_cardinality``."""
    import numpy as np

    noise = count - signal
    spaced = np.geomspace(10, max_cardinality, num=noise) if noise > 1 else [max_cardinality]
    return [topics] * signal + [int(round(c)) for c in spaced]


def _skewed(rng: Any, card: int, n: int) -> Any:
    """Values in [0, card) where small ones are frequent (as real categorical data is)."""
    import numpy as np

    return np.minimum((card * rng.random(n) ** 3).astype(np.int64), card - 1).astype(np.int32)


def _noisy_topics(rng: Any, topics: Any, n_topics: int) -> Any:
    import numpy as np

    out = topics.astype(np.int32, copy=True)
    swap = rng.random(out.shape[0]) < NOISE_REPLACED
    out[swap] = rng.integers(0, n_topics, size=int(swap.sum()), dtype=np.int32)
    return out


def _draw(rng: Any, weights: Any, n: int) -> Any:
    """``n`` indices drawn with probability proportional to ``weights`` (inverse CDF)."""
    import numpy as np

    cdf = np.cumsum(weights, dtype=np.float64)
    return np.searchsorted(cdf, rng.random(n) * cdf[-1], side="right").clip(0, len(cdf) - 1)


def generate(spec: RecsysSpec) -> dict[str, Any]:
    """The three tables as dicts of numpy columns, plus the schema (seeded, vectorised)."""
    import numpy as np

    rng = np.random.default_rng(spec.seed)
    n_users, n_items, n_inter, n_topics = spec.users, spec.items, spec.interactions, spec.topics
    topic_vectors = rng.standard_normal((n_topics, TOPIC_VECTOR_DIM)).astype(np.float32)

    # ---- items: topic, power-law popularity, quality, price
    item_topic = rng.integers(0, n_topics, size=n_items)
    popularity = 1.0 / np.arange(1, n_items + 1, dtype=np.float64) ** spec.popularity_exponent
    popularity = popularity[rng.permutation(n_items)]
    quality = rng.standard_normal(n_items).astype(np.float32)
    price = rng.standard_normal(n_items).astype(np.float32)  # log-price, standardised
    item_cont = rng.standard_normal((n_items, spec.item_continuous)).astype(np.float32)
    item_cont[:, :TOPIC_VECTOR_DIM] = topic_vectors[item_topic] + 0.5 * item_cont[:, :TOPIC_VECTOR_DIM]
    log_pop = np.log(popularity / popularity.max()).astype(np.float32)
    item_cont[:, TOPIC_VECTOR_DIM] = (log_pop - log_pop.mean()) / log_pop.std() \
        + 0.1 * item_cont[:, TOPIC_VECTOR_DIM]
    item_cont[:, TOPIC_VECTOR_DIM + 1] = quality + 0.3 * item_cont[:, TOPIC_VECTOR_DIM + 1]
    item_cont[:, TOPIC_VECTOR_DIM + 2] = price
    item_cards = cardinalities(spec.item_categorical, ITEM_SIGNAL_CATEGORICAL, n_topics,
                               spec.max_cardinality)
    item_cat = np.empty((n_items, spec.item_categorical), dtype=np.int32)
    item_cat[:, 0] = _noisy_topics(rng, item_topic, n_topics)
    for j in range(ITEM_SIGNAL_CATEGORICAL, spec.item_categorical):
        item_cat[:, j] = _skewed(rng, item_cards[j], n_items)

    # ---- users: three favourite topics, propensity, price sensitivity, activity
    favourites = np.stack([rng.integers(0, n_topics, size=n_users) for _ in FAVOURITE_WEIGHTS], 1)
    propensity = rng.standard_normal(n_users).astype(np.float32)
    price_sensitivity = rng.random(n_users).astype(np.float32)
    user_cont = rng.standard_normal((n_users, spec.user_continuous)).astype(np.float32)
    mix = sum(w * topic_vectors[favourites[:, i]] for i, w in enumerate(FAVOURITE_WEIGHTS))
    user_cont[:, :TOPIC_VECTOR_DIM] = mix + 0.3 * user_cont[:, :TOPIC_VECTOR_DIM]
    user_cont[:, TOPIC_VECTOR_DIM] = propensity + 0.3 * user_cont[:, TOPIC_VECTOR_DIM]
    user_cont[:, TOPIC_VECTOR_DIM + 1] = price_sensitivity + 0.1 * user_cont[:, TOPIC_VECTOR_DIM + 1]
    user_cards = cardinalities(spec.user_categorical, USER_SIGNAL_CATEGORICAL, n_topics,
                               spec.max_cardinality)
    user_cat = np.empty((n_users, spec.user_categorical), dtype=np.int32)
    for j in range(USER_SIGNAL_CATEGORICAL):
        user_cat[:, j] = _noisy_topics(rng, favourites[:, j], n_topics)
    for j in range(USER_SIGNAL_CATEGORICAL, spec.user_categorical):
        user_cat[:, j] = _skewed(rng, user_cards[j], n_users)
    activity = 1.0 / np.arange(1, n_users + 1, dtype=np.float64) ** 0.8
    activity = activity[rng.permutation(n_users)]

    # ---- interactions: user by activity, topic by preference, item of the topic by popularity
    user = _draw(rng, activity, n_inter)
    which = _draw(rng, np.asarray(FAVOURITE_WEIGHTS), n_inter)
    favourite = rng.random(n_inter) < spec.favourite_share
    topic = np.where(favourite, favourites[user, which], rng.integers(0, n_topics, size=n_inter))
    by_topic = np.argsort(item_topic, kind="stable")
    cdf = np.cumsum(popularity[by_topic], dtype=np.float64)
    starts = np.searchsorted(item_topic[by_topic], np.arange(n_topics + 1), side="left")
    low = np.where(starts[topic] > 0, cdf[np.maximum(starts[topic] - 1, 0)], 0.0)
    high = cdf[np.maximum(starts[topic + 1] - 1, 0)]
    empty = starts[topic + 1] == starts[topic]  # a topic without items: any item
    pick = np.searchsorted(cdf, low + rng.random(n_inter) * (high - low), side="right")
    item = by_topic[np.clip(pick, 0, n_items - 1)]
    item[empty] = _draw(rng, popularity, int(empty.sum()))
    is_favourite = (favourites[user] == item_topic[item][:, None]).any(axis=1)
    logit = (2.0 * is_favourite + 1.0 * quality[item] + 0.7 * propensity[user]
             - 1.5 * price_sensitivity[user] * price[item] + 0.3 * item_cont[item, TOPIC_VECTOR_DIM]
             - 2.5)
    label = (rng.random(n_inter) < 1.0 / (1.0 + np.exp(-logit))).astype(np.int8)
    timestamp = np.sort(rng.integers(0, SECONDS, size=n_inter)).astype(np.int64)
    cutoff = int(np.quantile(timestamp, 1.0 - spec.test_fraction))
    split = (timestamp >= cutoff).astype(np.int8)

    users = {"user_id": np.arange(n_users, dtype=np.int64)}
    users.update({f"user_cont_{j:02d}": user_cont[:, j] for j in range(spec.user_continuous)})
    users.update({f"user_cat_{j:02d}": user_cat[:, j] for j in range(spec.user_categorical)})
    items = {"item_id": np.arange(n_items, dtype=np.int64)}
    items.update({f"item_cont_{j:02d}": item_cont[:, j] for j in range(spec.item_continuous)})
    items.update({f"item_cat_{j:02d}": item_cat[:, j] for j in range(spec.item_categorical)})
    interactions = {"user_id": user.astype(np.int64), "item_id": item.astype(np.int64),
                    "timestamp": timestamp, "label": label, "split": split}
    schema = {
        "users": n_users, "items": n_items, "interactions": n_inter, "topics": n_topics,
        "user_continuous": spec.user_continuous, "user_categorical": spec.user_categorical,
        "item_continuous": spec.item_continuous, "item_categorical": spec.item_categorical,
        "user_cardinalities": user_cards, "item_cardinalities": item_cards,
        "test_cutoff_timestamp": cutoff, "seed": spec.seed,
        "label_rate": float(label.mean()), "test_interactions": int(split.sum()),
    }
    return {"users": users, "items": items, "interactions": interactions, "schema": schema}


def write(tables: Mapping[str, Any], out: Any) -> None:
    """Parquet tables, ``schema.json`` and ``summary.csv`` into the folder ``out``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = []
    for name in ("users", "items", "interactions"):
        columns = tables[name]
        path = out / f"{name}.parquet"
        pq.write_table(pa.table(columns), path, compression="snappy")
        continuous = sum(1 for c in columns if "_cont_" in c)
        categorical = sum(1 for c in columns if "_cat_" in c)
        rows.append({"table": name, "rows": len(next(iter(columns.values()))),
                     "continuous_features": continuous, "categorical_features": categorical,
                     "columns": len(columns), "bytes": path.stat().st_size})
    (out / "schema.json").write_text(json.dumps(tables["schema"], indent=2) + "\n")
    with open(out / "summary.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def _build(spec: RecsysSpec, ctx: BuildContext) -> dict[str, Any]:
    write(generate(spec), ctx.out)
    return {"from": "generated", "users": spec.users, "items": spec.items,
            "interactions": spec.interactions, "seed": spec.seed}


register_kind(AssetKind(
    name="recsys", spec=RecsysSpec, build=_build, produces=lambda spec: FILES,
    validate=_validate,
    summary="recommender users/items/interactions with learnable structure (Parquet)"))
