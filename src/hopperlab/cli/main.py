"""The ``hopperlab`` command, the project's one command line: every rule and doc calls it.

Verbs: list, submit, run, fetch, prepare-tracking, sync, report, compare, and the groups
``assets``, ``containers`` and ``profile``. Each Snakemake rule calls one of these, so that the
workflow stays thin and every piece of logic can be run and tested without Snakemake. Config
overrides use Snakemake's form: ``--config site=NAME scale=full``. An expected error
(``HopperlabError``) is one message and exit status 2; anything else is a bug and keeps its
traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from hopperlab.assets.registry import load_assets
from hopperlab.assets.store import materialize
from hopperlab.cli import assets as assets_cli
from hopperlab.cli import containers as containers_cli
from hopperlab.cli import machines as machines_cli
from hopperlab.cli import profile as profile_cli
from hopperlab.cli import tables as tables_cli
from hopperlab.config.matrix import find_root, load_matrix, parse_overrides
from hopperlab.config.spec import Matrix
from hopperlab.core.errors import HopperlabError, SpecError, one_line
from hopperlab.core.quiet import silence_known_noise
from hopperlab.results import tracking
from hopperlab.config.sweeps import family_sweeps
from hopperlab.results.report import build_report
from hopperlab.results.rows import collect_runs
from hopperlab.core.rundir import RECORD_FILE, RUN_UID, SPEC_FILE
from hopperlab.core.stats import half_width, plus_minus
from hopperlab.run import attempts
from hopperlab.run.scheduler import Interrupted
from hopperlab.run.submit import forced_by_workflow, submit
from hopperlab.workloads.base import KNOB_DEFAULTS

#: exit status of an expected error (a config mistake, a missing asset, a node that cannot...)
EXIT_EXPECTED_ERROR = 2
#: exit status when the reader of our output went away (128 + SIGPIPE, as a shell reports it)
EXIT_BROKEN_PIPE = 141


def _matrix(args: argparse.Namespace) -> Matrix:
    root = Path(args.root).resolve() if args.root else find_root()
    return load_matrix(root, parse_overrides(args.config))


def cmd_list(args: argparse.Namespace) -> int:
    matrix = _matrix(args)
    rows = []
    for spec in matrix.runs.values():
        knobs = {k: v for k, v in vars(spec.knobs).items() if v != KNOB_DEFAULTS[k]}
        r = spec.resources
        rows.append({"family": spec.family, "experiment": spec.experiment,
                     "variant": spec.variant, "knobs": knobs,
                     "resources": {"gpus": r.gpus, "cpus": r.cpus, "mem_gb": r.mem_gb,
                                   "time_min": r.time_min, "nodes": r.nodes,
                                   "gpus_per_node": r.gpus, "tasks_per_node": r.tasks_on_node,
                                   "world_size": r.world_size},
                     "run_dir": spec.run_dir})
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"hopperlab matrix: {len(rows)} runs, scale {matrix.config['scale']}, "
                        f"site {matrix.site.name} ({matrix.site.executor})")
    for col in ("family", "experiment", "variant", "knobs"):  # names are never cut
        table.add_column(col, no_wrap=True, overflow="fold",
                         min_width=max([len(col)] + [len(_cell(row, col)) for row in rows]))
    for col in ("gpus", "cpus", "mem GB", "time min", "nodes x tasks"):
        table.add_column(col)
    for row in rows:
        res = row["resources"]
        knobs = " ".join(f"{k}={v}" for k, v in row["knobs"].items()) or "-"
        table.add_row(row["family"], row["experiment"], row["variant"], knobs, str(res["gpus"]),
                      str(res["cpus"]), f"{res['mem_gb']:g}", str(res["time_min"]),
                      f"{res['nodes']} x {res['tasks_per_node']}")
    # piped or redirected: as wide as the table needs (a terminal's width would cut names)
    width = max(120, Console().width) if sys.stdout.isatty() else 100_000
    Console(width=width).print(table)
    for line in sweep_lines(matrix.root, matrix.config["families"], matrix.config["scale"]):
        print(line)
    return 0


def sweep_lines(root: Path, families: list[str], scale: str) -> list[str]:
    """Each swept experiment's axes and the points its family refused, with why."""
    lines = []
    for family in families:
        for exp_name, found in family_sweeps(root, family, scale).items():
            axes = " x ".join(f"{a} {v}" for a, v in found.axes.items())
            lines.append(f"sweep {family}/{exp_name}: {axes}; "
                         f"{len(found.experiment['variants'])} points run, "
                         f"{len(found.refused)} refused")
            lines += [f"  refused {family}/{exp_name}/{r.variant}: {r.why}"
                      for r in found.refused]
    return lines


def _cell(row: dict, col: str) -> str:
    if col == "knobs":
        return " ".join(f"{k}={v}" for k, v in row["knobs"].items()) or "-"
    return str(row[col])


