"""What the copy and allocation tests share: the node probe, the host-memory backend, the plan
of the sweep, statistics and the per-size record."""

from __future__ import annotations

import csv
import math
import platform
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from hopperlab.core.stats import MIB
from hopperlab.node import hardware
from hopperlab.workloads.base import Recording, RunView, no_cuda_reason
from hopperlab.workloads.membench import MembenchParams

#: The most copies one timed sample repeats.
MAX_INNER = 256

# --------------------------------------------------------------------------- plan
@dataclass(frozen=True)
class Plan:
    sizes_mb: tuple[int, ...]
    repeats: int
    warmup: int
    sample_bytes: int

    @property
    def largest_mb(self) -> int:
        return max(self.sizes_mb)


def plan_for(params: MembenchParams) -> Plan:
    """The sweep of a copy or alloc run: all of it from the params (the experiments file's
    ``scales:`` decides each scale's numbers, once)."""
    return Plan(sizes_mb=tuple(params.sizes_mb), repeats=params.repeats, warmup=params.warmup,
                sample_bytes=params.sample_mb * MIB)


def inner_copies(nbytes: int, sample_bytes: int) -> int:
    """How many copies of ``nbytes`` one timed sample makes (at least one, at most MAX_INNER)."""
    return max(1, min(MAX_INNER, math.ceil(sample_bytes / nbytes)))


def bytes_copied(nbytes: int, inner: int, ways: int, plan: Plan) -> int:
    """The bytes one size's copies move inside the measured window: every sample, the warm-up
    ones too (they run inside it), ``inner`` copies of ``nbytes`` each way (bidir: 2). The
    window's joules are divided by their sum (issue 36: energy from the work done)."""
    return nbytes * inner * ways * (plan.warmup + plan.repeats)


# --------------------------------------------------------------------------- the node
@dataclass
class Env:
    """What this process can use: a CUDA device through torch, or the host alone."""

    target: str  # "cuda" | "host"
    torch: Any = None  # the torch module, when importable
    no_cuda_reason: str | None = None  # why target is "host"
    device: int = 0
    gpu_name: str | None = None
    is_grace_hopper: bool = False
    host: "HostBackend" = field(default=None)  # type: ignore[assignment]


def probe(spec: RunView, *, use_torch: bool = True) -> Env:
    """Find out whether this run can use a CUDA device. ``use_torch=False`` acts as if torch were
    not installed (the numpy path, for tests)."""
    torch = None
    reason = None
    if use_torch:
        try:
            import torch as _torch  # noqa: PLC0415 - torch is optional and heavy

            torch = _torch
        except ImportError:
            reason = "torch is not installed"
    else:
        reason = "torch is not used (use_torch=False)"
    host = HostBackend()
    gpus = spec.resources.gpus
    if torch is not None:
        reason = no_cuda_reason(torch, gpus)
    if reason is not None:
        return Env(target="host", torch=torch, no_cuda_reason=reason, host=host)
    device = torch.cuda.current_device()
    name = torch.cuda.get_device_name(device)
    cap = tuple(torch.cuda.get_device_capability(device))
    return Env(target="cuda", torch=torch, device=device, gpu_name=name,
               is_grace_hopper=hardware.is_grace_hopper(platform.machine(), name, cap), host=host)


