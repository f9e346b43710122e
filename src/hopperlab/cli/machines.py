"""``hopperlab machines``, ``check`` and ``predict``: the verbs of issue 18 (machines side by side).

They read results folders and configs/machines|references of the project; they never load the
matrix (a colleague's results folder needs no site of ours).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Callable

from hopperlab.cli import check_nodes
from hopperlab.config.matrix import find_root, load_config, parse_overrides
from hopperlab.config.site import load_site
from hopperlab.core.effects import DEFAULT_MIN_EFFECT
from hopperlab.core.errors import HopperlabError, SpecError
from hopperlab.core.rundir import MLFLOW_FILE
from hopperlab.results.machines import (
    ab,
    ab_page,
    compare,
    descriptions,
    gpu_count,
    history,
    junit,
    mlflow_source,
    predict,
    prediction_error,
    prediction_pairs,
    reference_update,
    references,
    runs,
)
from hopperlab.results import correctness, scope
from hopperlab.results.tracking.verdicts import sync_verdicts
from hopperlab.results.rows import read_runs

EXIT_REGRESSION = 1
#: ``references update`` when a run was refused because it reads DIFFERENT (its correctness:
#: another computation than its baseline's); the other runs' references are written
EXIT_REFUSED = 1
#: ``check --strict`` when no run had a reference (CI that must have checked something)
EXIT_NOTHING_CHECKED = check_nodes.EXIT_NOTHING_CHECKED


def _root(args: argparse.Namespace) -> Path:
    return Path(args.root).resolve() if args.root else find_root()


def _default_results(root: Path, args: argparse.Namespace) -> Path:
    return root / load_config(root, parse_overrides(args.config))["results_dir"]


def cmd_machines(args: argparse.Namespace) -> int:
    root = _root(args)
    if args.mlflow:
        groups = mlflow_source.load(args.mlflow, args.results_dirs)
    else:
        if not args.results_dirs:
            raise SpecError("hopperlab machines: name the results folders to compare "
                            "(or --mlflow URI)")
        groups = runs.load_folders([Path(p) for p in args.results_dirs])
    refs_dir = root / references.REFERENCES_DIR
    for g in groups:
        references.judge_rows(g.runs.values(), refs_dir)
    descs = descriptions.load_descriptions(root / descriptions.MACHINES_DIR)
    targets = [descriptions.find_description(root / descriptions.MACHINES_DIR, t).name
               for t in args.predict]
    out = Path(args.out) if args.out else root / "results" / "machines"
    csv_path, html_path = compare.compare(groups, out, reference=_reference_machine(
                                              args.reference, groups, descs),
                                          descriptions=descs, targets=targets)
    print(f"[hopperlab] machines {', '.join(g.machine for g in groups)}: wrote {csv_path} "
          f"and {html_path}")
    return 0


def _reference_machine(name: str | None, groups: list[runs.MachineRuns],
                       descs: dict[str, descriptions.MachineDescription]) -> str | None:
    """``--reference`` as given, or the compared machine it is an alias of (``h200``)."""
    names = {g.machine for g in groups}
    if name is None or name in names:
        return name
    return next((m for m in names if m in descs and name in descs[m].aliases), name)


def cmd_check(args: argparse.Namespace) -> int:
    root = _root(args)
    if args.every_node:
        refs = Path(args.references) if args.references else root / references.REFERENCES_DIR
        return check_nodes.run(args, root, refs)
    results = Path(args.results_dir) if args.results_dir else _default_results(root, args)
    rows, refused = read_runs(results)
    for line in refused:
        print(f"[hopperlab] refused {line}")
    if not rows:
        raise SpecError(f"{results}: not a results folder (no run with a record)")
    refs_dir = Path(args.references) if args.references else root / references.REFERENCES_DIR
    judgements = references.judge_rows(rows, refs_dir)
    lines = references.check_lines(rows, judgements)
    counts: dict[str, int] = {}
    for j in judgements.values():
        counts[j.verdict] = counts.get(j.verdict, 0) + 1
    for line in lines:
        print(line)
    only = parse_overrides(args.config).get("only") or ""
    missing = references.missing_runs(rows, refs_dir, [o for o in only.split(",") if o])
    for m in missing:
        print(f"MISSING {m.machine} {m.pattern}: referenced in {m.source_file}, no run of it "
              f"in {results}" if args.strict else
              f"[hopperlab] note: {m.machine} {m.pattern} is referenced in {m.source_file}, "
              f"{results} has no run of it (--strict fails on it)")
    wrong = correctness.different_lines(rows)  # issue 47: another result is no pass
    for line in wrong:
        print(line)
    machines = sorted({r.machine or "unknown" for r in rows})
    print(f"[hopperlab] check {results} ({', '.join(machines)}): "
          + ", ".join(f"{v} {n}" for v, n in sorted(counts.items()))
          + (f", missing {len(missing)}" if missing else "")
          + (f", DIFFERENT {len(wrong)}" if wrong else ""))
    if args.junit:
        path = junit.write(Path(args.junit), f"hopperlab check {results}", rows, judgements)
        print(f"[hopperlab] wrote {path}")
    verdicts_to_mlflow(rows, root, args)  # a baseline finished since the upload: tag it now
    failing = {references.REGRESSION} | ({references.INCONCLUSIVE} if args.strict else set())
    if any(j.verdict in failing for j in judgements.values()) or (args.strict and missing) \
            or wrong:
        return EXIT_REGRESSION
    if set(counts) <= {references.NO_REFERENCE}:
        print(nothing_checked(refs_dir, machines, root))
        return EXIT_NOTHING_CHECKED if args.strict else 0
    return 0


def verdicts_to_mlflow(rows: list, root: Path, args: argparse.Namespace,
                       tracking_uri: str | None = None) -> None:
    """The verdicts just decided for ``rows``, set on their MLflow runs where they differ
    (``results.tracking.verdicts``): the site's store (``tracking_uri``, else the config's
    site's). Only runs uploaded there (``mlflow.json``) are touched; a folder without a
    project or a site is left alone, and MLflow down is one line, never a failure."""
    if not any((Path(r.run_dir) / MLFLOW_FILE).is_file() for r in rows):
        return
    if tracking_uri is None:
        try:
            config = load_config(root, parse_overrides(args.config))
            tracking_uri = load_site(root, config["site"], config["results_dir"]).tracking_uri
        except HopperlabError:
            return
    for line in sync_verdicts(rows, tracking_uri).lines():
        print(line)


def nothing_checked(refs_dir: Path, machines: list[str], root: Path) -> str:
    """What `check` says when no run had a reference: which files it looked for, which exist,
    and how a reference file is made."""
    have = sorted(p.stem for p in refs_dir.glob("*.yaml")) if refs_dir.is_dir() else []
    example = (refs_dir / f"{have[0]}.yaml") if have else refs_dir / "<machine>.yaml"
    try:
        example = example.relative_to(root)
    except ValueError:
        pass
    return (f"[hopperlab] check: nothing was checked: no reference for "
            f"{', '.join(machines)} in {refs_dir} (it has: {', '.join(have) or 'none'}). "
            f"References are made from known-good runs measured with repeats: snakemake "
            f"--config repeats=5, then hopperlab references update RESULTS_DIR (or by hand, "
            f"as in {example}); --strict makes this exit {EXIT_NOTHING_CHECKED}")


def cmd_references(args: argparse.Namespace) -> int:
    root = _root(args)
    refs_dir = Path(args.references) if args.references else root / references.REFERENCES_DIR
    folders = [Path(f) for f in args.results_dir]
    report = reference_update.update(folders, refs_dir, machine=args.machine,
                                     min_effect=args.min_effect,
                                     pool_machines=args.pool_machines)
    if len(folders) > 1:
        for folder, names in report.machines.items():
            print(f"[hopperlab] {folder}: runs of machine {' and '.join(names)}")
    for line in report.skipped:
        print(f"[hopperlab] skipped {line}")
    for line in report.refused:
        print(f"[hopperlab] refused {line}")
    for name, path in report.written.items():
        n = sum(1 for u in report.updated if u.startswith(name + " "))
        print(f"[hopperlab] references of {name}: {n} metric(s) written to {path}")
    if report.written and report.from_windows:
        print(f"[hopperlab] note: {folders[0]} is one process per run, and a fresh process "
              f"can differ by more than its windows do (docs/benchmarks/noise.md); references "
              f"from independent processes hold: snakemake --config processes=3, then "
              f"hopperlab references update {folders[0]}")
    if report.refused:
        print(f"[hopperlab] references update: {len(report.refused)} run(s) refused: they read "
              f"DIFFERENT (docs/correctness.md); "
              + ("the others written" if report.written else "no reference written")
              + f"; exit {EXIT_REFUSED}")
        return EXIT_REFUSED
    if not report.written:
        raise SpecError(f"{' '.join(args.results_dir)}: no reference written (the runs "
                        f"skipped above: too few samples, measure with --config repeats=N, N >= "
                        f"{reference_update.MIN_SAMPLES}; a machine that is not a name, "
                        f"give --machine)")
    return 0


def add_ab_options(p: argparse.ArgumentParser) -> None:
    """The options of ``hopperlab compare A B`` (the parser lives with ``compare``)."""
    p.add_argument("--out", help="where compare.html and compare.csv go (default: "
                                 "results/compare)")
    p.add_argument("--min-effect", type=float, default=None,
                   help="the smallest change worth reporting, a fraction (default 0.05)")
    p.add_argument("--mlflow", metavar="URI", help="A and B are MLflow filter strings on this "
                   "tracking server, e.g. \"tags.git_commit = 'abc123'\" (two commits, dates: "
                   "attributes.start_time, machines: tags.machine), or commit hashes (a "
                   "prefix is enough)")
    p.add_argument("--strict", action="store_true",
                   help="an inconclusive metric fails the comparison too (exit 1)")


def cmd_ab(args: argparse.Namespace) -> int:
    """``hopperlab compare A B``: exit 1 when B is worse than A beyond the noise, or a run
    of B failed, or B lacks a run or metric of A (a CI gate); 0 only when nothing is."""
    if len(args.targets) != 2:
        raise SpecError("hopperlab compare --mlflow URI: give two filter strings A B")
    a_name, b_name = args.targets
    if args.mlflow:
        a_rows = mlflow_source.load_query(args.mlflow, a_name)
        b_rows = mlflow_source.load_query(args.mlflow, b_name)
    else:
        a_rows, b_rows = ab.load_folder(Path(a_name)), ab.load_folder(Path(b_name))
    min_effect = args.min_effect if args.min_effect is not None else DEFAULT_MIN_EFFECT
    changes = ab.compare_runs(a_rows, b_rows, min_effect)
    for line in ab.text_lines(changes, a_name, b_name):
        print(line)
    wrong = correctness.different_lines(list(b_rows.values()))  # issue 47: B computes otherwise
    for line in wrong:
        print(f"B {line}")
    out = Path(args.out) if args.out else _root(args) / "results" / "compare"
    facts = [f"{side} ({name}): " + ", ".join(scope.run_facts(list(rows.values())))
             for side, name, rows in (("A", a_name, a_rows), ("B", b_name, b_rows))]
    csv_path, html_path = ab_page.write(changes, out, a_name, b_name, min_effect, facts)
    print(f"[hopperlab] {ab_page.headline(changes)[0]} Wrote {csv_path} and {html_path}")
    failing = ab.failing(changes) or wrong or (args.strict and [
        c for c in changes if c.verdict in (ab.INCONCLUSIVE, ab.CHANGED)])
    return EXIT_REGRESSION if failing else 0


def cmd_history(args: argparse.Namespace) -> int:
    """``hopperlab history``: a metric over time from MLflow, change points flagged."""
    root = _root(args)
    uri = args.mlflow
    if not uri:
        config = load_config(root, parse_overrides(args.config))
        uri = load_site(root, config["site"], config["results_dir"]).tracking_uri
    series = history.load(uri, args.machine, args.run, args.metric)
    min_effect = args.min_effect if args.min_effect is not None else DEFAULT_MIN_EFFECT
    for s in series:
        s.changes = history.change_points([p.value for p in s.points], s.direction, min_effect)
    for line in history.text_lines(series):
        print(line)
    out = Path(args.out) if args.out else root / "results" / "history"
    csv_path, html_path = history.write(series, out)
    print(f"[hopperlab] history: {len(series)} series, "
          f"{sum(1 for s in series if s.changes)} with change points; wrote {csv_path} and "
          f"{html_path}")
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    root = _root(args)
    folder = root / descriptions.MACHINES_DIR
    target = descriptions.find_description(folder, args.machine)
    groups = runs.load_folder(Path(args.results_dir))
    measured = None
    out: list[predict.Prediction] = []
    if args.gpus:
        if not args.measured:
            raise SpecError("hopperlab predict --gpus: give --measured, the folder of the "
                            "runs on several GPUs to predict from the one-GPU runs")
        measured_groups = runs.load_folder(Path(args.measured))
        measured = measured_groups[0]
        out = gpu_count.predict_counts(groups[0], target, measured_groups)
    else:
        if args.measured:
            measured = next((g for g in runs.load_folder(Path(args.measured))
                             if g.machine == target.name), None)
        descs = descriptions.load_descriptions(folder)
        for g in groups:
            if g.machine not in descs:
                raise SpecError(f"{args.results_dir}: its runs were measured on {g.machine}, "
                                f"which has no description ({folder / (g.machine + '.yaml')}); "
                                f"a prediction scales figures measured on a described machine: "
                                f"give results measured on one of {', '.join(sorted(descs))} "
                                f"(CPU smoke runs are not), or describe {g.machine} in that "
                                f"file (configs/machines/README.md)")
            out.extend(predict.predict(g, descs[g.machine], target, measured))
    if args.json:
        print(json.dumps([_pred_dict(p) for p in out], indent=2))
        return 0
    if measured is not None:
        print(f"[hopperlab] predicted {target.name} from {args.results_dir}: "
              + prediction_error.summary_line(out))
    for p in out:
        head = f"{p.key} {p.metric} on {p.target_machine} [PREDICTION from {p.source_machine}]"
        if p.unpredictable:
            print(f"{head}: not predicted: {p.unpredictable}")
            continue
        line = f"{head}: {p.predicted:.4g} (measured on {p.source_machine}: {p.source_value:.4g}"
        if p.measured is not None:
            line += f"; measured on {p.target_machine}: {p.measured:.4g}, error {p.error:+.1%}"
        print(line + ")")
        print(f"    {prediction_error.interval_text(p)}")
        print(f"    model {p.model}: {p.formula}")
        for k, v in p.inputs.items():
            print(f"    {k} = {v}")
        if p.energy is not None:
            print(f"    energy: {_energy_text(p.energy)}")
    return 0


def cmd_prediction_errors(args: argparse.Namespace) -> int:
    root = _root(args)
    path = root / prediction_error.ERRORS_FILE
    pairs, committed = prediction_error.load(path)
    by_pair = prediction_pairs.predictions(root, pairs)
    classes = prediction_error.measure(by_pair)
    for pair, preds in by_pair:
        print(f"{pair.name}: {prediction_error.summary_line(preds)}")
    for c in classes.values():
        old = committed.get(c.model)
        mark = "" if old == c else "  (the committed table differs)"
        print(f"  {c.text()}{mark}")
    if args.write:
        header = path.read_text().split("pairs:", 1)[0]
        path.write_text(prediction_error.dump(pairs, classes, header))
        print(f"[hopperlab] wrote {path}")
    return 0


def _energy_text(e: Any) -> str:
    if e.joules is None:
        return f"not predicted: {e.unpredictable}"
    text = f"{e.joules:.4g} {e.label}; {e.formula}; " + "; ".join(
        f"{k} = {v}" for k, v in (e.inputs or {}).items())
    if e.measured is not None and e.error is not None:
        text += f"; measured on target {e.measured:.4g} J, error {e.error:+.1%}"
    return text


def _pred_dict(p: predict.Prediction) -> dict[str, Any]:
    return {"label": p.label, "key": p.key, "metric": p.metric, "source_machine": p.source_machine,
            "target_machine": p.target_machine, "source_value": p.source_value,
            "predicted": p.predicted, "measured": p.measured, "error": p.error,
            "model": p.model, "formula": p.formula, "inputs": p.inputs,
            "unpredictable": p.unpredictable, **prediction_error.csv_fields(p),
            "energy": None if p.energy is None else {
                "joules": p.energy.joules, "label": p.energy.label, "formula": p.energy.formula,
                "inputs": p.energy.inputs, "measured": p.energy.measured,
                "error": p.energy.error, "unpredictable": p.energy.unpredictable}}


def add_verbs(sub: Any, add: Callable[..., argparse.ArgumentParser]) -> None:
    p = add("machines", cmd_machines,
            "compare results folders of several machines: machines.csv and machines.html")
    p.add_argument("results_dirs", nargs="*", help="results folders (with --mlflow: machine "
                                                   "names to keep, default all)")
    p.add_argument("--reference", help="the machine ratios are to (default: the first)")
    p.add_argument("--out", help="output folder (default: results/machines)")
    p.add_argument("--mlflow", help="read the runs from this MLflow tracking URI instead, "
                                    "grouped by their machine tag")
    p.add_argument("--predict", nargs="*", default=[], metavar="MACHINE",
                   help="also predict these machines (configs/machines/ names or aliases)")
    p = add("check", cmd_check, "judge runs against configs/references/<machine>.yaml; "
                                "exit 1 on a regression (a run failed, a metric worse, missing "
                                "or NaN in every sample), else 0; a check of nothing (no reference; "
                                "with --every-node, a node NOTHING CHECKED) is never a pass: "
                                f"it says so and exits 0, or {EXIT_NOTHING_CHECKED} with "
                                "--strict")
    p.add_argument("results_dir", nargs="?", help="default: the config's results_dir")
    p.add_argument("--references", help="folder of reference files (default configs/references)")
    p.add_argument("--strict", action="store_true",
                   help="an inconclusive run (a change within the noise, or some NaN "
                        "samples) fails the check too (exit 1), and so does a referenced run "
                        "the folder lacks (named either way; --config only=KEYS: the runs it "
                        "is meant to hold); a check of nothing (no run had a "
                        f"reference; with --every-node: a node nothing judged) exits "
                        f"{EXIT_NOTHING_CHECKED}")
    p.add_argument("--junit", metavar="FILE", help="also write JUnit XML (one test case per run)")
    p.add_argument("--every-node", action="store_true",
                   help="run the selected runs (--config only=...) once on every node of the "
                        "partition (one Slurm job per node, --nodelist), judge each node against "
                        "the references and the other nodes, name the slow one")
    p.add_argument("--partition", help="with --every-node: the partition (default: the site's)")
    p.add_argument("--nodes", help="with --every-node: these nodes (comma-separated) instead of "
                                   "the partition's")
    p.add_argument("--min-effect", type=float, default=None,
                   help="with --every-node: the smallest difference between nodes worth "
                        "reporting, a fraction (default 0.05)")
    p = add("references", cmd_references, "references from repeated runs: "
            "`hopperlab references update RESULTS_DIR`; a run that reads DIFFERENT (its "
            f"correctness) gives none and exits {EXIT_REFUSED}")
    p.add_argument("action", choices=("update",))
    p.add_argument("results_dir", nargs="+",
                   help="a results folder whose runs measured with repeats; several: each "
                        "folder's run is one independent process (its samples' median), and "
                        "the reference's spread is the spread between them")
    p.add_argument("--machine", help="the machine the references are for (default: each run's; "
                                     "folders of several machines are then refused unless "
                                     "--pool-machines)")
    p.add_argument("--pool-machines", action="store_true",
                   help="with --machine: take the runs of folders of different machines as "
                        "that machine's (without it each machine's folders make its own "
                        "references, and a folder given twice or copied is refused)")
    p.add_argument("--references", help="folder of reference files (default configs/references)")
    p.add_argument("--min-effect", type=float, help="the smallest change worth reporting, a "
                   "fraction (default: the file's, else 0.05)")
    p = add("history", cmd_history, "a metric over time from MLflow, per machine and run, "
            "with change points flagged: history.html and history.csv")
    p.add_argument("--mlflow", metavar="URI", help="tracking server (default: the site's)")
    p.add_argument("--machine", help="only this machine (its tag)")
    p.add_argument("--run", help="only this run, family/experiment/variant")
    p.add_argument("--metric", help="this metric (default: each run's first headline metric "
                                    "with a direction)")
    p.add_argument("--out", help="output folder (default: results/history)")
    p.add_argument("--min-effect", type=float, default=None,
                   help="the smallest change worth flagging, a fraction (default 0.05)")
    p = add("prediction-errors", cmd_prediction_errors,
            "measure each prediction model class's error on the pairs of "
            "configs/prediction_errors.yaml (the intervals every prediction carries)")
    p.add_argument("--write", action="store_true", help="write the measured table there")
    p = add("predict", cmd_predict, "predict a results folder's figures on another machine")
    p.add_argument("results_dir")
    p.add_argument("--machine", required=True, help="target (configs/machines/ name or alias)")
    p.add_argument("--measured", help="a results folder of the target machine, for the error")
    p.add_argument("--gpus", action="store_true",
                   help="across GPU counts: predict --measured's runs on several GPUs from "
                        "results_dir's one-GPU runs of the same variants (--machine: the "
                        "machine, per GPU), with the membench collectives of both folders")
    p.add_argument("--json", action="store_true")