def _uploader(args: argparse.Namespace):
    """What uploads a settled run (None with --no-upload: `hopperlab sync` does it later)."""
    if args.no_upload:
        return None
    tracking.warm_up_in_background()
    return tracking.upload_quietly


def cmd_submit(args: argparse.Namespace) -> int:
    # a finished run of the same spec is adopted unless the workflow was told to redo it
    try:
        return submit(_matrix(args), args.key, upload=_uploader(args),
                      adopt=not forced_by_workflow(args.key))
    except Interrupted as exc:  # the job was cancelled and the attempt settled
        print(f"hopperlab: {args.key}: stopped by {exc}", file=sys.stderr)
        return 128 + exc.signum


def cmd_run(args: argparse.Namespace) -> int:
    matrix = _matrix(args)
    spec = matrix.get(args.key)
    for name in sorted(set(spec.assets.values())):  # what Snakemake would have built first
        _fetch(matrix, name)
    rc = submit(matrix, args.key, upload=_uploader(args), executor="debug")
    print(measured_line(args.key, matrix.root / spec.run_dir, spec.headline_metrics))
    return rc


def measured_line(key: str, run_dir: Path, headline: tuple[str, ...]) -> str:
    """What a run measured, for the person who ran it by hand: its headline metrics (every
    final metric without one), ``value ± half-width`` where it repeated, and where they are.
    A run that did not end ok (skipped, oom, failed) says so with its reason and no figures:
    what it recorded (a price, the set-up time) is not a measurement."""
    record = attempts.read_object(run_dir / RECORD_FILE) or {}
    status = record.get("status")
    if status and status != "ok":
        reason = " ".join(str(record.get("reason") or "no reason recorded").split())
        return f"[hopperlab] {key} {status}: {reason} ({run_dir / RECORD_FILE})"
    metrics = {k: v for k, v in (record.get("metrics") or {}).items()
               if isinstance(v, (int, float)) and not isinstance(v, bool)}
    names = [m for m in headline if m in metrics] or [
        m for m in metrics if not m.endswith(("_ci_low", "_ci_high", "_cv", "_n"))]
    shown = ", ".join(f"{m} = {plus_minus(metrics[m], half_width(metrics, m))}"
                      for m in names)
    return f"[hopperlab] {key} measured {shown or 'nothing'} ({run_dir / 'metrics.json'})"


def _fetch(matrix: Matrix, name: str) -> Path:
    """Build one asset; with the matrix's substitutes, so that derived assets can be named."""
    specs = load_assets(matrix.root, matrix.config.get("asset_substitutes"))
    return materialize(name, matrix.root, matrix.site.assets_dir, specs=specs)


def cmd_fetch(args: argparse.Namespace) -> int:
    """Fetch or build assets into the site's assets_dir (verifying and repairing existing ones)."""
    matrix = _matrix(args)
    names = list(args.names)
    if args.matrix:
        names += sorted({a for spec in matrix.runs.values() for a in spec.assets.values()})
    if not names:
        raise SpecError("hopperlab fetch: name assets, or give --matrix for every asset the "
                        "matrix uses")
    for name in names:
        folder = _fetch(matrix, name)
        print(f"[hopperlab] asset {name}: {folder}")
    return 0


def cmd_prepare_tracking(args: argparse.Namespace) -> int:
    matrix = _matrix(args)
    tracking.prepare(matrix.site.tracking_uri, matrix.experiments())
    if args.touch:
        Path(args.touch).parent.mkdir(parents=True, exist_ok=True)
        Path(args.touch).write_text(json.dumps({"experiments": matrix.experiments()}) + "\n")
    return 0


def cmd_sync(args: argparse.Namespace) -> int:
    matrix = _matrix(args)
    report = tracking.sync(matrix.results_dir, matrix.site.tracking_uri)
    print(f"[hopperlab] sync to {tracking.redact_uri(matrix.site.tracking_uri)}: {report}")
    machines_cli.verdicts_to_mlflow(collect_runs(matrix.results_dir), matrix.root, args,
                                    matrix.site.tracking_uri)
    return 1 if report.failed else 0


def _folder_run_uids(matrix: Matrix, family: str, experiment: str) -> set[str]:
    """The attempts of an experiment that this results folder's records name (current and
    archived): what `compare` shows of a server that other folders upload to as well."""
    uids: set[str] = set()
    for spec in matrix.runs.values():
        if (spec.family, spec.experiment) != (family, experiment):
            continue
        run_dir = matrix.root / spec.run_dir
        for folder in [run_dir, *attempts.archived(run_dir)]:
            for name in (RECORD_FILE, SPEC_FILE):
                uid = (attempts.read_object(folder / name) or {}).get(RUN_UID)
                if isinstance(uid, str) and uid:
                    uids.add(uid)
    return uids


