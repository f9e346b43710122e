"""``hopperlab table runs|sharded|energy RESULTS_DIR``: the plain-text tables the docs and a
GPU call's output cite, printed by the product (``results/tables``), not by scripts beside it.

    runs     status, reference check, cost and headline figures of every run
    sharded  the sharded fine-tune's set-up, step, floors and host memory (--json OUT: figures)
    energy   each run's window, joules, power, trace/counter, J per unit and work per joule,
             judged against the node's matmul probe (membench/matmul in the folder, else the
             machine's description in configs/machines/)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from hopperlab.config.matrix import find_root
from hopperlab.core.errors import SpecError
from hopperlab.results.machines import descriptions, references
from hopperlab.results.machines.compare import probes_of
from hopperlab.results.machines.probes import with_measured
from hopperlab.results.rows import collect_runs
from hopperlab.results.tables import energy, runs, sharded

TABLES = ("runs", "sharded", "energy")


def add_commands(sub: argparse._SubParsersAction) -> None:
    """``hopperlab table NAME RESULTS_DIR`` under the main parser's ``sub``."""
    p = sub.add_parser("table", help="print a table of a results folder: runs, sharded, energy",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.set_defaults(func=run)
    p.add_argument("name", choices=TABLES)
    p.add_argument("results_dir", type=Path)
    p.add_argument("--json", type=Path, help="sharded: also write every sharded run's figures")
    p.add_argument("--root", default=argparse.SUPPRESS,
                   help="project root (default: found upward from the cwd)")


def run(args: argparse.Namespace) -> int:
    root = Path(args.root).resolve() if getattr(args, "root", None) else find_root()
    if not args.results_dir.is_dir():
        raise SpecError(f"{args.results_dir}: not a results folder (no such directory)")
    if args.name == "runs":
        out = runs.lines(args.results_dir, root / references.REFERENCES_DIR)
    elif args.name == "sharded":
        out = sharded.lines(args.results_dir)
        if args.json:
            args.json.write_text(json.dumps(sharded.figures(args.results_dir), indent=1,
                                            sort_keys=True))
    else:
        described = probes_of(descriptions.load_descriptions(root / descriptions.MACHINES_DIR))
        out = energy.lines(args.results_dir,
                           with_measured(described, collect_runs(args.results_dir)))
    print("\n".join(out))
    return 0
