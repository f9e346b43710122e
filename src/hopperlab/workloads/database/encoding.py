"""How a column is kept in memory, and how the GPU gets its plain values back.

``plain``: the column's plain form as is (int32 days, int64 cents, int32 codes, int64 keys).

``compact``: each column in its narrowest *exact* form, so that fewer bytes cross the host link
when the table lives in CPU memory: frame of reference and common factor,
``plain = stored * factor + offset``, with ``stored`` in the narrowest of uint8, int16, int32,
int64 that holds it. On TPC-H that gives: dates 2 bytes (about 2,500 distinct days),
``l_quantity`` 1 byte (whole units 1..50: factor 100 cents), ``l_discount`` / ``l_tax`` 1 byte,
``l_extendedprice`` 4 bytes, dictionary codes 1 byte, keys 4 bytes. The encoding is checked to
give back every value exactly before it is used. Decoding is a widening kernel or two on the
GPU, at device-memory speed, after the narrow bytes arrived.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from hopperlab.workloads.database.columns import Column

#: the stored types compact may pick, narrowest first, with the largest value each holds
_NARROW = ((np.uint8, 2**8 - 1), (np.int16, 2**15 - 1), (np.int32, 2**31 - 1),
           (np.int64, 2**63 - 1))
_SAMPLE = 1 << 20


@dataclass
class Encoded:
    """A column's stored array and the affine map back to its plain values."""

    name: str
    data: np.ndarray
    plain_dtype: np.dtype
    offset: int = 0
    factor: int = 1

    @property
    def identity(self) -> bool:
        return self.offset == 0 and self.factor == 1 and self.data.dtype == self.plain_dtype

    @property
    def itemsize(self) -> int:
        return int(self.data.dtype.itemsize)

    def decode_numpy(self) -> np.ndarray:
        wide = self.data.astype(np.int64) * self.factor + self.offset
        return wide.astype(self.plain_dtype)

    def decode(self, torch: Any, t: Any) -> Any:
        """The plain values of ``t`` (a tensor of the stored form), on t's device.

        Widening and the affine map run as elementwise kernels; on a stored form equal to the
        plain one this returns ``t`` itself (no kernel)."""
        if self.identity:
            return t
        plain = torch_dtype(torch, self.plain_dtype)
        wide = torch.int64 if (plain == torch.int64 or self.factor != 1) else plain
        x = t.to(wide)
        if self.factor != 1:
            x.mul_(self.factor)
        if self.offset:
            x.add_(self.offset)
        return x if x.dtype == plain else x.to(plain)


def torch_dtype(torch: Any, dtype: np.dtype) -> Any:
    """The torch dtype of a numpy integer dtype a column can be stored in."""
    return {np.dtype(np.int64): torch.int64, np.dtype(np.int32): torch.int32,
            np.dtype(np.int16): torch.int16, np.dtype(np.uint8): torch.uint8}[np.dtype(dtype)]


def encode_plain(col: Column) -> Encoded:
    return Encoded(col.name, col.values, col.values.dtype)


def _common_factor(d: np.ndarray) -> int:
    """The gcd of ``d`` (values >= 0), from a sample first and then checked on every value."""
    if d.size == 0 or not d.any():
        return 1
    sample = d[:: max(1, d.size // _SAMPLE)]
    f = int(np.gcd.reduce(sample)) or 1
    if f > 1 and np.any(d % f):
        f = int(np.gcd.reduce(d)) or 1
    return f


def encode_compact(col: Column) -> Encoded:
    """The narrowest exact stored form of ``col`` (checked: decoding gives every value back)."""
    v = col.values.astype(np.int64, copy=False)
    if v.size == 0:
        return encode_plain(col)
    lo = int(v.min())
    d = v - lo
    factor = _common_factor(d)
    stored = d // factor if factor > 1 else d
    hi = int(stored.max())
    dtype = next(t for t, top in _NARROW if hi <= top)
    enc = Encoded(col.name, stored.astype(dtype), col.values.dtype, offset=lo, factor=factor)
    if enc.data.itemsize >= col.values.itemsize:
        return encode_plain(col)  # nothing to gain: keep the plain form (no decode kernel)
    if not np.array_equal(enc.decode_numpy(), col.values):
        raise AssertionError(f"compact encoding of {col.name} is not exact")
    return enc


def encode(col: Column, encoding: str) -> Encoded:
    """``col`` in ``encoding`` (computed once per column and encoding)."""
    if encoding not in col.encodings:
        if encoding == "plain":
            col.encodings[encoding] = encode_plain(col)
        elif encoding == "compact":
            col.encodings[encoding] = encode_compact(col)
        else:
            raise ValueError(f"unknown encoding {encoding!r}")
    return col.encodings[encoding]
