"""``report.html``: one self-contained file (inline CSS, charts as inline PNG, no scripts, no
external URLs), so that it can be mailed, archived or opened on an air-gapped login node."""

from __future__ import annotations

import base64
import html
import io
import re
from collections import Counter
from pathlib import Path
from typing import Any, Mapping, Sequence

from hopperlab.core import rundir as rec
from hopperlab.core.progress import track
from hopperlab.core.stats import half_width, money
from hopperlab.results.report.charts import (
    DASH,
    STATUS_COLOURS,
    Plotter,
    chart_metrics,
    fmt,
    ordered,
    profile_breakdown,
)
from hopperlab.results.machines.tradeoffs import CSS as TRADEOFF_CSS, tradeoffs_html
from hopperlab.results.report.verdicts import family_verdicts
from hopperlab.results.report.crossovers import crossover_section
from hopperlab.results.report.energy import energy_section
from hopperlab.results import correctness, marks, scope
from hopperlab.results.rows import (
    RunRow,
    baseline_name,
    group_by_experiment,
    ratio_to,
    reference_run,
    sort_key,
)
from hopperlab.workloads import family_info
from hopperlab.workloads.base import KNOB_DEFAULTS

REPORT_FILE = "report.html"


PROGRESS_MIN_RUNS = 50


_HARDWARE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("hostname", "host"), ("cpu_model", "CPU model"), ("cpu_arch", "arch"),
    ("cpu_cores", "cores"), ("mem_total_gb", "memory"), ("gpu_model", "GPU model"),
    ("gpu_count", "GPUs"), ("gpu_memory_gb", "GPU memory"), ("driver", "driver"),
    ("host_link", "host link"), ("threads", "job CPUs: threads"),
)


#: the page's style sheet, inlined: report.html stays one self-contained file
_CSS = (Path(__file__).with_name("report.css")).read_text() + scope.CSS + TRADEOFF_CSS


def _e(value: Any) -> str:
    return html.escape(fmt(value) if not isinstance(value, str) else value, quote=True)


def _anchor(*parts: str) -> str:
    return "x-" + re.sub(r"[^A-Za-z0-9_-]+", "-", "--".join(parts))


def _badge(status: str) -> str:
    colour = STATUS_COLOURS.get(status, "#424242")
    return f'<span class="st" style="background:{colour}">{_e(status)}</span>'


def _counts(runs: Sequence[RunRow]) -> str:
    counts = Counter(r.status for r in runs)
    order = [s for s in rec.STATUSES if s in counts] + sorted(set(counts) - set(rec.STATUSES))
    return " ".join(f"{_badge(s)}&nbsp;{counts[s]}" for s in order)


def _hardware_value(key: str, value: Any) -> str:
    if value is None or value == "":
        return DASH
    if key in ("mem_total_gb", "gpu_memory_gb") and isinstance(value, (int, float)):
        return f"{fmt(float(value))} GB"
    if key == "threads" and isinstance(value, Mapping):
        return (f"{value.get('cpus')} ({value.get('source')}): intra-op {value.get('intra_op')}, "
                f"loader workers {value.get('dataloader_workers')}, DuckDB {value.get('duckdb')}")
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value)
    return fmt(value)


