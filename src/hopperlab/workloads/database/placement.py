"""Where the columns live while a query runs, and how each chunk reaches the kernels.

A source holds the encoded columns and yields their chunks to the plans (``scan``): ``device``
(copied to GPU memory first), ``host-pinned`` (double-buffered copies on a side stream),
``pageable`` (the baseline), ``zero-copy`` (mapped host memory read by the kernels) and
``managed`` (cudaMallocManaged, sent back to the host before every run, optionally prefetched)
and ``system`` (plain host memory, neither pinned nor registered, read by the kernels in place
where the device reports pageableMemoryAccess).
Without a GPU the same chunking runs on the CPU. Each placement in detail:
docs/benchmarks/database.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import torch

from hopperlab.cuda.runtime import host_view
from hopperlab.memory.pinned import pinned_copy
from hopperlab.workloads.database.columns import Column, Table
from hopperlab.workloads.database.encoding import Encoded, encode
from hopperlab.workloads.database.fused import available as fused_available
from hopperlab.workloads.database.operators import op

_TYPESTR = {np.dtype(np.int64): "<i8", np.dtype(np.int32): "<i4", np.dtype(np.int16): "<i2",
            np.dtype(np.uint8): "|u1"}


class CudaAlias:
    """Exposes device-accessible memory (mapped pinned host memory, managed memory) through
    ``__cuda_array_interface__`` so that ``torch.as_tensor(..., device='cuda')`` wraps it."""

    def __init__(self, ptr: int, n: int, dtype: np.dtype) -> None:
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": _TYPESTR[np.dtype(dtype)],
                                         "data": (int(ptr), False), "version": 3,
                                         "strides": None}


def cuda_alias(ptr: int, n: int, dtype: np.dtype, device: torch.device) -> torch.Tensor:
    return torch.as_tensor(CudaAlias(ptr, n, dtype), device=device)


@dataclass
class Stored:
    """One column as stored: its encoding and the tensor holding the stored form."""

    encoded: Encoded
    tensor: torch.Tensor | None = None  # host or device tensor of the stored form
    alias: torch.Tensor | None = None  # a CUDA tensor over the same memory (zero-copy, managed)
    managed_ptr: int = 0

    @property
    def itemsize(self) -> int:
        return self.encoded.itemsize


class Source:
    """Columns of some tables, in one encoding, placed somewhere; plans read them by ``scan``."""

    placement = "base"

    def __init__(self, tables: dict[str, Table], encoding: str, device: torch.device,
                 chunk_rows: int, fused: bool = False) -> None:
        self.tables = tables
        #: plans may use the fused kernels of ``fused.py`` (which read the stored form)
        self.fused = bool(fused)
        self.encoding = encoding
        self.device = device
        self.chunk_rows = int(chunk_rows)
        self.bytes_read = 0
        self.cuda = device.type == "cuda"
        self.stored: dict[tuple[str, str], Stored] = {}
        for tname, table in tables.items():
            for cname, col in table.columns.items():
                self.stored[(tname, cname)] = self._place(encode(col, encoding))

    # -- what every placement shares -------------------------------------------------------
    def meta(self, table: str, column: str) -> Column:
        return self.tables[table].columns[column]

    def stored_bytes(self) -> int:
        return sum(s.encoded.data.nbytes for s in self.stored.values())

    def reset(self) -> None:
        """Bring the placement back to its state before a query (untimed)."""
        self.bytes_read = 0

    def close(self) -> None:
        self.stored.clear()

    def encoded(self, table: str, column: str) -> Encoded:
        return self.stored[(table, column)].encoded

    def scan(self, table: str, columns: list[str], raw: bool = False
             ) -> Iterator[dict[str, torch.Tensor]]:
        """Chunks of ``columns``: plain tensors, or with ``raw`` the stored form as it reached
        the kernels (for a consumer that reads each column once and decodes in registers:
        then zero-copy hands over the mapped host memory itself)."""
        rows = self.tables[table].rows
        self.bytes_read += sum(rows * self.stored[(table, c)].itemsize for c in columns)
        with op("scan"):
            yield from self._chunks(table, columns, rows, raw)

    def _decode(self, table: str, columns: list[str], parts: dict[str, torch.Tensor]
                ) -> dict[str, torch.Tensor]:
        with op("decode"):
            return {c: self.stored[(table, c)].encoded.decode(torch, parts[c]) for c in columns}

    # -- what each placement says ------------------------------------------------------------
    def _place(self, enc: Encoded) -> Stored:
        raise NotImplementedError

    def _chunks(self, table: str, columns: list[str], rows: int, raw: bool
                ) -> Iterator[dict[str, torch.Tensor]]:
        raise NotImplementedError


class DeviceSource(Source):
    """Columns in the compute device's memory before timing; one chunk per table."""

    placement = "device"

    def _place(self, enc: Encoded) -> Stored:
        return Stored(enc, torch.from_numpy(enc.data).to(self.device))

    def _chunks(self, table, columns, rows, raw):
        stored = {c: self.stored[(table, c)].tensor for c in columns}
        yield stored if raw else self._decode(table, columns, stored)


