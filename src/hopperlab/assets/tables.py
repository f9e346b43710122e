"""Generated tables: the asset kind for families whose inputs are tables (recommender, TPC-H).

A seeded generator writes one table (Parquet or CSV) from a column list; the same definition
gives the same rows. It shows the extension point (a spec dataclass, a build function, the file
it produces) and gives the smoke scale tables that need no download.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping

from hopperlab.assets.registry import AssetKind, AssetSpec, BuildContext, register_kind
from hopperlab.core.errors import SpecError

COLUMN_TYPES = ("int", "float", "category")


@dataclass(frozen=True, kw_only=True)
class GeneratedTableSpec(AssetSpec):
    rows: int
    #: name -> {type: int, low, high} | {type: float, low, high} | {type: category, values}
    columns: dict[str, Any] = field(default_factory=dict)
    format: Literal["parquet", "csv"] = "parquet"
    seed: int = 0

    @property
    def filename(self) -> str:
        return f"table.{self.format}"


def _validate(spec: GeneratedTableSpec, specs: Mapping[str, AssetSpec]) -> None:
    if spec.rows < 1:
        raise SpecError(f"{spec.where}.rows: expected a positive number, got {spec.rows}")
    if not spec.columns:
        raise SpecError(f"{spec.where}.columns: expected at least one column")
    for name, col in spec.columns.items():
        where = f"{spec.where}.columns.{name}"
        kind = col.get("type") if isinstance(col, dict) else None
        if kind not in COLUMN_TYPES:
            raise SpecError(f"{where}.type: expected one of {', '.join(COLUMN_TYPES)}")
        if kind == "category":
            if not col.get("values") or not isinstance(col["values"], list):
                raise SpecError(f"{where}.values: expected a non-empty list")
        elif not (isinstance(col.get("low"), (int, float)) and isinstance(col.get("high"),
                                                                          (int, float))
                  and col["low"] < col["high"]):
            raise SpecError(f"{where}: expected numbers low < high")


def generate(spec: GeneratedTableSpec) -> dict[str, Any]:
    """The columns as numpy arrays (seeded)."""
    import numpy as np

    rng = np.random.default_rng(spec.seed)
    out = {}
    for name, col in spec.columns.items():
        if col["type"] == "int":
            out[name] = rng.integers(col["low"], col["high"], size=spec.rows, dtype=np.int64)
        elif col["type"] == "float":
            out[name] = rng.uniform(col["low"], col["high"], size=spec.rows)
        else:
            out[name] = np.asarray(col["values"])[rng.integers(0, len(col["values"]),
                                                               size=spec.rows)]
    return out


def _build(spec: GeneratedTableSpec, ctx: BuildContext) -> dict[str, Any]:
    columns = generate(spec)
    path = ctx.out / spec.filename
    if spec.format == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table(columns), path)
    else:
        with open(path, "w", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerow(columns)
            writer.writerows(zip(*(c.tolist() for c in columns.values())))
    return {"from": "generated", "rows": spec.rows, "seed": spec.seed}


register_kind(AssetKind(
    name="generated-table", spec=GeneratedTableSpec, build=_build,
    produces=lambda spec: (spec.filename,), validate=_validate,
    summary="a seeded generated table (Parquet or CSV)"))
