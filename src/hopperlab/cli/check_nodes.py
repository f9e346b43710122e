"""``hopperlab check --every-node``: the check's runs once on every node of a partition (one
Slurm job per node and run, ``--nodelist``), each node judged against the references and
against the other nodes, the slow one named, JUnit XML beside the text."""

from __future__ import annotations

import argparse
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Sequence

from hopperlab import backends
from hopperlab.config.matrix import load_matrix, parse_overrides
from hopperlab.core.effects import DEFAULT_MIN_EFFECT
from hopperlab.core.errors import SpecError
from hopperlab.results.machines import junit, node_check
from hopperlab.results.rows import collect_runs
from hopperlab.run.nodes import pinned_to
from hopperlab.run.submit import submit

EXIT_REGRESSION = 1
#: ``check --strict`` of nothing (``cli.machines`` takes its code from here)
EXIT_NOTHING_CHECKED = 3
_PRINT = threading.Lock()


def _say(node: str):
    def log(line: str) -> None:
        with _PRINT:
            print(f"[{node}] {line}", flush=True)
    return log


def run(args: argparse.Namespace, root: Path, refs_dir: Path) -> int:
    matrix = load_matrix(root, parse_overrides(args.config))
    if not matrix.site.backend.pins_nodes:
        raise SpecError(f"hopperlab check --every-node: the site {matrix.site.name} runs with "
                        f"the {matrix.site.executor} executor; one job per node needs a "
                        f"scheduler that places jobs on named nodes, such as Slurm "
                        f"(--config site=<a slurm site>)")
    ops = backends.launcher(matrix.site.executor)
    partition = args.partition or ops.default_partition(matrix.site.own_settings)
    nodes = [n for n in args.nodes.split(",") if n] if args.nodes else \
        ops.nodes_of(matrix.site.own_settings, partition)
    base = Path(matrix.config["results_dir"]) / "nodes"
    print(f"[hopperlab] check --every-node: {len(matrix.runs)} run(s) on {len(nodes)} node(s) "
          f"of partition {partition or '(default)'}: {', '.join(nodes)}", flush=True)

    def one(node: str) -> None:
        pinned = pinned_to(matrix, node, base / node)
        for key in pinned.runs:
            try:
                submit(pinned, key, upload=None, adopt=False, log=_say(node))
            except Exception as exc:  # noqa: BLE001 - a node that cannot run is a verdict
                _say(node)(f"{key}: {type(exc).__name__}: {exc}")

    with ThreadPoolExecutor(max_workers=len(nodes)) as pool:
        list(pool.map(one, nodes))
    rows = {n: collect_runs(matrix.root / base / n) for n in nodes}
    min_effect = args.min_effect if args.min_effect is not None else DEFAULT_MIN_EFFECT
    verdicts = node_check.judge_nodes(rows, refs_dir, min_effect)
    for v in verdicts:
        print(f"NODE {v.node}: {v.verdict.upper()}")
        for line in v.lines:
            print(f"    {line}")
    unchecked = [v.node for v in verdicts if v.verdict == node_check.NOTHING_CHECKED]
    bad = [v.node for v in verdicts if v.verdict not in (node_check.PASS,
                                                         node_check.NOTHING_CHECKED)]
    passed = len(verdicts) - len(bad) - len(unchecked)
    print(f"[hopperlab] check --every-node: {passed} of {len(verdicts)} node(s) pass"
          + (f"; not: {', '.join(bad)}" if bad else "")
          + (f"; nothing checked: {', '.join(unchecked)}" if unchecked else ""))
    if args.junit:
        all_rows = [r for n in nodes for r in rows[n]]
        node_of = {str(r.run_dir): n for n in nodes for r in rows[n]}
        judged = {d: j for v in verdicts for d, j in v.judgements.items()}
        slow = {d: lines for v in verdicts for d, lines in v.slow.items()}
        path = junit.write(Path(args.junit), f"hopperlab check --every-node {partition or ''}",
                           all_rows, judged, node_of=node_of, slow=slow)
        print(f"[hopperlab] wrote {path}")
    return exit_code(verdicts, args.strict)


def exit_code(verdicts: Sequence[node_check.NodeVerdict], strict: bool) -> int:
    """``check``'s codes: 1 when a node failed, regressed or is slow; a node nothing checked is
    no pass, said as NOTHING CHECKED, and exits ``EXIT_NOTHING_CHECKED`` under ``--strict``
    (0 without, as a plain check of nothing)."""
    if any(v.verdict not in (node_check.PASS, node_check.NOTHING_CHECKED) for v in verdicts):
        return EXIT_REGRESSION
    if strict and (not verdicts or any(v.verdict == node_check.NOTHING_CHECKED
                                       for v in verdicts)):
        return EXIT_NOTHING_CHECKED
    return 0