class _Streamed(Source):
    """Chunks prepared on a side stream, at most one ahead of the kernels (double buffering).

    ``_transfer(table, columns, lo, hi, slot, raw)`` issues chunk [lo, hi)'s movement and decode on
    the current (side) stream and returns the plain tensors; slot (0 or 1) names its buffers.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.side = torch.cuda.Stream(self.device) if self.cuda else None

    def _chunk_rows(self, raw: bool) -> int:
        return self.chunk_rows

    def _chunks(self, table, columns, rows, raw):
        chunk_rows = self._chunk_rows(raw)
        n_chunks = max(1, math.ceil(rows / chunk_rows))
        if not self.cuda:  # CPU bookkeeping: same chunks and slots, no streams
            for i in range(n_chunks):
                lo, hi = i * chunk_rows, min(rows, (i + 1) * chunk_rows)
                yield self._transfer(table, columns, lo, hi, i % 2, raw)
            return
        main = torch.cuda.current_stream(self.device)
        released: list[Any] = [None, None]  # per slot: kernels done with its buffers

        def issue(i: int) -> tuple[dict[str, torch.Tensor], Any]:
            lo, hi = i * chunk_rows, min(rows, (i + 1) * chunk_rows)
            slot = i % 2
            with torch.cuda.stream(self.side):
                if released[slot] is not None:
                    self.side.wait_event(released[slot])
                out = self._transfer(table, columns, lo, hi, slot, raw)
                ready = torch.cuda.Event()
                ready.record(self.side)
            for t in out.values():
                _used_on(t, main)
            return out, ready

        pending = issue(0)
        for i in range(n_chunks):
            out, ready = pending
            if i + 1 < n_chunks:
                pending = issue(i + 1)
            main.wait_event(ready)
            yield out
            done = torch.cuda.Event()
            done.record(main)
            released[i % 2] = done

    def _transfer(self, table, columns, lo, hi, slot, raw):
        raise NotImplementedError


class CopySource(_Streamed):
    """host-pinned (copy engines from page-locked memory) or pageable (ordinary memory)."""

    def __init__(self, *args: Any, pinned: bool, **kwargs: Any) -> None:
        self.pinned = pinned
        self.placement = "host-pinned" if pinned else "pageable"
        super().__init__(*args, **kwargs)
        self.staging: dict[tuple[int, str, str], torch.Tensor] = {}

    def _place(self, enc: Encoded) -> Stored:
        host = torch.from_numpy(enc.data)
        if self.pinned and self.cuda:
            host = pinned_copy(host)
        return Stored(enc, host)

    def _buffer(self, slot: int, table: str, column: str) -> torch.Tensor:
        key = (slot, table, column)
        if key not in self.staging:
            s = self.stored[(table, column)]
            n = min(self.chunk_rows, self.tables[table].rows)
            self.staging[key] = torch.empty(max(1, n), dtype=s.tensor.dtype, device=self.device)
        return self.staging[key]

    def _transfer(self, table, columns, lo, hi, slot, raw):
        parts = {}
        with op("transfer"):
            for c in columns:
                buf = self._buffer(slot, table, c)[: hi - lo]
                buf.copy_(self.stored[(table, c)].tensor[lo:hi], non_blocking=self.pinned)
                parts[c] = buf
        return parts if raw else self._decode(table, columns, parts)

    def close(self) -> None:
        self.staging.clear()
        super().close()


def _used_on(t: torch.Tensor, stream: Any) -> None:
    """Tell the caching allocator that ``t`` (allocated on the side stream) is used on
    ``stream``; a no-op for memory it does not own (mapped or managed aliases)."""
    try:
        t.record_stream(stream)
    except RuntimeError:
        pass


def _read_by_kernel(t: torch.Tensor) -> torch.Tensor:
    """One elementwise kernel that reads ``t`` (mapped host pages) once into device memory."""
    return torch.bitwise_or(t, 0)


#: zero-copy: hand a consumer that reads the mapped pages itself the whole column at once
#: (module attribute: the benchmark compares both)
ZERO_COPY_WHOLE_COLUMN = True


class ZeroCopySource(_Streamed):
    """Kernels read page-locked host memory mapped into the GPU's address space."""

    placement = "zero-copy"

    def _chunk_rows(self, raw: bool) -> int:
        """A consumer that reads the mapped pages itself (``raw``: the fused kernels) may get
        the whole column in one piece: nothing is staged, so chunks only add a launch tail and
        a host synchronisation (the exact totals) per chunk."""
        if raw and ZERO_COPY_WHOLE_COLUMN:
            return max(self.chunk_rows, max(t.rows for t in self.tables.values()))
        return self.chunk_rows

    def _place(self, enc: Encoded) -> Stored:
        host = torch.from_numpy(enc.data)
        if not self.cuda:
            return Stored(enc, host, alias=host)
        host = pinned_copy(host, mapped=True)
        # Under unified virtual addressing a mapped registered pointer is valid on the device
        # as is; torch checks that it is registered (cudaPointerGetAttributes) when wrapping.
        alias = cuda_alias(host.data_ptr(), host.numel(), enc.data.dtype, self.device)
        return Stored(enc, host, alias=alias)

    def _transfer(self, table, columns, lo, hi, slot, raw):
        if raw:  # the consumer's kernel reads the mapped pages itself, once
            return {c: self.stored[(table, c)].alias[lo:hi] for c in columns}
        out = {}
        with op("transfer"):
            for c in columns:
                s = self.stored[(table, c)]
                part = s.alias[lo:hi]
                if s.encoded.identity:
                    out[c] = _read_by_kernel(part)
                else:  # the decode kernel is the one that reads the mapped pages
                    out[c] = s.encoded.decode(torch, part)
        return out


