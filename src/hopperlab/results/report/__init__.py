"""``summary.csv`` and ``report.html`` made from the run directories under a results folder.

``collect`` reads the run directories into rows, ``summary`` writes the CSV, ``charts`` draws, and
``html`` lays out the self-contained page; ``build_report`` (here) does all of it for a folder.
"""

from __future__ import annotations

from pathlib import Path

from hopperlab.config.cost import CostSpec
from hopperlab.results.machines.references import judge_rows
from hopperlab.results.rows import collect_runs
from hopperlab.results.report.html import REPORT_FILE, write_html
from hopperlab.results.report.pricing import reprice
from hopperlab.results.report.summary import SUMMARY_FILE, write_summary


def _references_dir(results_dir: Path) -> Path | None:
    """configs/references of the project the results folder is in (None: none found)."""
    for folder in (results_dir.resolve(), *results_dir.resolve().parents):
        if (folder / "configs" / "references").is_dir():
            return folder / "configs" / "references"
    return None


def build_report(results_dir: Path, references_dir: Path | None = None, *,
                 price_now: bool = False, cost: CostSpec | None = None) -> tuple[Path, Path]:
    """Write ``summary.csv`` and ``report.html`` into ``results_dir``; return their paths.
    Each run is judged against its machine's references (``references_dir``, default the
    project's configs/references/). With ``price_now``, runs are priced at ``cost`` (the
    site's price of now; None: not priced), not at the rate recorded when they ran."""
    results_dir = Path(results_dir)
    runs = collect_runs(results_dir)
    if price_now:
        reprice(runs, cost)
    refs = references_dir or _references_dir(results_dir)
    if refs is not None:
        judge_rows(runs, refs)
    summary = write_summary(runs, results_dir / SUMMARY_FILE)
    report = write_html(runs, results_dir / REPORT_FILE, source=str(results_dir))
    return summary, report
