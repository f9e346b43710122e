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
from hopperlab.results.report.pricing import reprice, what_if_words
from hopperlab.results.report.summary import SUMMARY_FILE, write_summary


def _references_dir(results_dir: Path) -> Path | None:
    """configs/references of the project the results folder is in (None: none found)."""
    for folder in (results_dir.resolve(), *results_dir.resolve().parents):
        if (folder / "configs" / "references").is_dir():
            return folder / "configs" / "references"
    return None


#: the files of a what-if pricing: beside the real ones, never in their place
WHAT_IF_SUFFIX = "-what-if"


def build_report(results_dir: Path, references_dir: Path | None = None, *,
                 what_if: CostSpec | None = None) -> tuple[Path, Path]:
    """Write ``summary.csv`` and ``report.html`` into ``results_dir``; return their paths.
    Each run is judged against its machine's references (``references_dir``, default the
    project's configs/references/). Every figure is the run's own, its price too (priced once,
    when it was recorded, at its site's rate). With ``what_if``, runs are priced at that rate
    instead, into ``summary-what-if.csv`` and ``report-what-if.html``, which say so: a price
    the runs did not record never takes the real files' place."""
    results_dir = Path(results_dir)
    runs = collect_runs(results_dir)
    title = "hopperlab report"
    suffix = ""
    if what_if is not None:
        reprice(runs, what_if)
        suffix = WHAT_IF_SUFFIX
        title += f" — WHAT-IF: every run priced at {what_if_words(what_if)}, not as recorded"
    refs = references_dir or _references_dir(results_dir)
    if refs is not None:
        judge_rows(runs, refs)
    summary = write_summary(runs, results_dir / _suffixed(SUMMARY_FILE, suffix))
    report = write_html(runs, results_dir / _suffixed(REPORT_FILE, suffix),
                        source=str(results_dir), title=title)
    return summary, report


def _suffixed(name: str, suffix: str) -> str:
    stem, dot, ext = name.rpartition(".")
    return f"{stem}{suffix}{dot}{ext}"