def system_alias(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A CUDA tensor over the plain host memory of ``host`` (no copy, no pinning): valid only
    where the GPU can read pageable memory. torch.as_tensor refuses an unregistered pointer,
    so the storage is built from the pointer itself."""
    storage = torch._C._construct_storage_from_data_pointer(
        host.data_ptr(), device, host.numel() * host.element_size())
    return torch.empty(0, dtype=host.dtype, device=device).set_(
        storage, 0, (host.numel(),), (1,))


class SystemSource(ZeroCopySource):
    """Kernels read the columns where numpy put them: ordinary pageable host memory."""

    placement = "system"

    def _place(self, enc: Encoded) -> Stored:
        host = torch.from_numpy(enc.data)
        if not self.cuda:
            return Stored(enc, host, alias=host)
        return Stored(enc, host, alias=system_alias(host, self.device))


class ManagedSource(_Streamed):
    """cudaMallocManaged columns, host-resident at the start of every run (see module doc)."""

    placement = "managed"

    def __init__(self, *args: Any, runtime: Any, prefetch: bool, **kwargs: Any) -> None:
        self.runtime = runtime
        self.prefetch = prefetch
        super().__init__(*args, **kwargs)

    def _place(self, enc: Encoded) -> Stored:
        nbytes = max(1, enc.data.nbytes)
        ptr = self.runtime.malloc_managed(nbytes)
        view = host_view(ptr, nbytes)[: enc.data.nbytes].view(enc.data.dtype)
        view[:] = enc.data  # the CPU writes it: the pages start on the host
        alias = cuda_alias(ptr, enc.data.size, enc.data.dtype, self.device)
        return Stored(enc, None, alias=alias, managed_ptr=ptr)

    def reset(self) -> None:
        super().reset()
        stream = torch.cuda.current_stream(self.device).cuda_stream
        for s in self.stored.values():
            self.runtime.prefetch(s.managed_ptr, max(1, s.encoded.data.nbytes), None, stream)
        torch.cuda.synchronize(self.device)

    def _transfer(self, table, columns, lo, hi, slot, raw):
        parts = {}
        with op("transfer"):
            for c in columns:
                s = self.stored[(table, c)]
                if self.prefetch and hi > lo:
                    self.runtime.prefetch(s.managed_ptr + lo * s.itemsize, (hi - lo) * s.itemsize,
                                          self.device.index or 0, self.side.cuda_stream)
                parts[c] = s.alias[lo:hi]
        return parts if raw else self._decode(table, columns, parts)

    def close(self) -> None:
        torch.cuda.synchronize(self.device)
        for s in self.stored.values():
            self.runtime.free(s.managed_ptr)
        super().close()


def make_source(placement: str, tables: dict[str, Table], encoding: str, device: torch.device,
                chunk_rows: int, *, runtime: Any = None, prefetch: bool = True,
                fused: bool | None = None) -> Source:
    """The source of ``placement``; ``fused``: let plans use the fused kernels (None: wherever
    they can run, i.e. on a CUDA device with Triton)."""
    if fused is None:
        fused = fused_available(device)
    if placement == "device":
        return DeviceSource(tables, encoding, device, chunk_rows, fused)
    if placement in ("host-pinned", "pageable"):
        return CopySource(tables, encoding, device, chunk_rows, fused,
                          pinned=placement == "host-pinned")
    if placement == "zero-copy":
        return ZeroCopySource(tables, encoding, device, chunk_rows, fused)
    if placement == "system":
        return SystemSource(tables, encoding, device, chunk_rows, fused)
    if placement == "managed":
        if device.type != "cuda" or runtime is None:
            raise ValueError("the managed placement needs a CUDA device and the CUDA runtime")
        return ManagedSource(tables, encoding, device, chunk_rows, fused, runtime=runtime,
                             prefetch=prefetch)
    raise ValueError(f"unknown placement {placement!r}")


__all__ = ["Source", "make_source", "cuda_alias"]