class HostBackend:
    """Host-memory operations: numpy, one thread (``memcpy``/``memset`` underneath).

    Not torch's CPU ops, although torch is usually there: they split a copy across an OpenMP
    pool, and on a busy node each copy then waits for the slowest thread to be scheduled (seen on
    a loaded 2-core machine: a 1 MiB torch copy at 0.15 GB/s with 2 threads, 26 GB/s with one).
    """

    name = "numpy"

    def __init__(self) -> None:
        import numpy as np  # noqa: PLC0415

        self.np = np

    def empty(self, nbytes: int) -> Any:
        return self.np.empty(nbytes, dtype=self.np.uint8)

    def view(self, buffer: Any) -> Any:
        """A uint8 array over a writable buffer (an mmap, a ctypes array, a numpy array)."""
        if isinstance(buffer, self.np.ndarray):
            return buffer
        return self.np.frombuffer(buffer, dtype=self.np.uint8)

    def fill(self, a: Any, value: int) -> None:
        a.fill(value)

    def copy(self, dst: Any, src: Any) -> None:
        self.np.copyto(dst, src)

    def all_equal(self, a: Any, value: int, probe_bytes: int = 4096) -> bool:
        """Whether the first and last ``probe_bytes`` of ``a`` all hold ``value``."""
        return all(bool((p == value).all()) for p in (a[:probe_bytes], a[-probe_bytes:]))


# --------------------------------------------------------------------------- statistics
def summarize(values: Sequence[float]) -> tuple[float, float, float]:
    """(median, min, max) of the finite values; NaNs when there are none."""
    vals = [v for v in values if v is not None and math.isfinite(v)]
    if not vals:
        return (math.nan, math.nan, math.nan)
    return (float(statistics.median(vals)), float(min(vals)), float(max(vals)))


def ms(seconds: float) -> float:
    return seconds * 1e3


def fmt_size(size_mb: int) -> str:
    return f"{size_mb}mb"


# --------------------------------------------------------------------------- recording
class SweepRecord:
    """One row per size: ``log_step`` at once, per-size metrics, ``sweep.csv``, ``samples.csv``.

    ``add(size_mb, samples)`` takes, per measured quantity, the list of timed samples (GB/s or
    ms); the step gets each quantity's median (and min/max for the main one).
    """

    def __init__(self, recorder: Recording, prefix: str, main: str) -> None:
        self.recorder = recorder
        self.prefix = prefix  # metric-name prefix, e.g. "h2d" or "managed"
        self.main = main  # the quantity that gbps/gbps_min/gbps_max of the step report
        self.rows: list[dict[str, float]] = []
        self.sample_rows: list[dict[str, float]] = []

    def add(self, size_mb: int, samples: dict[str, list[float]], **extra: float) -> dict[str, float]:
        step = len(self.rows)
        row: dict[str, float] = {"size_mb": float(size_mb)}
        for name, values in samples.items():
            med, lo, hi = summarize(values)
            row[name] = med
            if name == self.main:
                row[f"{name}_min"] = lo
                row[f"{name}_max"] = hi
            for i, v in enumerate(values):
                self.sample_rows.append({"size_mb": float(size_mb), "quantity": name,
                                         "sample": float(i), "value": float(v)})
        row.update({k: float(v) for k, v in extra.items()})
        self.rows.append(row)
        self.recorder.log_step(step, **{k: v for k, v in row.items() if math.isfinite(v)})
        for name in samples:
            if math.isfinite(row[name]):
                self.recorder.log_metric(f"{self.prefix}_{name}_{fmt_size(size_mb)}", row[name])
        return row

    def largest(self, name: str) -> float:
        return self.rows[-1][name] if self.rows else math.nan

    def peak(self, name: str) -> float:
        vals = [r[name] for r in self.rows if math.isfinite(r.get(name, math.nan))]
        return max(vals) if vals else math.nan

    def write(self) -> None:
        _write_csv(self.recorder.artifact_path("sweep.csv"), self.rows)
        _write_csv(self.recorder.artifact_path("samples.csv"), self.sample_rows)


def _write_csv(path: Path, rows: Iterable[dict[str, float]]) -> None:
    rows = list(rows)
    columns: list[str] = []
    for r in rows:
        columns += [k for k in r if k not in columns]
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=columns)
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if isinstance(v, float) and not math.isfinite(v) else v)
                        for k, v in r.items()})


def log_finite(recorder: Recording, name: str, value: float) -> None:
    if value is not None and math.isfinite(value):
        recorder.log_metric(name, value)
