"""``machines.csv`` and ``machines.html``: the same runs on several machines, side by side.

Per (family, experiment, variant) and headline metric: each machine's value, its ratio to the
reference machine, which is better (by the metric's declared direction), the link floor and the
figure over it, the run's cost and "x cheaper per unit"; a grouped bar chart per experiment;
and predictions (each machine's runs predicted on the others and on any ``--predict`` target,
with the error where the target was measured). A value a machine did not record is the visible
cell "no data", never a zero.

The HTML is self-contained (inline CSS, charts as base64 PNG): mail it, archive it.
"""

from __future__ import annotations

import base64
import csv
import html
import io
import math
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Mapping, Sequence

from hopperlab.core import effects
from hopperlab.core.errors import SpecError
from hopperlab.core.rundir import read_samples, utc_now, write_text_atomic
from hopperlab.core.stats import half_width, money
from hopperlab.node.naming import split_gpu_count
from hopperlab.results.machines import ab, prediction_error
from hopperlab.results.machines import cost as costs
from hopperlab.results.machines import tradeoffs
from hopperlab.results.machines import energy as energies
from hopperlab.results.machines.descriptions import MachineDescription, MatmulProbe
from hopperlab.results.machines.probes import with_measured
from hopperlab.results.machines.predict import Prediction, predict
from hopperlab.results.machines.references import direction
from hopperlab.results.machines.runs import MachineRuns
from hopperlab.results.machines.verdicts import machine_verdicts
from hopperlab.results import correctness, marks, scope
from hopperlab.results.rows import RunRow
from hopperlab.workloads import family_info

CSV_FILE = "machines.csv"
HTML_FILE = "machines.html"
NO_DATA = "no data"
CSV_COLUMNS = ("family", "experiment", "variant", "metric", "direction", "machine",
               "reference_machine", "status", "value", "ratio_to_reference", "better",
               "link_floor", "over_floor", "cost_run", "currency", "cost_unit",
               "cost_per_unit", "cheaper_per_unit_x", "reference_check", "energy_unit",
               "energy_per_unit_j", "energy_node_per_unit_j", "less_energy_per_unit_x",
               "work_per_j", "work_per_j_unit", "correctness")


@dataclass
class Cell:
    """One machine's figure of one (run, metric)."""

    machine: str
    status: str | None
    value: float | None
    ratio: float | None = None
    better: str = ""
    floor: float | None = None
    over_floor: float | None = None
    cost_run: float | None = None
    currency: str = ""
    unit: costs.UnitCost | None = None
    cheaper: float | None = None
    check: str | None = None
    energy: energies.UnitEnergy | None = None
    less_energy: float | None = None
    #: why the figure is a CPU stand-in's (marks.stand_in), an example price, one sample
    stand_in: str | None = None
    example_price: bool = False
    one_sample: bool = False
    #: half the 95 % interval of a repeated figure (``value ± half``; None: measured once)
    half: float | None = None
    #: the noise test's words for the ratio (docs/benchmarks/noise.md), when both sides
    #: measured with repeats: e.g. "x0.912 [0.90, 0.93]"
    interval: str = ""
    #: the run's verdict against its own baseline on this machine (``Verdict.cell``; "": none)
    correctness: str = ""
    #: ``correctness.not_a_finding``: the run reads DIFFERENT, its figure is no finding (no
    #: ratio, no better, no cheaper, not charted, not ranked); None: it may be offered
    different: str | None = None


@dataclass
class Line:
    family: str
    experiment: str
    variant: str
    metric: str
    direction: str | None
    cells: list[Cell]


def _headline(groups: Sequence[MachineRuns], key: str) -> list[str]:
    rows = [g.runs[key] for g in groups if key in g.runs]
    metrics: list[str] = []
    for r in rows:
        for m in r.headline_metrics:
            if m not in metrics and any(m in x.metrics for x in rows):
                metrics.append(m)
    return metrics


#: a ratio this close to 1 is "same": one run per machine cannot tell a smaller difference
#: from run-to-run noise (a red "worse" for 0.999x read as a regression)
SAME_WITHIN = 0.02


def _better(value: float | None, ref: float | None, way: str | None) -> str:
    if value is None or ref is None or way is None:
        return ""
    if ref and abs(value / ref - 1.0) < SAME_WITHIN or math.isclose(value, ref, rel_tol=1e-9):
        return "same"
    return "better" if (value > ref) == (way == "higher") else "worse"


