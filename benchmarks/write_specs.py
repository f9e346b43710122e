"""Write the resolved spec.json of every run of the matrix into a folder, for running the job
body on a machine without Snakemake, submitit or jsonschema (e.g. the lent GPU machine):

    python benchmarks/write_specs.py .device-run --config scale=full families=membench
    bash benchmarks/run_specs.sh .device-run          # there; then open .device-run/results/report.html
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hopperlab.config.matrix import find_root, load_matrix, parse_overrides
from hopperlab.core.rundir import write_json_atomic


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dest", type=Path)
    ap.add_argument("--config", nargs="*", default=[], metavar="KEY=VALUE")
    args = ap.parse_args()
    matrix = load_matrix(find_root(), parse_overrides(args.config))
    for spec in matrix.runs.values():
        data = spec.to_dict()
        data["attempt"] = 1
        write_json_atomic(args.dest / spec.run_dir / "spec.json", data)
    print(f"{len(matrix.runs)} specs under {args.dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
