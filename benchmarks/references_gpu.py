"""The bookkeeping of benchmarks/references_gpu.sh (references from repeats, then a fresh check):

    python3 benchmarks/references_gpu.py measured RESULTS_DIR [RESULTS_DIR ...] --repeats N
        prints the runs that ended ok with N samples in every folder (each folder one
        independent process of the run; the fresh pass runs these); one line per other run and
        folder on stderr: why it makes no reference (status, a process that never ran, or
        repeats that did not reach the job: the tag ``repeats`` and samples.jsonl must both
        say N)
    python3 benchmarks/references_gpu.py coverage --references DIR --ref R1 [R2 ...]
        one line per run measured in the references pass: the machine, the reference file's
        entry now (from repeats: value, spread, n, min_effect; or still a hand band)

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


def measured(results: Path | list[Path], repeats: int) -> tuple[list[str], list[str]]:
    """(runs measured ok with ``repeats`` samples in every folder of ``results``, in the first
    folder's order; one reason per other run and folder). Several folders: each is one
    independent process of the same runs, and a reference needs every one of them."""
    folders = [results] if isinstance(results, Path) else list(results)
    per_folder = [_measured_one(f, repeats) if f.is_dir() else ([], []) for f in folders]
    why = [line for _, lines in per_folder for line in lines]
    if len(folders) == 1:
        return per_folder[0][0], why
    seen = [set(good) for good, _ in per_folder]
    everywhere = [k for k in per_folder[0][0] if all(k in s for s in seen)]
    for key in sorted(set().union(*seen) - set(everywhere)):
        missing = [f.name for f, s in zip(folders, seen) if key not in s]
        why.append(f"{key}: not measured in {len(missing)} of {len(folders)} processes "
                   f"({', '.join(missing)})")
    return everywhere, why


def _measured_one(results: Path, repeats: int) -> tuple[list[str], list[str]]:
    good, why = [], []
    for row in collect_runs(results):
        if row.status != "ok":
            why.append(f"{row.key}: {row.status} ({(row.reason or '')[:160]}), in {results.name}")
            continue
        if repeats > 1:
            tag = str(row.tags.get("repeats", "1"))
            samples = len(read_samples(Path(row.run_dir)))
            if tag != str(repeats) or samples != repeats:
                why.append(f"{row.key}: repeats did not reach the job (tag repeats={tag}, "
                           f"{samples} samples in samples.jsonl, asked {repeats}), "
                           f"in {results.name}")
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
    """Per run of the references pass (``results``: its folders; a run in several is listed
    once), each judged metric's entry in its machine's file now."""
    out, listed = [], set()
    for folder in results:
        for row in collect_runs(folder):
            machine = row.machine or ""
            if row.status != "ok" or (machine, row.key) in listed:
                continue
            listed.add((machine, row.key))
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
    m.add_argument("results", type=Path, nargs="+")
    m.add_argument("--repeats", type=int, required=True)
    c = sub.add_parser("coverage")
    c.add_argument("--references", type=Path, required=True)
    c.add_argument("--ref", type=Path, nargs="+", required=True)
    args = ap.parse_args(argv)
    if args.verb == "measured":
        good, why = measured(args.results, args.repeats)
        for line in why:
            print(f"[references] no reference: {line}", file=sys.stderr)
        print(",".join(good))
        return 0
    for line in coverage(args.references, [p for p in args.ref if p.is_dir()]):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