def _noise_better(row: RunRow, ref_row: RunRow | None, metric: str, way: str | None
                  ) -> tuple[str, str] | None:
    """better / worse / same / inconclusive by the noise test (core.effects), when both runs
    measured with repeats; None: not enough samples (then the fixed band of ``_better``)."""
    if ref_row is None or way is None:
        return None
    mine = ab.measure_of(row, metric, _samples(row))
    theirs = ab.measure_of(ref_row, metric, _samples(ref_row))
    if mine is None or theirs is None or mine.spread is None or theirs.spread is None:
        return None
    try:
        eff = effects.compare(mine, theirs, direction=way)
    except ValueError:
        return None
    word = {effects.WORSE: "worse", effects.BETTER: "better", effects.SAME: "same",
            effects.UNCLEAR: "inconclusive"}[eff.verdict]
    return word, f"[{eff.ratio_low:.3f}, {eff.ratio_high:.3f}]"


def _samples(row: RunRow) -> list[dict[str, float]]:
    folder = Path(row.run_dir)
    return read_samples(folder) if folder.is_dir() else []


@dataclass(frozen=True)
class _Against:
    """What every machine's cell of one run's metric is compared with: the reference
    machine's run, its unit costs and energy, and its value of the metric."""

    machine: str
    row: RunRow | None
    units: dict[str, costs.UnitCost]
    energy: energies.UnitEnergy | None
    value: float | None = None


def _against(reference: str, ref_row: RunRow | None, probe: MatmulProbe | None) -> _Against:
    """A reference machine's run that reads DIFFERENT gives nothing to compare with (no
    ratio, price or energy against it): a fast wrong run would make every machine slower."""
    if ref_row is not None and not correctness.offered(ref_row):
        return _Against(reference, ref_row, {}, None)
    ok = ref_row is not None and ref_row.status == "ok"
    return _Against(reference, ref_row,
                    {u.metric: u for u in costs.unit_costs(ref_row)} if ref_row else {},
                    energies.unit_energy(ref_row, probe) if ok else None)


def probes_of(descriptions: Mapping[str, MachineDescription]) -> dict[str, MatmulProbe]:
    """Each described machine's matmul probe, by its name and its aliases (a node of several
    of its GPUs, ``2x<name>``, is looked up by ``probe_for``)."""
    out: dict[str, MatmulProbe] = {}
    for desc in descriptions.values():
        if desc.matmul_tflop_per_j is not None:
            for name in (desc.name, *desc.aliases):
                out[name] = desc.matmul_tflop_per_j
    return out


def _floors(family: str) -> Mapping[str, str]:
    try:
        return family_info(family).floors
    except (KeyError, ImportError):
        return {}


def probe_for(probes: Mapping[str, MatmulProbe], machine: str) -> MatmulProbe | None:
    """The machine's probe; for ``<n>x<name>`` its GPU's (TFLOP per joule does not add up)."""
    return probes.get(machine) or probes.get(split_gpu_count(machine)[1])


def build_lines(groups: Sequence[MachineRuns], reference: str,
                probes: Mapping[str, MatmulProbe] | None = None) -> list[Line]:
    """The comparison, one Line per (run, headline metric) any machine recorded; ``probes``:
    each machine's matmul probe, which keeps an implausible energy out of the comparison."""
    probes = probes or {}
    ref_group = next(g for g in groups if g.machine == reference)
    lines = []
    for key in sorted({k for g in groups for k in g.runs}):
        if key.count("/") != 2:  # a damaged or hand-edited record: say which
            row = next(g.runs[key] for g in groups if key in g.runs)
            raise SpecError(f"{row.run_dir}: its record names the run {key!r}: a family, "
                            f"experiment or variant is a name, without '/'")
        family, experiment, variant = key.split("/")
        floors = _floors(family)
        base = _against(reference, ref_group.runs.get(key), probe_for(probes, reference))
        for metric in _headline(groups, key) or ["-"]:
            way = direction(family, metric)
            ref = base.row
            against = replace(base, value=ref.metrics.get(metric)
                              if ref is not None and ref.status == "ok"
                              and correctness.offered(ref) else None)
            cells = [_cell(g.machine, g.runs.get(key), metric, way, against, floors,
                           probe_for(probes, g.machine)) for g in groups]
            lines.append(Line(family, experiment, variant, metric, way, cells))
    return lines


