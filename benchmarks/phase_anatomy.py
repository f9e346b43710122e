"""Where one phase of a training step spends its time, from a full nsys SQLite export.

    python3 benchmarks/phase_anatomy.py REPORT.sqlite [--range forward] [--nth -2] [--bin-ms 20]

For the chosen NVTX range (by default the second-to-last ``forward``: a measured step), it
prints the span, how long kernels, device->host and host->device copies were busy (unions of
their intervals), a coarse timeline (busy share per bin), the gaps in kernel activity longer
than a millisecond with the CUDA runtime calls that the host was inside during each gap, and
the runtime calls that took the most host time in the range. A diagnostic for the docs (which
call blocks the host, which copy the compute waits for), not a metric: the ``prof_`` metrics
are the package's (hopperlab.profiling). Needs the runtime table with call names, so the full
export (``nsys export --type sqlite``), not the trimmed one the runs keep.
"""

from __future__ import annotations

import argparse
import sqlite3
from collections import defaultdict

from hopperlab.profiling.nsys_sqlite import copy_direction
from hopperlab.profiling.timeline import union


def _clip(intervals: list[tuple[int, int]], lo: int, hi: int) -> list[tuple[int, int]]:
    return [(max(s, lo), min(e, hi)) for s, e in intervals if e > lo and s < hi]


def _busy(intervals: list[tuple[int, int]]) -> int:
    return sum(e - s for s, e in intervals)


def _overlap(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> int:
    i = j = total = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sqlite")
    ap.add_argument("--range", default="forward", help="NVTX range name (forward, backward, step)")
    ap.add_argument("--nth", type=int, default=-2, help="which occurrence (Python index)")
    ap.add_argument("--bin-ms", type=float, default=20.0)
    ap.add_argument("--gap-ms", type=float, default=1.0)
    args = ap.parse_args()
    db = sqlite3.connect(f"file:{args.sqlite}?mode=ro", uri=True)
    strings = dict(db.execute("SELECT id, value FROM StringIds"))
    ranges = sorted((s, e) for s, e, t, tid in db.execute(
        'SELECT start, "end", text, textId FROM NVTX_EVENTS WHERE "end" > start')
        if (t if t is not None else strings.get(tid)) == args.range)
    if not ranges:
        raise SystemExit(f"{args.sqlite}: no NVTX range named {args.range!r}")
    lo, hi = ranges[args.nth]
    print(f"{args.range} #{args.nth % len(ranges)} of {len(ranges)}: {(hi - lo) / 1e6:.1f} ms "
          "(host-side NVTX span)")
    kernels = union(_clip([(s, e) for s, e in db.execute(
        'SELECT start, "end" FROM CUPTI_ACTIVITY_KIND_KERNEL')], lo, hi + 2_000_000_000))
    copies: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
    kinds = dict(db.execute("SELECT id, label FROM ENUM_CUDA_MEMCPY_OPER")) if db.execute(
        "SELECT name FROM sqlite_master WHERE name='ENUM_CUDA_MEMCPY_OPER'").fetchone() else {}
    for s, e, nbytes, kind in db.execute(
            'SELECT start, "end", bytes, copyKind FROM CUPTI_ACTIVITY_KIND_MEMCPY'):
        key = copy_direction(kinds.get(kind, str(kind)))
        copies[key].append((s, e, nbytes or 0))
    # the GPU side of the phase: from its first to its last kernel launched inside the range
    runtime = [(s, e, strings.get(n, str(n)), c) for s, e, n, c in db.execute(
        'SELECT start, "end", nameId, correlationId FROM CUPTI_ACTIVITY_KIND_RUNTIME '
        'WHERE start >= ? AND start <= ?', (lo, hi))]
    corr = {c for *_, c in runtime}
    gpu = [(s, e) for s, e, c in db.execute(
        'SELECT start, "end", correlationId FROM CUPTI_ACTIVITY_KIND_KERNEL') if c in corr]
    if gpu:
        glo, ghi = min(s for s, _ in gpu), max(e for _, e in gpu)
    else:
        glo, ghi = lo, hi
    print(f"GPU side (first to last kernel launched in it): {(ghi - glo) / 1e6:.1f} ms, "
          f"starts {(glo - lo) / 1e6:+.1f} ms from the range")
    k = _clip(kernels, glo, ghi)
    d2h = union(_clip([(s, e) for s, e, _ in copies["memcpy_d2h"]], glo, ghi))
    h2d = union(_clip([(s, e) for s, e, _ in copies["memcpy_h2d"]], glo, ghi))
    d2h_bytes = sum(b for s, e, b in copies["memcpy_d2h"] if glo <= s < ghi)
    h2d_bytes = sum(b for s, e, b in copies["memcpy_h2d"] if glo <= s < ghi)
    span = ghi - glo
    print(f"  kernels busy {_busy(k) / 1e6:.1f} ms ({_busy(k) / span:.0%}); "
          f"d2h busy {_busy(d2h) / 1e6:.1f} ms, {d2h_bytes / 1e9:.2f} GB started; "
          f"h2d busy {_busy(h2d) / 1e6:.1f} ms, {h2d_bytes / 1e9:.2f} GB started; "
          f"kernels under d2h {_overlap(k, d2h) / 1e6:.1f} ms")
    step = int(args.bin_ms * 1e6)
    print(f"  timeline (per {args.bin_ms:g} ms: kernel / d2h / h2d busy share)")
    t = glo
    while t < ghi:
        b = (t, min(t + step, ghi))
        w = b[1] - b[0]
        print(f"  {(t - glo) / 1e6:7.1f} ms  K {_busy(_clip(k, *b)) / w:4.0%}  "
              f"D {_busy(_clip(d2h, *b)) / w:4.0%}  H {_busy(_clip(h2d, *b)) / w:4.0%}")
        t += step
    print(f"  kernel gaps over {args.gap_ms:g} ms, and the runtime calls the host was inside:")
    gap_ns = args.gap_ms * 1e6
    all_runtime = [(s, e, strings.get(n, str(n))) for s, e, n in db.execute(
        'SELECT start, "end", nameId FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE "end" >= ? '
        'AND start <= ?', (glo - 2_000_000_000, ghi))]
    for (_, a), (b, _) in zip(k, k[1:]):
        if b - a < gap_ns:
            continue
        inside = sorted({name for s, e, name in all_runtime if s < b and e > a and e - s > 1e5})
        print(f"    at {(a - glo) / 1e6:7.1f} ms: {(b - a) / 1e6:6.1f} ms idle; d2h busy "
              f"{_busy(_clip(d2h, a, b)) / 1e6:.1f} ms; host in: {', '.join(inside) or '-'}")
    totals: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    for s, e, name, _ in runtime:
        tot = totals[name]
        tot[0] += 1
        tot[1] += (e - s) / 1e6
        tot[2] = max(tot[2], (e - s) / 1e6)
    print("  runtime calls issued in the range, by host time (calls, total ms, longest ms):")
    for name, (n, total, longest) in sorted(totals.items(), key=lambda kv: -kv[1][1])[:8]:
        print(f"    {name:40s} {n:6d} {total:9.1f} {longest:9.1f}")


if __name__ == "__main__":
    main()
