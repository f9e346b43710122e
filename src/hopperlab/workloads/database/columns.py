"""Columnar loading: TPC-H Parquet -> exact fixed-width numpy columns (the ``plain`` form).

Every value stays exact, so the GPU's integer arithmetic can equal DuckDB's decimals digit for
digit: dates become int32 days since 1970-01-01, decimals their unscaled int64 (cents for
``DECIMAL(15,2)``), strings int32 codes into a *sorted* dictionary (so code order is string
order and ``ORDER BY`` a string can sort codes), integer keys keep their width.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

EPOCH = dt.date(1970, 1, 1)
KINDS = ("int", "date", "decimal", "dict")


def day_number(value: str | dt.date) -> int:
    """Days since 1970-01-01 of an ISO date (the int32 that date columns hold)."""
    d = dt.date.fromisoformat(value) if isinstance(value, str) else value
    return (d - EPOCH).days


def date_of(days: int) -> dt.date:
    return EPOCH + dt.timedelta(days=int(days))


@dataclass
class Column:
    """One column in its plain form; ``values`` is a 1-d numpy array without nulls."""

    name: str
    kind: str  # one of KINDS
    values: np.ndarray
    #: kind "dict": the sorted distinct strings; code i stands for dictionary[i]
    dictionary: tuple[str, ...] = ()
    #: kind "decimal": digits after the point (values are value * 10**scale)
    scale: int = 0
    #: encodings already computed, by name (``encoding.encode`` fills it)
    encodings: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    _max_abs: int | None = field(default=None, repr=False, compare=False)

    def code(self, text: str) -> int | None:
        """The code of ``text`` in a dictionary column, or None when no row holds it."""
        i = int(np.searchsorted(np.asarray(self.dictionary, dtype=object), text))
        return i if i < len(self.dictionary) and self.dictionary[i] == text else None

    def codes_where(self, predicate: Any) -> list[int]:
        """Codes of the dictionary strings for which ``predicate(text)`` holds (a string
        predicate evaluated once per distinct value, never per row)."""
        return [i for i, s in enumerate(self.dictionary) if predicate(s)]

    @property
    def nbytes(self) -> int:
        return int(self.values.nbytes)

    @property
    def max_abs(self) -> int:
        """The largest magnitude in the column (bounds for overflow-free integer sums).

        Computed once: plans ask for it on every run, and two passes over 60M host values
        cost tens of milliseconds (seen in the first SF 10 run, before this cache)."""
        if self._max_abs is None:
            v = self.values
            self._max_abs = 0 if v.size == 0 else max(abs(int(v.max())), abs(int(v.min())))
        return self._max_abs


@dataclass
class Table:
    name: str
    rows: int
    columns: dict[str, Column] = field(default_factory=dict)

    def __getitem__(self, name: str) -> Column:
        return self.columns[name]


def _decimal_unscaled(arr: Any) -> np.ndarray:
    """The unscaled int64 values of a pyarrow decimal128 array (checked to fit in int64)."""
    import pyarrow as pa

    if arr.null_count:
        raise ValueError("decimal column with nulls: TPC-H has none")
    if pa.types.is_decimal128(arr.type):
        words = np.frombuffer(arr.buffers()[1], dtype=np.int64)
        pairs = words[2 * arr.offset: 2 * (arr.offset + len(arr))].reshape(-1, 2)
        low, high = pairs[:, 0], pairs[:, 1]
        if not np.array_equal(high, low >> 63):
            raise ValueError("decimal value out of int64 range")
        return low.copy()
    # decimal64 / decimal32 (newer writers): the storage is already the unscaled integer
    width = arr.type.bit_width
    words = np.frombuffer(arr.buffers()[1], dtype=np.int64 if width == 64 else np.int32)
    return words[arr.offset: arr.offset + len(arr)].astype(np.int64)


def _sorted_dictionary(arr: Any) -> tuple[np.ndarray, tuple[str, ...]]:
    import pyarrow.compute as pc

    encoded = pc.dictionary_encode(arr)
    indices = np.asarray(encoded.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
    values = [str(v) for v in encoded.dictionary.to_pylist()]
    order = sorted(range(len(values)), key=lambda i: values[i])
    rank = np.empty(len(values), dtype=np.int32)
    rank[np.asarray(order, dtype=np.int64)] = np.arange(len(values), dtype=np.int32)
    return rank[indices], tuple(values[i] for i in order)


def convert(name: str, arr: Any) -> Column:
    """One pyarrow array (combined chunks) -> a plain Column (owning, writable numpy memory)."""
    import pyarrow as pa

    t = arr.type
    if pa.types.is_date32(t):
        return Column(name, "date", np.array(arr.cast(pa.int32()).to_numpy(), dtype=np.int32))
    if pa.types.is_decimal(t):
        return Column(name, "decimal", _decimal_unscaled(arr), scale=t.scale)
    if pa.types.is_integer(t):
        dtype = np.int64 if t.bit_width > 32 else np.int32
        return Column(name, "int", np.array(arr.to_numpy(), dtype=dtype))
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        codes, dictionary = _sorted_dictionary(arr)
        return Column(name, "dict", codes, dictionary=dictionary)
    raise TypeError(f"column {name}: type {t} is not supported")


def table_files(folder: Path, table: str) -> list[Path]:
    files = sorted((Path(folder) / table).glob("part-*.parquet"),
                   key=lambda p: int(p.stem.split("-")[1]))
    if not files:
        raise FileNotFoundError(f"no Parquet parts of table {table!r} under {folder}")
    return files


def load_table(folder: Path | str, table: str, columns: Iterable[str]) -> Table:
    """Read ``columns`` of ``table`` from a built ``tpch`` asset folder, in part order."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    cols = list(dict.fromkeys(columns))
    parts = [pq.read_table(p, columns=cols) for p in table_files(Path(folder), table)]
    data = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
    out = Table(table, data.num_rows)
    for c in cols:
        col = convert(c, data.column(c).combine_chunks())
        col.max_abs  # noqa: B018 - computed at load time, never inside a timed query
        out.columns[c] = col
    return out


def load_tables(folder: Path | str, needs: Mapping[str, Iterable[str]]) -> dict[str, Table]:
    """Every table named in ``needs`` ({table: columns}), with the union of its columns."""
    return {t: load_table(folder, t, cols) for t, cols in needs.items()}
