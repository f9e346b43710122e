"""The bookkeeping of benchmarks/references_gpu.sh (references from repeats, then a fresh check):

    python3 benchmarks/references_gpu.py measured RESULTS_DIR --repeats N
        prints the runs that ended ok with N samples (the fresh pass runs these); one line per
        other run on stderr: why it makes no reference (status, or repeats that did not reach
        the job: the tag ``repeats`` and samples.jsonl must both say N)
    python3 benchmarks/references_gpu.py coverage --references DIR --ref R1 [R2 ...]
        one line per run measured with repeats: the machine, the reference file's entry now
        (from repeats: value, spread, n, min_effect; or still a hand band)

Why a script of its own: a reference is only as good as the samples behind it, and the GPU call
has no second chance; what reached the job is read from the records, not assumed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from hopperlab.core.rundir import read_samples
from hopperlab.core.schema import load_yaml
from hopperlab.results.rows import collect_runs


def measured(results: Path, repeats: int) -> tuple[list[str], list[str]]:
    """(runs measured ok with ``repeats`` samples, one reason per other run)."""
    good, why = [], []
    for row in collect_runs(results):
        if row.status != "ok":
            why.append(f"{row.key}: {row.status} ({(row.reason or '')[:160]})")
            continue
        if repeats > 1:
            tag = str(row.tags.get("repeats", "1"))
            samples = len(read_samples(Path(row.run_dir)))
            if tag != str(repeats) or samples != repeats:
                why.append(f"{row.key}: repeats did not reach the job (tag repeats={tag}, "
                           f"{samples} samples in samples.jsonl, asked {repeats})")
                continue
        good.append(row.key)
    return good, why


def _entry(ref: Any) -> str:
    entries = ref if isinstance(ref, list) else [ref]
    parts = []
    for e in entries:
        if "spread" in e:
            parts.append(f"{e['value']:.6g} spread {e['spread']:.3g} n {e['n']} min_effect "
                         f"{e.get('min_effect', 0):.3g}")
        else:
            parts.append(f"{e['value']:.6g} band {e.get('lower')}..{e.get('upper')} (one run)")
    return " | ".join(parts)


def coverage(references: Path, results: list[Path]) -> list[str]:
    """Per run measured with repeats, each judged metric's entry in its machine's file now."""
    out = []
    for folder in results:
        for row in collect_runs(folder):
            if row.status != "ok" or str(row.tags.get("repeats", "1")) == "1":
                continue
            machine = row.machine or ""
            path = references / f"{machine}.yaml"
            data = load_yaml(path, "references") if path.is_file() else {}
            metrics = (data.get("references") or {}).get(row.key) or {}
            if not metrics:
                out.append(f"{machine} {row.key}: no entry written")
            for name, ref in metrics.items():
                out.append(f"{machine} {row.key} {name}: {_entry(ref)}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="verb", required=True)
    m = sub.add_parser("measured")
    m.add_argument("results", type=Path)
    m.add_argument("--repeats", type=int, required=True)
    c = sub.add_parser("coverage")
    c.add_argument("--references", type=Path, required=True)
    c.add_argument("--ref", type=Path, nargs="+", required=True)
    args = ap.parse_args(argv)
    if args.verb == "measured":
        good, why = measured(args.results, args.repeats) if args.results.is_dir() else ([], [])
        for line in why:
            print(f"[references] no reference: {line}", file=sys.stderr)
        print(",".join(good))
        return 0
    for line in coverage(args.references, [p for p in args.ref if p.is_dir()]):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
