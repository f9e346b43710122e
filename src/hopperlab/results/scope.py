"""The line at the top of every page that says what the page holds (issue 37, item 7): the
scale, whether the figures are CPU stand-ins, whether the prices are examples, how many samples
each figure is the median of. A reader who stops after the title must not take a smoke run on
a CPU for a GPU finding. Read from the records through ``marks``, never guessed from names."""

from __future__ import annotations

import html
from typing import Any, Sequence

from hopperlab.results import marks

CSS = (".scope{background:#fff8e1;border-left:4px solid #f9a825;padding:.5em .8em;"
       "margin:.6em 0 1em}")


def _samples(run: Any) -> int:
    metric = next(iter(getattr(run, "headline_metrics", ()) or ()), None)
    return marks.samples(run, metric) if metric else 1


def _span(values: Sequence[int]) -> str:
    lo, hi = min(values), max(values)
    return str(lo) if lo == hi else f"{lo}-{hi}"


def run_facts(runs: Sequence[Any]) -> list[str]:
    """What a page made of these runs (``RunRow``s, or anything with ``status``, ``scale``,
    ``tags``, ``metrics``) holds, one fact a sentence."""
    ok = [r for r in runs if getattr(r, "status", None) == "ok"]
    facts = [f"{len(runs)} run(s), {len(ok)} ok"]
    scales = sorted({str(r.scale) for r in runs if getattr(r, "scale", None)})
    if scales:
        facts.append("scale " + " and ".join(scales)
                     + (" (tiny models and data: a functional check, not a measurement of the "
                        "hardware)" if "smoke" in scales else ""))
    stand = [r for r in ok if marks.stand_in(r)]
    if stand:
        facts.append(f"{len(stand)} of {len(ok)} ok run(s) are {marks.STAND_IN}s (no GPU was "
                     "measured): their ratios show that the code path runs, they are not "
                     "findings and no verdict ranks them")
    elif ok:
        facts.append("every ok run measured a GPU")
    example = [r for r in runs if marks.example_price(r)]
    if example:
        facts.append(f"prices of {len(example)} run(s) are {marks.EXAMPLE_PRICE}s (the site's "
                     "cost says example: true), not what the runs cost")
    if ok:
        n = [_samples(r) for r in ok]
        facts.append(f"samples per run: {_span(n)}"
                     + (" (one sample: no interval; a ratio within run-to-run noise is not a "
                        "difference)" if min(n) < 2 else ""))
    return facts


def scope_html(facts: Sequence[str]) -> str:
    """The page's first paragraph: "What this page holds: ...". Empty facts: nothing."""
    if not facts:
        return ""
    text = "; ".join(html.escape(f) for f in facts)
    return f'<p class="scope"><b>What this page holds:</b> {text}.</p>'