def _cell(machine: str, row: RunRow | None, metric: str, way: str | None, ref: _Against,
          floors: Mapping[str, str], probe: MatmulProbe | None = None) -> Cell:
    """One machine's cell of one run's metric, against the reference machine's."""
    if row is None:
        return Cell(machine, None, None)
    mine = machine == ref.machine
    value = row.metrics.get(metric) if row.status == "ok" else None
    cell = Cell(machine, row.status, value, check=row.reference_check,
                cost_run=costs.run_cost(row), currency=row.tags.get("cost.currency", ""),
                stand_in=marks.stand_in(row), example_price=marks.example_price(row),
                one_sample=not mine and marks.one_sample(row, ref.row, metric),
                correctness=row.correctness.cell() if row.correctness is not None else "",
                different=correctness.not_a_finding(row))
    if cell.different:  # another computation than its baseline's: shown, never compared
        cell.half = half_width(row.metrics, metric) if value is not None else None
        return cell
    if value is not None and ref.value:
        cell.ratio = value / ref.value
    cell.better = "" if mine else _better(value, ref.value, way)
    if value is not None:
        cell.half = half_width(row.metrics, metric)
    if not mine and value is not None and ref.value is not None:
        tested = _noise_better(row, ref.row, metric, way)
        if tested is not None:
            cell.better, cell.interval = tested
    _add_floor(cell, row, floors.get(metric), value)
    units = costs.unit_costs(row)
    if units:
        cell.unit = units[0]
        cell.cheaper = costs.cheaper(ref.units.get(units[0].metric), units[0])
    if row.status == "ok":
        cell.energy = energies.unit_energy(row, probe)
        cell.less_energy = energies.less_energy(ref.energy, cell.energy)
    return cell


def _add_floor(cell: Cell, row: RunRow, floor_metric: str | None, value: float | None) -> None:
    """The link floor of the cell's figure (``FamilyInfo.floors``) and how far above it."""
    if floor_metric and floor_metric in row.metrics:
        cell.floor = row.metrics[floor_metric]
        if value is not None and cell.floor:
            cell.over_floor = value / cell.floor


def _num(value: float | None) -> str:
    return "" if value is None else repr(float(value))


def write_csv(lines: Sequence[Line], reference: str, path: Path) -> Path:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_COLUMNS)
    for line in lines:
        for c in line.cells:
            w.writerow([line.family, line.experiment, line.variant, line.metric,
                        line.direction or "", c.machine, reference, c.status or "no run",
                        NO_DATA if c.value is None else repr(c.value), _num(c.ratio), c.better,
                        _num(c.floor), _num(c.over_floor), _num(c.cost_run), c.currency,
                        c.unit.label if c.unit else "", _num(c.unit.value if c.unit else None),
                        _num(c.cheaper), c.check or "",
                        c.energy.label if c.energy else "",
                        _energy_csv(c.energy),
                        _num(c.energy.node_joules if c.energy else None),
                        _num(c.less_energy), _num(c.energy.work_per_j if c.energy else None),
                        c.energy.work_label if c.energy else "", c.correctness])
    write_text_atomic(path, buf.getvalue())
    return path


# ----------------------------------------------------------------------------- HTML
def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _f(value: float | None, digits: int = 4) -> str:
    if value is None:
        return f'<span class="nodata">{NO_DATA}</span>'
    return f"{value:.{digits}g}"


