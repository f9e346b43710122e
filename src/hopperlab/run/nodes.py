"""A matrix pinned to one node: what ``hopperlab check --every-node`` fans out over (one job per
node and run), the way ReFrame's ``--distribute`` finds the one slow node of a partition. The
site's backend says how a job is pinned and which nodes there are."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from hopperlab.backends import launcher
from hopperlab.config.spec import Matrix


def pinned_to(matrix: Matrix, node: str, results_dir: Path) -> Matrix:
    """``matrix`` with every run sent to ``node`` (``--nodelist``) and recorded under
    ``results_dir`` (relative to the project root), one folder per node."""
    settings = launcher(matrix.site.executor).pinned(matrix.site.own_settings, node)
    site = matrix.site.with_settings(settings)
    base = Path(matrix.config["results_dir"])
    runs = {}
    for key, spec in matrix.runs.items():
        rel = Path(spec.run_dir).relative_to(base)
        runs[key] = replace(spec, site=site, run_dir=str(results_dir / rel))
    return Matrix(runs=runs, config={**matrix.config, "results_dir": str(results_dir)},
                  site=site, root=matrix.root)
