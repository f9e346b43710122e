"""Where the suite's time went: sums the per-test lines of tests/infra/timing.py by work unit.

    python3 scripts/test_times.py TIMES.jsonl [--top 25] [--write]

Prints the units (a test file, or the ``slurm`` group) with the most wall seconds, their CPU
seconds, and each worker's busy time (a worker that ends long after the others is the suite's
tail). ``--write`` renews tests/infra/unit_seconds.json, the weights that order the units
longest first (tests/infra/workers.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WEIGHTS = REPO / "tests" / "infra" / "unit_seconds.json"


def unit(row: dict) -> str:
    return row.get("group") or row["test"].split("::", 1)[0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("times", type=Path)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--write", action="store_true", help=f"renew {WEIGHTS.relative_to(REPO)}")
    ap.add_argument("--weights", type=Path, default=WEIGHTS, help="the file --write renews")
    args = ap.parse_args(argv)
    rows = [json.loads(line) for line in args.times.read_text().splitlines() if line.strip()]
    if not rows:
        print(f"{args.times}: no test lines", file=sys.stderr)
        return 1
    wall: dict[str, float] = defaultdict(float)
    cpu: dict[str, float] = defaultdict(float)
    tests: dict[str, int] = defaultdict(int)
    busy: dict[str, float] = defaultdict(float)
    kind: dict[str, list[float]] = {"unit": [0.0, 0.0, 0], "integration": [0.0, 0.0, 0]}
    for r in rows:
        k = kind["integration" if r.get("integration") else "unit"]
        k[0] += r["wall_s"]
        k[1] += r["cpu_s"]
        k[2] += 1
        u = unit(r)
        wall[u] += r["wall_s"]
        cpu[u] += r["cpu_s"]
        tests[u] += 1
        busy[r.get("worker", "main")] += r["wall_s"]
    print(f"{len(rows)} tests, {len(wall)} units: wall {sum(wall.values()):.0f} s, "
          f"CPU {sum(cpu.values()):.0f} s (worker and reaped children)")
    for name, (w, c, n) in kind.items():
        print(f"  {name} tests: {n}, wall {w:.0f} s, CPU {c:.0f} s")
    print("worker busy: " + ", ".join(f"{w} {s:.0f} s" for w, s in sorted(busy.items())))
    print(f"{'wall s':>8} {'CPU s':>8} {'tests':>5}  unit")
    for u in sorted(wall, key=wall.get, reverse=True)[:args.top]:
        print(f"{wall[u]:8.1f} {cpu[u]:8.1f} {tests[u]:5d}  {u}")
    if args.write:
        args.weights.write_text(json.dumps({u: round(s, 1) for u, s in sorted(wall.items())},
                                           indent=0) + "\n")
        print(f"wrote {args.weights} ({len(wall)} units)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