def _chart(experiment_lines: Sequence[Line], machines: Sequence[str], reference: str
           ) -> str | None:
    """Per variant (first metric of each), how many times better each machine is than the
    reference: higher is better whatever the metric's direction (a time is inverted), bars from
    1 (the reference) so that 5-10 % differences show, labelled with their value."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    firsts: dict[str, Line] = {}
    for line in experiment_lines:
        firsts.setdefault(line.variant, line)
    rows = [ln for ln in firsts.values() if any(c.ratio for c in ln.cells)]
    if not rows:
        return None
    # a DIFFERENT run has no ratio, so no bar: ``left_out_of_chart`` names it under the chart
    others = [m for m in machines if m != reference] or list(machines)
    fig = Figure(figsize=(max(5.5, 0.9 * len(rows) * max(1, len(others)) + 2.5), 3.4))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    width = 0.8 / max(1, len(others))
    lows, highs = [1.0], [1.0]
    for i, machine in enumerate(others):
        xs, tops = [], []
        for j, ln in enumerate(rows):
            cell = next((c for c in ln.cells if c.machine == machine), None)
            if cell is None or not cell.ratio:
                continue
            times = cell.ratio if ln.direction != "lower" else 1.0 / cell.ratio
            xs.append(j + (i - (len(others) - 1) / 2) * width)
            tops.append(times)
        if not xs:
            continue
        colours = ["#2e7d32" if t >= 1 + SAME_WITHIN else "#c62828" if t <= 1 - SAME_WITHIN
                   else "#90a4ae" for t in tops]
        bars = ax.bar(xs, [t - 1.0 for t in tops], width, bottom=1.0, color=colours,
                      edgecolor="#37474f", linewidth=0.5, label=machine)
        ax.bar_label(bars, labels=[f"{t:.3g}x" for t in tops], fontsize=7, padding=1)
        lows.extend(tops)
        highs.extend(tops)
    ax.set_ylim(*ratio_axis(lows + highs))
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([f"{ln.variant}\n{ln.metric}" for ln in rows], fontsize=7,
                       rotation=30 if len(rows) > 4 else 0, ha="right" if len(rows) > 4
                       else "center", rotation_mode="anchor")
    ax.set_ylabel(f"times better than\n{reference}", fontsize=8)
    ax.spines[["top", "right"]].set_visible(False)
    ax.set_title(", ".join(others), fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def left_out_of_chart(experiment_lines: Sequence[Line]) -> str:
    """``DIFFERENT: not a finding: v on m, ...``: the runs the chart and the verdicts leave out
    because they (or the reference machine's run) read DIFFERENT ('' when none)."""
    wrong = list(dict.fromkeys(f"{ln.variant} on {c.machine}" for ln in experiment_lines
                               for c in ln.cells if c.different))
    return f"{correctness.NOT_A_FINDING}: {', '.join(wrong)}" if wrong else ""


def ratio_axis(ratios: Sequence[float]) -> tuple[float, float]:
    """The ratio chart's y range: from zero, never cut (an axis from 0.94 to 1.04 makes 0.94x
    look like a collapse), with room above the tallest bar for its label."""
    hi = max([1.0, *ratios])
    return 0.0, hi + max(0.05, hi * 0.12)


_CSS = """body{font-family:sans-serif;margin:1.5em;max-width:1400px}table{border-collapse:collapse;
margin:.5em 0 1em}td,th{border:1px solid #ccc;padding:3px 6px;font-size:13px;vertical-align:top}
th{background:#f0f0f0}.num{text-align:right}.better{color:#2e7d32;font-weight:bold}
.worse{color:#c62828;font-weight:bold}.nodata{color:#999;font-style:italic}.meta{color:#555}
.pred{background:#fff8e1}.regression{color:#c62828;font-weight:bold}.improvement{color:#2e7d32}
code{font-size:12px}.mark{display:inline-block;margin-left:.3em;padding:0 .35em;
border-radius:3px;background:#fff3e0;color:#8d4a00;font-size:11px;font-weight:600}
.src{font-size:12px;color:#455a64}""" + scope.CSS + tradeoffs.CSS


def _cell_html(c: Cell, reference: str) -> str:
    if c.status is None:
        return f'<td><span class="nodata">{NO_DATA} (no run)</span></td>'
    parts = [_f(c.value) + (f" ± {c.half:.2g}" if c.half is not None else "")]
    if c.value is None and c.status != "ok":
        parts = [f'<span class="nodata">{NO_DATA} ({_e(c.status)})</span>']
    if c.stand_in:
        parts[0] += f' <span class="mark" title="{_e(c.stand_in)}">{marks.STAND_IN}</span>'
    if c.different:
        parts[0] = (f'<s>{parts[0]}</s> <span class="mark different" '
                    f'title="{_e(c.different)}">{_e(correctness.NOT_A_FINDING)}</span>')
    if c.ratio is not None and c.machine != reference:
        cls = c.better if c.better in ("better", "worse") else ""
        parts.append(f'<span class="{cls}">{c.ratio:.3f}x</span>'
                     + (f" {_e(c.interval)}" if c.interval else "")
                     + (f" {c.better}" if c.better else "")
                     + (f' <span class="mark" title="one run on each machine">'
                        f"{marks.ONE_SAMPLE}</span>" if c.one_sample else ""))
    if c.floor is not None:
        if c.over_floor is not None and c.over_floor < 1:
            # faster than moving its bytes over the link: the data never crossed it
            parts.append(f'<span class="nodata">link floor {_f(c.floor)}: not a bound (the '
                         "data stays on the device)</span>")
        else:
            parts.append(f"link floor {_f(c.floor)}" + (f" ({c.over_floor:.2f}x the floor)"
                                                         if c.over_floor else ""))
    example = (f' <span class="mark">{marks.EXAMPLE_PRICE}</span>'
               if c.example_price else "")
    if c.unit is not None:
        txt = f"{_e(money(c.unit.value, c.unit.currency))} {_e(c.unit.label)}"
        if c.cheaper is not None and c.machine != reference:
            txt += "; " + _cheaper_text(c.cheaper)
        parts.append(txt + example)
    elif c.cost_run is not None:
        parts.append(f"run {_e(money(c.cost_run, c.currency))}" + example)
    if c.energy is not None and c.energy.implausible:
        parts.append(f'<span class="nodata">energy {_e(c.energy.implausible)}</span>')
    elif c.energy is not None:
        txt = f"{c.energy.joules:.4g} J {_e(c.energy.label)}"
        if c.energy.node_joules is not None:
            txt += f" ({c.energy.node_joules:.4g} J with host)"
        if c.less_energy is not None and c.machine != reference:
            txt += f"; {c.less_energy:.2f}x less energy per unit"
        if c.energy.work_per_j is not None:
            txt += f"; {c.energy.work_per_j:.4g} {_e(c.energy.work_label)}"
        parts.append(txt)
    elif c.status == "ok":
        parts.append('<span class="nodata">energy not measured</span>')
    if c.check and c.check != "no-reference":
        parts.append(f'<span class="{_e(c.check)}">check: {_e(c.check)}</span>')
    return "<td>" + "<br>".join(parts) + "</td>"


def _energy_csv(energy: energies.UnitEnergy | None) -> str:
    """The CSV's J per unit: the figure, "implausible" (kept out) or "not measured"."""
    if energy is None:
        return "not measured"
    return "implausible" if energy.implausible else _num(energy.joules)


def _cheaper_text(times: float) -> str:
    """``1.15x cheaper per unit`` or ``costs 1.15x more per unit``, never "0.87x cheaper"."""
    return costs.cheaper_words(times, SAME_WITHIN) + " per unit"


def _energy_cell(p: Prediction, sources: "_Sources") -> str:
    e = p.energy
    if e is None:
        return '<td class="nodata">no energy predicted</td>'
    if e.joules is None:
        return f'<td class="nodata">energy not predicted: {_e(e.unpredictable)}</td>'
    measured = (f"<br>measured on target {e.measured:.4g} J ({e.error * 100:+.1f} %)"
                if e.measured is not None and e.error is not None else "")
    inputs = sources.inputs(e.inputs or {})
    return (f'<td class="pred">{e.joules:.4g} {_e(e.label)}{measured}<br>'
            f"<code>{_e(e.formula)}</code><br>{inputs}</td>")


class _Sources:
    """Citations said once: an input's long parenthesised source ("4.8 (NVIDIA H200 product
    page ...)") becomes "4.8 [3]", its text listed once under the table. Repeated in every row,
    they made the prediction table 32,000 px tall."""

    MIN_LEN = 40

    def __init__(self) -> None:
        self.texts: dict[str, int] = {}

    def cite(self, value: object) -> str:
        text = str(value)
        m = re.match(r"^(.*?)\s*\((.+)\)\s*$", text, re.S)
        if not m or len(m.group(2)) < self.MIN_LEN:
            return _e(text)
        n = self.texts.setdefault(m.group(2), len(self.texts) + 1)
        return f'{_e(m.group(1))} <a href="#src-{n}">[{n}]</a>'

    def inputs(self, items: dict) -> str:
        return "<br>".join(f"<code>{_e(k)}</code> = {self.cite(v)}" for k, v in items.items())

    def listing(self) -> str:
        if not self.texts:
            return ""
        rows = "".join(f'<li id="src-{n}">{_e(t)}</li>'
                       for t, n in sorted(self.texts.items(), key=lambda kv: kv[1]))
        return f'<p class="meta">Sources of the inputs:</p><ol class="src">{rows}</ol>'


def _prediction_table(preds: Sequence[Prediction]) -> str:
    sources = _Sources()
    out = ['<table><thead><tr><th>run</th><th>metric</th><th>from</th><th>measured there</th>'
           "<th>PREDICTION for</th><th>predicted</th><th>measured on target</th><th>error</th>"
           "<th>model and formula</th><th>inputs</th><th>energy on target (PREDICTION)</th>"
           "</tr></thead><tbody>"]
    for p in preds:
        if p.unpredictable:
            body = (f'<td colspan="4" class="nodata">not predicted: {_e(p.unpredictable)}</td>'
                    "<td></td><td></td><td></td>")
        else:
            err = p.error
            body = (f'<td class="num pred">{_f(p.predicted)}<br><small>'
                    f"{_e(prediction_error.interval_text(p))}</small></td>"
                    f'<td class="num">{_f(p.measured) if p.measured is not None else "-"}</td>'
                    f'<td class="num">{"-" if err is None else f"{err * 100:+.1f} %"}</td>'
                    f"<td><b>{_e(p.model)}</b>: <code>{_e(p.formula)}</code></td>"
                    "<td>" + sources.inputs(p.inputs) + "</td>"
                    + _energy_cell(p, sources))
        out.append(f"<tr><td>{_e(p.key)}</td><td>{_e(p.metric)}</td><td>{_e(p.source_machine)}"
                   f'</td><td class="num">{_f(p.source_value)}</td><td>{_e(p.target_machine)}'
                   f" ({_e(p.label)})</td>{body}</tr>")
    out.append("</tbody></table>")
    out.append(sources.listing())
    return "".join(out)


def _verdicts_html(lines: Sequence[Line], reference: str) -> str:
    """The page's lead: per family, each machine against the reference, then the details."""
    found = machine_verdicts(lines, reference)
    if not found:
        return ""
    items = "".join(f"<li><b>{_e(fam)}</b><ul>" + "".join(f"<li>{_e(t)}</li>" for t in texts)
                    + "</ul></li>" for fam, texts in found.items())
    return ("<h2>Verdicts</h2><p class=\"meta\">per family, each run's first headline metric "
            "(faster/slower: the noise test where both machines measured with repeats, else "
            f"beyond {SAME_WITHIN:.0%}); the tables below have every figure</p>"
            f"<ul>{items}</ul>")


def _lead_html(groups: Sequence[MachineRuns]) -> str:
    """What each technique buys and costs on each machine (its own runs, its own baselines),
    and the rates the runs were priced at: the page's first answer."""
    parts = [tradeoffs.tradeoffs_html(list(g.runs.values()), g.machine) for g in groups]
    rates = costs.rates_words([(g.machine, g.runs.values()) for g in groups])
    return (f"<h2>{tradeoffs.HEADING}</h2>" + "".join(parts)
            + f'<p class="meta">{_e(rates)}</p>')


def render_html(groups: Sequence[MachineRuns], reference: str, lines: Sequence[Line],
                predictions: Sequence[Prediction]) -> str:
    machines = [g.machine for g in groups]
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           f"<title>hopperlab machines</title><style>{_CSS}</style></head><body>",
           "<h1>Machines side by side</h1>",
           scope.scope_html([f"{g.machine}: " + ", ".join(scope.run_facts(list(g.runs.values())))
                             for g in groups]),
           f'<p class="meta">made {_e(utc_now())}; reference machine <b>{_e(reference)}</b>; '
           "ratios are value / reference; better/worse by the metric's declared direction, "
           f"\"same\" within {SAME_WITHIN:.0%}; "
           f'a figure a machine did not record reads "{NO_DATA}". Marked: '
           f"<b>{marks.STAND_IN}</b> (no GPU measured), <b>{marks.EXAMPLE_PRICE}</b> (not a real "
           f"rate), <b>{marks.ONE_SAMPLE}</b> (one run per machine: noise can exceed the "
           "difference).</p>",
           "<table><thead><tr><th>machine</th><th>from</th><th>runs</th></tr></thead><tbody>"]
    for g in groups:
        out.append(f"<tr><td><b>{_e(g.machine)}</b></td><td><code>{_e(g.source)}</code></td>"
                   f'<td class="num">{len(g.runs)}</td></tr>')
    out.append("</tbody></table>")
    out.append(_lead_html(groups))
    out.append(_verdicts_html(lines, reference))
    experiments: dict[tuple[str, str], list[Line]] = {}
    for line in lines:
        experiments.setdefault((line.family, line.experiment), []).append(line)
    for (family, experiment), exp_lines in experiments.items():
        out.append(f'<details class="fold"><summary><h2>{_e(family)} / {_e(experiment)}</h2>'
                   "</summary>")
        png = _chart(exp_lines, machines, reference)
        if png:
            out.append(f'<figure><img alt="{_e(experiment)}: machines side by side" '
                       f'src="data:image/png;base64,{png}"><figcaption>each variant\'s first '
                       f"headline metric: how many times better than {_e(reference)} (a time "
                       "or a latency inverted, so that higher is better everywhere); green "
                       f"better, red worse, grey within {SAME_WITHIN:.0%} of it"
                       + (f"; not drawn, {_e(wrong)}" if (wrong := left_out_of_chart(exp_lines))
                          else "") + "</figcaption></figure>")
        out.append("<table><thead><tr><th>variant</th><th>metric</th><th>better</th>"
                   + "".join(f"<th>{_e(m)}</th>" for m in machines) + "</tr></thead><tbody>")
        for line in exp_lines:
            out.append(f"<tr><td>{_e(line.variant)}</td><td>{_e(line.metric)}</td>"
                       f"<td>{_e(line.direction or '-')}</td>"
                       + "".join(_cell_html(c, reference) for c in line.cells) + "</tr>")
        out.append("</tbody></table></details>")
    out.append('<details class="fold"><summary><h2>Predictions</h2></summary>')
    if predictions:
        out.append('<p class="meta">Every figure in the <i>predicted</i> column is a PREDICTION '
                   "from the models of hopperlab.results.machines.predict, with its formula and "
                   "inputs; where the target machine was measured too, the error is "
                   "(predicted - measured) / measured.</p>")
        out.append(prediction_error.summary_html(predictions))
        out.append(_prediction_table(predictions))
    else:
        out.append('<p class="nodata">No predictions (no machine description for the compared '
                   "machines in configs/machines/, and no --predict target).</p>")
    out.append("</details></body></html>")
    return "\n".join(out)