def cmd_compare(args: argparse.Namespace) -> int:
    if len(args.targets) == 2 or args.mlflow:  # A B: two results folders or MLflow queries
        return machines_cli.cmd_ab(args)
    if len(args.targets) != 1:
        raise SpecError("hopperlab compare: give family/experiment (the MLflow compare view), "
                        "or two results folders A B")
    args.experiment = args.targets[0]
    matrix = _matrix(args)
    family, _, experiment = args.experiment.partition("/")
    if (family, experiment) not in matrix.experiments():
        known = ", ".join(f"{f}/{e}" for f, e in matrix.experiments())
        raise SpecError(f"{args.experiment}: no such experiment in the matrix; it has: {known}")
    uri = matrix.site.tracking_uri
    print(tracking.experiment_compare_url(uri, family, experiment, ui_uri=args.ui,
                                          run_uids=_folder_run_uids(matrix, family, experiment)))
    if not args.ui and not uri.startswith(("http://", "https://")):
        # the address is that of `mlflow ui` on this store, which nothing has started yet
        print(f"[hopperlab] open it while the MLflow UI runs on this store: mlflow ui "
              f"--backend-store-uri {uri}", file=sys.stderr)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    matrix = _matrix(args)
    csv_path, html_path = build_report(matrix.results_dir)
    print(f"[hopperlab] wrote {csv_path} and {html_path}")
    machines_cli.verdicts_to_mlflow(collect_runs(matrix.results_dir), matrix.root, args,
                                    matrix.site.tracking_uri)
    if getattr(args, "what_if_price", False):
        if matrix.site.cost is None:
            raise SpecError(f"configs/sites/{matrix.site.name}.yaml: cost: the site has no "
                            "rate to price a what-if at")
        csv_path, html_path = build_report(matrix.results_dir, what_if=matrix.site.cost)
        print(f"[hopperlab] wrote {csv_path} and {html_path} (what-if prices)")
    return 0


def add_root(p: argparse.ArgumentParser) -> None:
    """``--root`` after the verb too (``hopperlab check --root X``), as the errors suggest it;
    unset, it leaves the main parser's value alone."""
    p.add_argument("--root", default=argparse.SUPPRESS,
                   help="project root (default: found upward from the cwd)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hopperlab", description=__doc__.split("\n")[0])
    parser.add_argument("--root", help="project root (default: found upward from the cwd); "
                                       "also accepted after the verb")
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name: str, func, help_: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_)
        p.add_argument("--config", nargs="*", default=[], metavar="KEY=VALUE",
                       help="override configs/config.yaml keys, as snakemake --config does")
        add_root(p)
        p.set_defaults(func=func)
        return p

    p = add("list", cmd_list, "show the matrix: family, experiment, variant, knobs, resources")
    p.add_argument("--json", action="store_true")
    for name, func, help_ in (("submit", cmd_submit, "run one run through the site's executor"),
                              ("run", cmd_run, "run one run in this process (debugging)")):
        p = add(name, func, help_)
        p.add_argument("key", help="family/experiment/variant")
        p.add_argument("--no-upload", action="store_true", help="leave MLflow for `sync`")
    p = add("fetch", cmd_fetch, "fetch or build assets into the site's assets_dir")
    p.add_argument("names", nargs="*", help="asset names (configs/assets.yaml, configs/assets.d/)")
    p.add_argument("--matrix", action="store_true", help="every asset the matrix names")
    p = add("prepare-tracking", cmd_prepare_tracking,
            "create the MLflow store, experiments and parent runs once, before any run")
    p.add_argument("--touch", help="write this marker file when done")
    add("sync", cmd_sync, "upload every run directory MLflow does not have yet")
    p = add("report", cmd_report, "write results/summary.csv and results/report.html (each "
            "run at the price it recorded)")
    p.add_argument("--what-if-price", action="store_true",
                   help="also price every run at this site's rate of now, into "
                        "summary-what-if.csv and report-what-if.html (the real files are kept)")
    p = add("compare", cmd_compare, "compare two results folders A B (verdicts per run and "
            "metric, compare.html; exit 1 when B is worse, failed or lacks a run), or print "
            "the MLflow UI address comparing an experiment's variants (family/experiment)")
    p.add_argument("targets", nargs="+", metavar="TARGET",
                   help="family/experiment (e.g. membench/copy), or two results folders A B, "
                        "or with --mlflow two MLflow filter strings A B")
    p.add_argument("--ui", help="address of the MLflow UI (default: the tracking server, or "
                                "http://127.0.0.1:5000 for a SQLite store opened with `mlflow ui`)")
    machines_cli.add_ab_options(p)
    for group in (assets_cli, containers_cli, profile_cli, tables_cli):
        group.add_commands(sub)
    machines_cli.add_verbs(sub, add)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    silence_known_noise()
    try:
        rc = args.func(args)
        sys.stdout.flush()
        return rc
    except HopperlabError as exc:
        print(one_line(exc), file=sys.stderr)
        return EXIT_EXPECTED_ERROR
    except BrokenPipeError:
        # `hopperlab ... | head`: the reader has gone; stop quietly, as a SIGPIPE'd tool would
        # (stdout pointed at /dev/null so that the interpreter's last flush cannot raise again)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE


if __name__ == "__main__":
    sys.exit(main())
