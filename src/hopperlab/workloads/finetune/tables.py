"""finetune's own tables in the report (``FamilyInfo.tables``): the saved-tensor census, one
table per experiment whose runs measured it. Here, not in results/report: a memory technique's
figures are read by its family, so a new technique touches no results/ code.

A run that asked for the census (finetune's ``census: true``) has ``census_*`` metrics and a
``census.kinds_<class>`` tag per size class; the table reads those (no artifact file: the
report works from the record alone), one block of rows per variant: the source's five size
classes with tensors, GB, share of bytes and the kinds that fill each, then the total. The
classes are the census's own (``memory.saved_tensor_census``, torch-free at import).
"""

from __future__ import annotations

import html
from typing import Any, Sequence

from hopperlab.memory.saved_tensor_census import SIZE_CLASSES

#: the table's id prefix and class (a test finds the table by them)
TABLE_CLASS = "census"


def has_census(run: Any) -> bool:
    return run.status == "ok" and "census_tensors_total" in run.metrics


def _num(value: float | None, digits: int = 3) -> str:
    return "\u2014" if value is None else f"{value:.{digits}g}"


def _run_rows(run: Any) -> list[str]:
    m, rows = run.metrics, []
    span = len(SIZE_CLASSES) + 1
    for i, cls in enumerate(SIZE_CLASSES):
        share = m.get(f"census_share_{cls.key}")
        cells = [f'<td rowspan="{span}">{html.escape(run.variant)}</td>'] if i == 0 else []
        cells += [f"<td>{html.escape(cls.label)}</td>",
                  f'<td class="num">{int(m.get(f"census_tensors_{cls.key}", 0))}</td>',
                  f'<td class="num">{_num(m.get(f"census_gb_{cls.key}"))}</td>',
                  f'<td class="num">{_num(None if share is None else 100 * share)} %</td>',
                  f'<td class="wrap">{html.escape(run.tags.get(f"census.kinds_{cls.key}", ""))}'
                  "</td>"]
        rows.append("<tr>" + "".join(cells) + "</tr>")
    per_layer = m.get("census_gb_per_layer")
    rows.append(
        f'<tr class="total"><td><b>total</b></td>'
        f'<td class="num"><b>{int(m["census_tensors_total"])}</b></td>'
        f'<td class="num"><b>{_num(m.get("census_gb_total"))}</b></td><td class="num">100 %</td>'
        f'<td class="wrap">{int(m.get("census_layers", 0))} decoder layers, '
        f"{_num(per_layer)} GB a layer, {_num(m.get('census_gb_outside_layers'))} GB outside "
        f"them; parameters saved apart: {int(m.get('census_param_tensors', 0))} "
        f"({_num(m.get('census_param_gb'))} GB); step {int(m.get('census_step', -1))}</td></tr>")
    return rows


def census_table(runs: Sequence[Any]) -> str:
    """The census table of an experiment's runs ('' when none measured it)."""
    measured = [r for r in runs if has_census(r)]
    if not measured:
        return ""
    head = "".join(f"<th>{h}</th>" for h in ("variant", "size class", "tensors", "GB",
                                               "share of bytes", "kinds (GB)"))
    body = "".join(row for r in measured for row in _run_rows(r))
    return (f'<h4>saved-tensor census</h4><p class="note">What one forward keeps for backward '
            f"(the census step, unmeasured), by size class of each saved tensor (decimal MB); "
            f"shared memory counted once, parameters apart (docs/memory.md).</p>"
            f'<div class="scroll"><table class="{TABLE_CLASS}"><thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table></div>")


def tables(runs: Sequence[Any]) -> str:
    """The family's tables of one experiment's runs, as HTML ('' when there are none)."""
    return census_table(runs)