def _hardware_table(runs: Sequence[RunRow]) -> str:
    hosts: dict[tuple[str, ...], int] = {}
    for r in runs:
        if not r.hardware:
            continue
        row = (_hardware_value("machine", r.machine),
               *(_hardware_value(k, r.hardware.get(k)) for k, _ in _HARDWARE_COLUMNS))
        hosts[row] = hosts.get(row, 0) + 1
    if not hosts:
        return '<p class="note">No run recorded its hardware.</p>'
    head = "<th>machine</th>" + "".join(f"<th>{_e(label)}</th>" for _, label in _HARDWARE_COLUMNS)
    head += "<th>runs</th>"
    body = "".join(
        "<tr>" + "".join(f"<td>{_e(v)}</td>" for v in row) + f'<td class="num">{n}</td></tr>'
        for row, n in sorted(hosts.items())
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _knobs(knobs: Mapping[str, Any]) -> str:
    """The knobs a variant turns away from their defaults (the rest would only be noise)."""
    changed = [f"{k}={v}" for k, v in knobs.items() if KNOB_DEFAULTS.get(k) != v]
    return ", ".join(changed) or "defaults"


def _mark(text: str, why: str) -> str:
    return f' <span class="mark" title="{_e(why)}">{_e(text)}</span>'


def _marks_note(runs: Sequence[RunRow], metrics: Sequence[str]) -> str:
    """One line under an experiment's table: what its marks mean, for the marks it shows."""
    notes = []
    stand = [r for r in runs if marks.stand_in(r)]
    if stand:
        notes.append(f"{marks.STAND_IN}: {len(stand)} of the ok variants ran without a GPU "
                     f"({_e(marks.stand_in(stand[0]))}); their figures measure the CPU code "
                     "path, not the memory or device their names say, and their ratios compare "
                     "CPU runs")
    wrong = [r.variant for r in runs if not correctness.offered(r)]
    if wrong:
        notes.append(f"DIFFERENT: {_e(', '.join(wrong))} computed another result than what "
                     "they are compared with (the correctness column says where first): their "
                     "figures are struck through, give no ratio and are no finding, their bars "
                     f"grey, cross-hatched and labelled {correctness.NOT_A_FINDING}")
    if any(marks.example_price(r) for r in runs):
        notes.append(f"{marks.EXAMPLE_PRICE}: the site's rate is an example (its cost block "
                     "says example: true), not what the run cost")
    if metrics and any(marks.one_sample(r, reference_run(r, runs), m) for r in runs
                       for m in metrics if r.status == "ok" and not r.is_baseline):
        notes.append(f"{marks.ONE_SAMPLE}: a ratio of two single runs; a neighbour's job or a "
                     "cold cache moves it by more than many effects (measure with --config "
                     "repeats=N for an interval)")
    return "".join(f'<p class="note marks">{n}.</p>' for n in notes)


def _compared_note(run: RunRow, runs: Sequence[RunRow]) -> str:
    """``(baseline)``, or ``(vs X)`` for a variant compared with another variant than it."""
    if run.is_baseline:
        return ' <span class="note">(baseline)</span>'
    if run.compare_to and run.compare_to != baseline_name(runs):
        return f' <span class="note">(vs {_e(run.compare_to)})</span>'
    return ""


def _correctness_cell(run: RunRow) -> str:
    """The run's correctness verdict (issue 47), its detail on hover; DIFFERENT stands out, and
    its figures are struck through and give no ratio."""
    v = run.correctness
    if v is None:
        return f'<td>{"baseline" if run.is_baseline else DASH}</td>'
    cls = {correctness.DIFFERENT: "corr-bad", correctness.SAME: "corr-ok",
           correctness.WITHIN: "corr-ok"}.get(v.state, "corr-none")
    return f'<td class="{cls}" title="{_e(v.detail)}">{_e(v.cell())}</td>'


def _status_table(runs: Sequence[RunRow], metrics: Sequence[str]) -> str:
    show_knobs = any(r.knobs for r in runs)
    head = ["variant", "status", "attempt", "scale", "host", "duration s", "set-up s"]
    head += ["knobs"] if show_knobs else []
    others = any(r.compare_to and r.compare_to != baseline_name(runs) for r in runs)
    show_check = any(r.reference_check not in (None, "no-reference") for r in runs)
    show_cost = any("cost_run" in r.metrics for r in runs)
    example = any(marks.example_price(r) for r in runs)
    head += ["reference check"] if show_check else []
    head += [f"cost of the run, its set-up included ({marks.EXAMPLE_PRICE})" if example
             else "cost of the run, its set-up included"] if show_cost else []
    show_same = any(r.correctness is not None for r in runs)
    head += ["correctness"] if show_same else []
    for m in metrics:
        head += [m, "\u00d7 reference" if others else "\u00d7 baseline"]
    out = ['<div class="scroll"><table><thead><tr>', *(f"<th>{_e(h)}</th>" for h in head),
           "</tr></thead><tbody>"]
    for r in runs:
        variant = _e(r.variant) + _compared_note(r, runs)
        why = marks.stand_in(r)
        if why:
            variant += _mark(marks.STAND_IN, why)
        base = reference_run(r, runs)
        cells = [
            f'<td class="{"base" if r.is_baseline else ""}">{variant}</td>',
            f"<td>{_badge(r.status)}</td>",
            f'<td class="num">{_e(r.attempt)}</td>',
            f"<td>{_e(r.scale)}</td>",
            f"<td>{_e(r.hostname)}</td>",
            f'<td class="num">{_e(r.duration_s)}</td>',
            f'<td class="num">{_e(r.setup_s)}</td>',
        ]
        if show_knobs:
            cells.append(f'<td class="wrap"><code>{_e(_knobs(r.knobs))}</code></td>')
        if show_check:
            cells.append(f"<td>{_e(r.reference_check or DASH)}</td>")
        if show_cost:
            cost = r.metrics.get("cost_run")
            cells.append(f'<td class="num">{_e(money(cost, r.tags.get("cost.currency")))}'
                         + (_mark("example", marks.EXAMPLE_PRICE) if marks.example_price(r)
                            else "") + "</td>" if cost is not None else f"<td>{DASH}</td>")
        if show_same:
            cells.append(_correctness_cell(r))
        for m in metrics:
            value = r.metrics.get(m)
            ratio = ratio_to(value, base, m) if correctness.offered(r) else None
            half = half_width(r.metrics, m) if value is not None else None
            shown_value = _e(value) if correctness.offered(r) else f"<s>{_e(value)}</s>"
            cells.append(f'<td class="num">{shown_value}'
                         + (f' <span class="pm">± {half:.2g}</span>' if half is not None else "")
                         + "</td>")
            shown = _e(None if ratio is None else round(ratio, 3))
            if ratio is not None and not r.is_baseline and marks.one_sample(r, base, m):
                shown += _mark("\u00b9", marks.ONE_SAMPLE)
            cells.append(f'<td class="num">{shown}</td>')
        out.append("<tr>" + "".join(cells) + "</tr>")
        if r.reason:   # the reason spans the row: a narrow last column made rows very tall
            out.append(f'<tr class="why"><td></td><td colspan="{len(head) - 1}" class="reason">'
                       f"{_e(r.reason)}</td></tr>")
    out.append("</tbody></table></div>")
    return "".join(out)


def _experiment_section(runs: Sequence[RunRow], plotter: Plotter | None) -> str:
    family, experiment = runs[0].family, runs[0].experiment
    runs = ordered(runs)
    metrics, declared = chart_metrics(runs)
    base = baseline_name(runs)
    # folded below the page's lead (the verdicts): a reader opens the experiment they want
    out = [f'<details class="fold"><summary><h3 id="{_anchor(family, experiment)}">'
           f'{_e(experiment)} <span class="meta">{_counts(runs)}</span></h3></summary>']
    out.append(f'<p class="meta">baseline: <b>{_e(base) if base else DASH}</b>'
               + ("" if not base or any(r.variant == base for r in runs)
                  else " <span class=\"note\">(no run)</span>") + "</p>")
    out.append(_status_table(runs, metrics))
    out.append(_marks_note(runs, metrics))
    out.append(_family_tables(family, runs))
    out.append(energy_section(runs, charts=plotter is not None))
    out.append(crossover_section(runs, charts=plotter is not None))
    charts = []
    for m in metrics:
        if plotter is None or not any(r.status == "ok" and m in r.metrics for r in runs):
            charts.append(f'<p class="note">No ok variant has a value for {_e(m)}.</p>')
            continue
        same = {r.metrics[m] for r in runs if r.status == "ok" and m in r.metrics}
        if len(same) == 1 and sum(r.status == "ok" for r in runs) > 1:
            # a chart of equal bars says nothing a sentence does not (all_correct: 1s)
            charts.append(f'<p class="note">{_e(m)}: {_e(next(iter(same)))} for every ok '
                          "variant (not charted).</p>")
            continue
        png = plotter.bar_chart(runs, m)
        charts.append(f'<figure><img alt="{_e(m)} per variant" src="data:image/png;base64,'
                      f'{png}"><figcaption>{_e(m)}{_caption_tail(runs, base)}'
                      "</figcaption></figure>")
    if plotter is not None and any(r.status == "ok" and profile_breakdown(r.metrics)
                                   for r in runs):
        out.append('<figure class="profile"><img alt="profile breakdown per variant" '
                   f'src="data:image/png;base64,{plotter.profile_chart(runs)}"><figcaption>'
                   "profile (prof_ metrics): the capture of each profiled variant, split into "
                   "GPU idle time and busy time, the busy part in proportion to each kind of "
                   "GPU operation's share of GPU operation time</figcaption></figure>")
    charts.extend(_family_charts(family, runs) if plotter is not None else [])
    if not metrics:
        out.append('<p class="note">No metrics to chart (no headline metrics declared and '
                   "no metric common to the ok variants).</p>")
    else:
        if not declared:
            out.append('<p class="note">No headline metrics declared; charting the first '
                       "metrics common to the ok variants.</p>")
        out.append('<div class="charts">' + "".join(charts) + "</div>")
    out.append("</details>")
    return "\n".join(out)


def _caption_tail(runs: Sequence[RunRow], base: str | None) -> str:
    """What the hatched bar is, the variants the table compares with another one, and the
    stand-ins among the bars."""
    tail = ""
    if base:
        tail += (f" \u2014 hatched bar, bold label and dashed line: the baseline variant, "
                 f"{_e(base)}")
    others = sorted({(r.variant, r.compare_to) for r in runs
                     if r.compare_to and r.compare_to != base})
    if others:
        tail += "; the table compares " + ", ".join(f"{_e(v)} with {_e(c)}" for v, c in others)
    wrong = correctness.left_out(runs)
    if wrong:
        tail += f"; grey cross-hatched bars, {_e(wrong)}"
    stand = [r.variant for r in runs if marks.stand_in(r)]
    if stand:
        tail += (f"; {marks.STAND_IN}s (no GPU measured): "
                 + ("every bar" if len(stand) == sum(r.status == "ok" for r in runs)
                    else ", ".join(_e(v) for v in stand)))
    return tail


def _family_tables(family: str, runs: Sequence[RunRow]) -> str:
    """The family's own tables (FamilyInfo.tables); one that fails is named in a note instead
    of breaking the report."""
    try:
        make = family_info(family).load_tables()
    except (KeyError, ImportError, AttributeError):
        return ""
    if make is None:
        return ""
    try:
        return make(runs)
    except Exception as exc:  # noqa: BLE001 - a table never takes the report down
        return (f'<p class="note">{_e(family)} tables failed: {_e(type(exc).__name__)}: '
                f"{_e(str(exc)[:200])}</p>")


def _family_charts(family: str, runs: Sequence[RunRow]) -> list[str]:
    """The family's own charts (FamilyInfo.charts), as figures; a chart that fails to draw is
    named in a note instead of breaking the report. A run that reads DIFFERENT is handed to
    no family chart (its speed-against-memory point would sit where the best one does) and is
    named under each."""
    try:
        draw = family_info(family).load_charts()
    except (KeyError, ImportError, AttributeError):
        return []
    if draw is None:
        return []
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        out = []
        wrong = correctness.left_out(runs)
        for chart in draw([r for r in correctness.findings(runs) if r.status == "ok"]):
            FigureCanvasAgg(chart.figure)
            buf = io.BytesIO()
            chart.figure.savefig(buf, format="png")
            png = base64.b64encode(buf.getvalue()).decode("ascii")
            out.append(f'<figure><img alt="{_e(chart.title)}" src="data:image/png;base64,{png}">'
                       f"<figcaption>{_e(chart.caption)}"
                       + (f"; left out, {_e(wrong)}" if wrong else "")
                       + "</figcaption></figure>")
        return out
    except Exception as exc:  # noqa: BLE001 - a chart never takes the report down
        return [f'<p class="note">{_e(family)} charts failed: {_e(type(exc).__name__)}: '
                f"{_e(str(exc)[:200])}</p>"]


def _plural(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else (many or one + 's')}"


def _verdicts(runs: Sequence[RunRow]) -> str:
    """The page's lead: per family, which variant beats its baseline and by how much."""
    found = family_verdicts(runs)
    if not found:
        return ""
    items = "".join(f"<li><b>{_e(fam)}</b><ul>" + "".join(f"<li>{_e(line)}</li>" for line in lines)
                    + "</ul></li>" for fam, lines in found.items())
    return ('<details class="fold"><summary>Ranked on one metric</summary><p class="meta">each '
            "experiment's variants against the variant "
            "they are compared with (the baseline unless they name another) on the first headline "
            "metric: the ratio of medians with its 95 % interval "
            "(docs/benchmarks/noise.md)</p>" + f'<ul class="verdicts">{items}</ul></details>')


def render_html(runs: Sequence[RunRow], title: str = "hopperlab report",
                source: str | None = None) -> str:
    """The report as one self-contained HTML string."""
    runs = sorted(runs, key=sort_key)
    made = rec.utc_now()
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{_e(title)}</h1>",
        scope.scope_html(scope.run_facts(runs)),
        f'<p class="meta">made {_e(made)}'
        + (f" from <code>{_e(source)}</code>" if source else "") + "</p>",
    ]
    if not runs:
        out.append('<p class="note">There are no runs: no run directory with a record was '
                   "found.</p></body></html>")
        return "\n".join(out)
    groups = group_by_experiment(runs)
    families: dict[str, list[tuple[str, str]]] = {}
    for fam, exp in groups:
        families.setdefault(fam, []).append((fam, exp))
    out.append(f"<p>{_plural(len(runs), 'run')} in {_plural(len(groups), 'experiment')} of "
               f"{_plural(len(families), 'family', 'families')}: {_counts(runs)}</p>")
    toc = "".join(
        f'<li><a href="#{_anchor(*key)}">{_e(key[0])} / {_e(key[1])}</a> {_counts(groups[key])}</li>'
        for key in groups
    )
    lead = tradeoffs_html(runs)
    out.append("<h2>Verdicts</h2>" + lead + _verdicts(runs))
    out.append(f'<ul class="toc">{toc}</ul>')
    out.append('<details class="fold"><summary><h2>Hardware</h2></summary>' + _hardware_table(runs)
               + "</details>")
    needs_plots = any(r.status == "ok" and r.metrics for r in runs)
    plotter = Plotter() if needs_plots else None
    sections: dict[tuple[str, str], str] = {}
    for key in track(list(groups), "report charts", show=len(runs) > PROGRESS_MIN_RUNS):
        sections[key] = _experiment_section(groups[key], plotter)
    for fam, keys in families.items():
        out.append(f'<h2 id="{_anchor(fam)}">{_e(fam)}</h2>')
        out.extend(sections[key] for key in keys)
    out.append("</body></html>")
    return "\n".join(out)


def write_html(runs: Sequence[RunRow], path: Path, source: str | None = None,
               title: str = "hopperlab report") -> Path:
    """Write ``report.html`` (atomically)."""
    rec.write_text_atomic(Path(path), render_html(runs, title=title, source=source))
    return Path(path)