def all_predictions(groups: Sequence[MachineRuns], descriptions: dict[str, MachineDescription],
                    targets: Sequence[str] = ()) -> list[Prediction]:
    """Each machine's runs predicted on every other compared machine (with the error) and on
    every extra target that has a description."""
    out: list[Prediction] = []
    by_name = {g.machine: g for g in groups}
    for g in groups:
        src = descriptions.get(g.machine)
        if src is None:
            continue
        for name in [m for m in by_name if m != g.machine] + [t for t in targets
                                                             if t not in by_name]:
            tgt = descriptions.get(name)
            if tgt is None:
                continue
            out.extend(predict(g, src, tgt, by_name.get(name)))
    return out


def compare(groups: Sequence[MachineRuns], out_dir: Path, *, reference: str | None = None,
            descriptions: dict[str, MachineDescription] | None = None,
            targets: Sequence[str] = ()) -> tuple[Path, Path]:
    """Write machines.csv and machines.html into ``out_dir``; return their paths."""
    if not groups:
        raise SpecError("hopperlab machines: no results to compare")
    names = [g.machine for g in groups]
    reference = reference or names[0]
    if reference not in names:
        raise SpecError(f"--reference {reference}: not one of the compared machines "
                        f"({', '.join(names)})")
    # each machine's own matmul runs (membench/matmul) over its description's probe
    lines = build_lines(groups, reference, with_measured(
        probes_of(descriptions or {}), [r for g in groups for r in g.runs.values()]))
    preds = all_predictions(groups, descriptions or {}, targets)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path = write_csv(lines, reference, out_dir / CSV_FILE)
    html_path = out_dir / HTML_FILE
    write_text_atomic(html_path, render_html(groups, reference, lines, preds))
    return csv_path, html_path
