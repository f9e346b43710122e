"""The recsys asset: deterministic, the stated sizes and feature counts, learnable structure."""

from __future__ import annotations

import csv
import hashlib
import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from hopperlab.assets.recsys import FILES, RecsysSpec, cardinalities, generate, write
from hopperlab.assets.registry import kinds, load_assets
from hopperlab.core.errors import SpecError

SMALL = dict(users=500, items=2000, interactions=8000, topics=10, max_cardinality=1000, seed=3)


def spec(**kw):
    return RecsysSpec(name="t", kind="recsys", **{**SMALL, **kw})


def _digest(folder):
    return {name: hashlib.sha256((folder / name).read_bytes()).hexdigest()
            for name in ("users.parquet", "items.parquet", "interactions.parquet")}


def test_same_spec_same_bytes_other_seed_other_rows(tmp_path):
    for sub, s in (("a", spec()), ("b", spec()), ("c", spec(seed=4))):
        (tmp_path / sub).mkdir()
        write(generate(s), tmp_path / sub)
    assert _digest(tmp_path / "a") == _digest(tmp_path / "b")
    assert _digest(tmp_path / "a")["interactions.parquet"] != \
        _digest(tmp_path / "c")["interactions.parquet"]


def test_sizes_feature_counts_and_summary(tmp_path):
    write(generate(spec()), tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(FILES)
    users = pq.read_table(tmp_path / "users.parquet")
    items = pq.read_table(tmp_path / "items.parquet")
    inter = pq.read_table(tmp_path / "interactions.parquet")
    assert (users.num_rows, items.num_rows, inter.num_rows) == (500, 2000, 8000)
    count = lambda t, s: sum(1 for c in t.column_names if s in c)  # noqa: E731
    assert (count(users, "_cont_"), count(users, "_cat_")) == (40, 44)
    assert (count(items, "_cont_"), count(items, "_cat_")) == (20, 16)
    with open(tmp_path / "summary.csv") as fh:
        rows = {r["table"]: r for r in csv.DictReader(fh)}
    assert rows["users"]["rows"] == "500" and rows["users"]["categorical_features"] == "44"
    assert rows["items"]["rows"] == "2000" and rows["items"]["continuous_features"] == "20"
    assert rows["interactions"]["rows"] == "8000"
    schema = json.loads((tmp_path / "schema.json").read_text())
    for table, cards in ((users, schema["user_cardinalities"]),
                         (items, schema["item_cardinalities"])):
        cats = sorted(c for c in table.column_names if "_cat_" in c)
        for name, card in zip(cats, cards):
            values = table.column(name).to_numpy()
            assert values.min() >= 0 and values.max() < card, name


def test_structure_power_law_split_by_time_and_labels():
    t = generate(spec(interactions=20000))
    inter = t["interactions"]
    counts = np.sort(np.bincount(inter["item_id"], minlength=2000))[::-1]
    assert counts[:20].sum() > 5 * counts[-1000:].sum()  # a power law, not uniform
    test = inter["split"] == 1
    assert 0.08 < test.mean() < 0.12
    assert inter["timestamp"][test].min() >= inter["timestamp"][~test].max()
    assert 0.2 < inter["label"].mean() < 0.8
    # the user's first favourite-topic feature matches the clicked item's topic more than chance
    u_topic = t["users"]["user_cat_00"][inter["user_id"]]
    i_topic = t["items"]["item_cat_00"][inter["item_id"]]
    assert (u_topic == i_topic).mean() > 3 / 10


def test_cardinalities_span_tens_to_max():
    cards = cardinalities(44, 3, 200, 200_000)
    assert cards[:3] == [200, 200, 200] and min(cards[3:]) == 10 and max(cards) == 200_000


def test_assets_file_entries_and_validation(tmp_path):
    specs = load_assets(".")
    assert "recsys" in kinds()
    full, smoke = specs["recsys-full"], specs["recsys-smoke"]
    assert (full.users, full.items, full.interactions) == (221_000, 850_000, 4_000_000)
    assert (full.user_continuous, full.user_categorical) == (40, 44)
    assert (full.item_continuous, full.item_categorical) == (20, 16)
    assert (smoke.users, smoke.items, smoke.interactions) == (2210, 8500, 40_000)
    validate = kinds()["recsys"].validate
    with pytest.raises(SpecError, match="user_categorical"):
        validate(spec(user_categorical=2), {})
    with pytest.raises(SpecError, match="test_fraction"):
        validate(spec(test_fraction=1.5), {})
