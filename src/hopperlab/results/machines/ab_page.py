"""``compare.html`` and ``compare.csv`` of ``hopperlab compare A B``: the page leads with a
verdict line and what changed (worse first), with each ratio's interval drawn as a bar against
the no-change line; what stayed the same within noise is folded away below. One self-contained
file (inline CSS, no scripts), like report.html."""

from __future__ import annotations

import csv
import html
import io
import math
from pathlib import Path
from typing import Sequence

from hopperlab.core.rundir import write_text_atomic
from hopperlab.results import scope
from hopperlab.results.machines.ab import (
    BETTER_WORD,
    CHANGED,
    DIFFERENT_B,
    FAILED_B,
    FASTER,
    INCONCLUSIVE,
    NAN_B,
    SAME,
    SLOWER,
    WORSE_WORD,
    Change,
    broken,
    unchanged_not_ok,
    worse,
)

_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:70em;color:#222}
h1{font-size:1.4em}.verdict{font-size:1.15em;padding:.6em 1em;border-radius:6px;margin:1em 0}
.bad{background:#fde2e1}.good{background:#e3f4e1}.meh{background:#f1f1f1}
table{border-collapse:collapse;width:100%}td,th{padding:.25em .6em;border-bottom:1px solid #ddd;
text-align:left;vertical-align:middle}td.num{text-align:right;font-variant-numeric:tabular-nums}
.slower,.worse,.changed{color:#b00020;font-weight:600}.faster,.better{color:#1b7d1b;
font-weight:600}.inconclusive{color:#8a6d00}.bar{position:relative;width:14em;height:.9em;
background:#fafafa}.bar span{position:absolute;top:0;height:100%;background:#9ab}
.bar i{position:absolute;top:-2px;bottom:-2px;width:1px;background:#333;left:50%}
details{margin-top:1.5em}summary{cursor:pointer;font-weight:600}.note{color:#666}
.DIFFERENT{color:#b00020;font-weight:600}
""" + scope.CSS


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _num(value: float | None) -> str:
    return "" if value is None else f"{value:.4g}"


def _bar(c: Change) -> str:
    """The ratio's interval on a log axis from x0.5 to x2, the no-change line in the middle."""
    if c.effect is None:
        return ""

    def pos(r: float) -> float:
        return min(100.0, max(0.0, 50 + 50 * math.log2(max(r, 1e-9))))

    lo, hi = pos(c.effect.ratio_low), pos(c.effect.ratio_high)
    return (f'<div class="bar" title="x{c.effect.ratio_low:.3f} .. x{c.effect.ratio_high:.3f}">'
            f'<span style="left:{lo:.1f}%;width:{max(hi - lo, 0.5):.1f}%"></span><i></i></div>')


def _plain_ratio(c: Change) -> str:
    """B/A of a row the noise test could not judge (too few samples): the ratio of the medians,
    said to have no interval, rather than an empty cell."""
    if c.a is None or c.b is None or not c.a or not math.isfinite(c.b / c.a):
        return ""
    return f"x{c.b / c.a:.3f} (no interval)"


def _rows(changes: Sequence[Change]) -> str:
    """The table; the interval bar's column only where a row has an interval (issue 49: a
    column of empty cells when no run was repeated)."""
    bars = any(c.effect is not None for c in changes)
    out = []
    for c in changes:
        ratio = (f"x{c.effect.ratio:.3f} [{c.effect.ratio_low:.3f}, {c.effect.ratio_high:.3f}]"
                 if c.effect else _plain_ratio(c))
        cls = c.verdict.split()[0]
        out.append(f"<tr><td class='{_e(cls)}'>{_e(c.verdict)}</td><td>{_e(c.key)}</td>"
                   f"<td>{_e(c.metric)}</td><td class=num>{_num(c.a)}</td>"
                   f"<td class=num>{_num(c.b)}</td><td class=num>{_e(ratio)}</td>"
                   + (f"<td>{_bar(c)}</td>" if bars else "")
                   + f"<td class=num>{c.n_a or ''} / {c.n_b or ''}</td></tr>")
    head = ("<tr><th>verdict</th><th>run</th><th>metric</th><th>A</th><th>B</th>"
            "<th>B/A [95 %]</th>" + ("<th>x0.5 &middot; x1 &middot; x2</th>" if bars else "")
            + "<th>samples A/B</th></tr>")
    return f"<table>{head}{''.join(out)}</table>"


def headline(changes: Sequence[Change]) -> tuple[str, str]:
    """The page's first line and its colour class."""
    bad = worse(changes)
    good = [c for c in changes if c.verdict in (FASTER, BETTER_WORD)]
    unclear = [c for c in changes if c.verdict in (INCONCLUSIVE, CHANGED)]
    lost = broken(changes)
    both = unchanged_not_ok(changes)
    alike = f"; {len(both)} not ok on both sides alike (not a change)" if both else ""
    if bad or lost:
        failed = sum(1 for c in lost if c.verdict == FAILED_B)
        nan = sum(1 for c in lost if c.verdict == NAN_B)
        wrong = [c.key for c in lost if c.verdict == DIFFERENT_B]
        parts = [f"{failed} run(s) failed in B"] if failed else []
        if wrong:
            parts.append(f"{len(wrong)} run(s) of B read DIFFERENT, not a finding: "
                         + ", ".join(wrong))
        if nan:
            parts.append(f"{nan} metric(s) of B not a number")
        if len(lost) > failed + nan + len(wrong):
            parts.append(f"{len(lost) - failed - nan - len(wrong)} run(s) or metric(s) of A "
                         "missing from B")
        if bad:
            top = max(bad, key=lambda c: c.effect.worse_by if c.effect else 0)
            by = f" (largest: {top.key} {top.metric}, {top.effect.worse_by:.1%} " \
                 f"{top.verdict})" if top.effect else ""
            parts.insert(0, f"B is worse than A in {len(bad)} metric(s){by}")
        return "; ".join(parts) + alike + ".", "bad"
    if good:
        return (f"B is better than A in {len(good)} metric(s), worse in none"
                + (f"; {len(unclear)} inconclusive" if unclear else "") + alike + ".", "good")
    if unclear:
        return (f"No change beyond the noise; {len(unclear)} metric(s) inconclusive{alike}.",
                "meh")
    return f"No change beyond the noise{alike}.", "good"


def write(changes: Sequence[Change], out: Path, a_name: str, b_name: str,
          min_effect: float, facts: Sequence[str] = ()) -> tuple[Path, Path]:
    """Write ``out/compare.csv`` and ``out/compare.html``; return both paths. ``facts``: what
    the page holds (``scope.run_facts`` of A and of B), said at its top."""
    out = Path(out)
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["verdict", "run", "metric", "a", "b", "ratio", "ratio_low", "ratio_high",
                "n_a", "n_b", "detail"])
    for c in changes:
        e = c.effect
        w.writerow([c.verdict, c.key, c.metric, c.a, c.b, e.ratio if e else "",
                    e.ratio_low if e else "", e.ratio_high if e else "", c.n_a, c.n_b,
                    c.detail])
    csv_path, html_path = out / "compare.csv", out / "compare.html"
    write_text_atomic(csv_path, buf.getvalue())
    line, cls = headline(changes)
    changed = [c for c in changes if c.changed]
    same = [c for c in changes if c.verdict == SAME]
    both = unchanged_not_ok(changes)
    body = [f"<h1>{_e(a_name)} (A) &rarr; {_e(b_name)} (B)</h1>", scope.scope_html(facts),
            f"<div class='verdict {cls}'>{_e(line)}</div>",
            f"<p class=note>Per run and headline metric: the ratio of the medians B/A with its "
            f"95 % interval (the test of docs/benchmarks/noise.md); a change counts when the "
            f"interval excludes x1 and it is at least {min_effect:.0%}. "
            f"{SLOWER}/{WORSE_WORD} and {FASTER}/{BETTER_WORD} follow each metric's declared "
            f"direction.</p>",
            "<h2>What changed</h2>", _rows(changed) if changed else "<p>Nothing.</p>",
            *([f"<h2>Not ok on both sides alike ({len(both)})</h2>", _rows(both)] if both
              else []),
            f"<details><summary>Same within noise ({len(same)})</summary>{_rows(same)}"
            f"</details>"]
    page = (f"<!doctype html><html><head><meta charset=utf-8><title>compare {_e(a_name)} -> "
            f"{_e(b_name)}</title><style>{_CSS}</style></head><body>{''.join(body)}"
            f"</body></html>\n")
    write_text_atomic(html_path, page)
    return csv_path, html_path
