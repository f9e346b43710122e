"""``hopperlab profile``: the job-side wrapper around a profiled run, and profile readers.

    hopperlab profile job --run-dir D --profiler nsys -- nsys profile ... python ...
    hopperlab profile metrics report.sqlite        # the prof_ metrics of an export or a trace
    hopperlab profile trim report.sqlite small.sqlite

``job`` is what ``profiler_prefix`` puts before a profiled job's python (docs/profiling.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hopperlab.profiling import nsys_sqlite, torch_trace
from hopperlab.profiling.finish import finish_profile, run_child
from hopperlab.profiling.timeline import DEFAULT_GAP_THRESHOLD_US, derive_metrics
from hopperlab.run import distributed


def add_commands(sub: argparse._SubParsersAction) -> None:
    """``hopperlab profile job|metrics|trim`` under the main parser's ``sub``."""
    p = sub.add_parser("profile", help="the profiled job's wrapper; read profiles",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.set_defaults(func=run)
    actions = p.add_subparsers(dest="action", required=True)
    job = actions.add_parser("job", help="run the command after --, then finish its profile")
    job.add_argument("--run-dir", type=Path, required=True)
    job.add_argument("--profiler", choices=("nsys", "torch"), required=True)
    job.add_argument("--nsys", default="nsys")
    job.add_argument("--gap-threshold-us", type=float, default=DEFAULT_GAP_THRESHOLD_US)
    job.add_argument("--keep-sqlite", action="store_true")
    job.add_argument("--report", action="append", default=[])
    job.add_argument("command", nargs=argparse.REMAINDER)
    show = actions.add_parser("metrics", help="print the prof_ metrics of an export or a trace")
    show.add_argument("path", type=Path)
    show.add_argument("--gap-threshold-us", type=float, default=DEFAULT_GAP_THRESHOLD_US)
    trim = actions.add_parser("trim", help="write the small copy of an nsys SQLite export")
    trim.add_argument("src", type=Path)
    trim.add_argument("dst", type=Path)


def run(args: argparse.Namespace) -> int:
    """One ``hopperlab profile`` action; ``job`` exits with the profiled command's status."""
    if args.action == "metrics":
        reader = torch_trace if ".json" in args.path.suffixes else nsys_sqlite
        metrics, tags = derive_metrics(reader.read_timeline(args.path), args.gap_threshold_us)
        print(json.dumps({"metrics": metrics, "tags": tags}, indent=1, sort_keys=True))
        return 0
    if args.action == "trim":
        nsys_sqlite.trim(args.src, args.dst)
        return 0
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    # a task of a distributed run: its own report under ranks/<r>/
    rank = str(distributed.rank_from_env())
    command = [c.replace(distributed.RANK_PLACEHOLDER, rank) for c in command]
    args.run_dir = Path(str(args.run_dir).replace(distributed.RANK_PLACEHOLDER, rank))
    if not command:
        print("hopperlab profile job: give the command to run after --", file=sys.stderr)
        return 2
    rc = run_child(command)
    summary = finish_profile(args.run_dir, args.profiler, nsys=args.nsys,
                             gap_threshold_us=args.gap_threshold_us,
                             keep_sqlite=args.keep_sqlite, reports=args.report)
    note = summary.get("error") or summary.get("note") or f"{len(summary['metrics'])} prof_ metrics"
    print(f"[hopperlab.profiling] {args.run_dir}: {note}", file=sys.stderr, flush=True)
    return rc
