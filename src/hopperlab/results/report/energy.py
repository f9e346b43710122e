"""Energy in the report: per experiment a table (window, joules, power, energy per unit, work
per joule, per variant) and a chart of each run's power over its measured window.

Reads the record (metrics and ``energy.*`` tags) and the trace artifact
(``artifacts/energy/power_trace.csv``, written by the runner). A figure that was not measured
reads "not measured" with the record's reason, never 0. Runs recorded before energy was
measured (no ``energy.window`` tag) leave the section out.
"""

from __future__ import annotations

import base64
import csv
import html
import io
from pathlib import Path
from typing import Any, Sequence

from hopperlab.config.energy import NOT_MEASURED, node_name
from hopperlab.core import energy_names as N
from hopperlab.results import correctness
from hopperlab.workloads import family_info

#: the table's class (tests find it by it)
TABLE_CLASS = "energy"
TRACE_FILE = Path("artifacts") / "energy" / "power_trace.csv"


def has_energy(run: Any) -> bool:
    return N.TAG_WINDOW in run.tags


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _num(value: float | None, digits: int = 4) -> str:
    return f"{value:.{digits}g}" if value is not None else ""


def _measured(value: float | None, why: str | None, digits: int = 4) -> str:
    if value is not None:
        return f'<td class="num">{value:.{digits}g}</td>'
    reason = (why or NOT_MEASURED).removeprefix("not measured: ")
    return f'<td class="nodata" title="{_e(reason)}">{NOT_MEASURED}</td>'


def _units(family: str) -> tuple[Any, ...]:
    try:
        return family_info(family).work_units
    except (KeyError, ImportError):
        return ()


def _variant(run: Any) -> str:
    """The variant's name, marked where it reads DIFFERENT: its joules are no finding."""
    why = correctness.not_a_finding(run)
    return _e(run.variant) + (f' <span class="mark" title="{_e(why)}">'
                              f"{correctness.NOT_A_FINDING}</span>" if why else "")


def energy_table(runs: Sequence[Any]) -> str:
    """The experiment's energy table ('' when no run carries energy)."""
    measured = [r for r in runs if has_energy(r)]
    if not measured:
        return ""
    units = [u for u in _units(measured[0].family) if u.work_per_j]
    head = ["variant", "window s", "GPU J", "host J", "GPU W mean", "GPU W peak"]
    for u in units:
        head += [f"J {u.label}", u.work_label]
    head.append("how measured")
    out = [f'<table class="{TABLE_CLASS}"><thead><tr>'
           + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr></thead><tbody>"]
    for r in measured:
        m, t = r.metrics, r.tags
        gpu_why, host_why = t.get(N.TAG_GPU), t.get(N.TAG_HOST)
        cells = [f"<td>{_variant(r)}</td>", f'<td class="num">{_num(m.get(N.ENERGY_WINDOW_S))}'
                 "</td>", _measured(m.get(N.ENERGY_GPU_J), gpu_why),
                 _measured(m.get(N.ENERGY_HOST_J), host_why),
                 _measured(m.get(N.POWER_GPU_MEAN_W), gpu_why),
                 _measured(m.get(N.POWER_GPU_PEAK_W), gpu_why)]
        for u in units:
            joules = m.get(u.energy_name)
            node = m.get(node_name(u))
            why = gpu_why if N.ENERGY_GPU_J not in m else "no throughput for this unit"
            cell = _measured(joules, why)
            if node is not None:
                cell = cell[:-5] + f"<br><small>{node:.4g} with host</small></td>"
            cells += [cell, _measured(m.get(u.work_per_j), why)]
        how = "; ".join(f"{k.removeprefix(N.TAG_PREFIX)}: {v}" for k, v in sorted(t.items())
                        if k.startswith(N.TAG_PREFIX) and k != N.TAG_SAMPLER)
        ratio = m.get(N.TRACE_RATIO)
        if ratio is not None:
            how += f"; trace/counter {ratio:.3f}"
        cells.append(f'<td class="wrap">{_e(how)}</td>')
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</tbody></table>")
    return (f'<h4>Energy</h4><p class="meta">over each run\'s measured window; J per unit and '
            "work per joule are of GPU energy (with host where the host was measured); "
            f'"{NOT_MEASURED}" says why on hover</p>' + "".join(out))


def read_trace(run_dir: Path) -> tuple[list[float], list[float], list[float] | None] | None:
    """(seconds since the window opened, GPU watts summed, host watts or None) inside the
    measured window of the run's trace; None without one."""
    path = Path(run_dir) / TRACE_FILE
    try:
        rows = list(csv.DictReader(io.StringIO(path.read_text())))
    except OSError:
        return None
    inside = [r for r in rows if r.get("window") == "measured"] or rows
    if len(inside) < 2:
        return None
    gpu_cols = [c for c in inside[0] if c.startswith("gpu")]
    host_cols = [c for c in inside[0] if c.startswith("host_")]
    t0 = float(inside[0]["t_s"])
    ts, gpu, host = [], [], []
    for r in inside:
        g = [float(r[c]) for c in gpu_cols if r.get(c)]
        if not g and gpu_cols:
            continue
        ts.append(float(r["t_s"]) - t0)
        gpu.append(sum(g))
        h = [float(r[c]) for c in host_cols if r.get(c) and c != "host_module_w"]
        host.append(sum(h) if h else float("nan"))
    if len(ts) < 2:
        return None
    return ts, gpu, host if host_cols else None


def power_chart(runs: Sequence[Any]) -> str | None:
    """One chart: each ok run's GPU power (solid) and host power (dashed) over its measured
    window, as an inline PNG (None: no run has a trace)."""
    traces = [(r.variant + ("" if correctness.offered(r) else f" ({correctness.NOT_A_FINDING})"),
               tr) for r in runs
              if r.status == "ok" and (tr := read_trace(Path(r.run_dir))) is not None]
    if not traces:
        return None
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.0, 3.2))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for variant, (ts, gpu, host) in traces:
        (line,) = ax.plot(ts, gpu, label=variant, linewidth=1.2)
        if host is not None:
            ax.plot(ts, host, linestyle="--", linewidth=0.9, color=line.get_color())
    ax.set_xlabel("seconds since the measured window opened")
    ax.set_ylabel("power (W)")
    ax.spines[["top", "right"]].set_visible(False)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
    fig.subplots_adjust(left=0.1, right=0.72, bottom=0.16)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def energy_section(runs: Sequence[Any], charts: bool = True) -> str:
    """The table and, with ``charts``, the power chart ('' when no run carries energy)."""
    table = energy_table(runs)
    if not table:
        return ""
    ok = [r for r in runs if r.status == "ok"]
    if ok and not any(r.metrics.get(k) is not None for r in ok
                      for k in (N.ENERGY_GPU_J, N.ENERGY_HOST_J)):
        # a table of "not measured" cells (a CPU machine) says less than one line
        why = next((r.tags.get(N.TAG_GPU) for r in ok if r.tags.get(N.TAG_GPU)), None)
        return ('<p class="note">Energy: not measured for any run'
                + (f" ({_e(why)})" if why else "") + ".</p>")
    png = power_chart(runs) if charts else None
    if png:
        table += ('<figure class="power"><img alt="power over the measured window per run" '
                  f'src="data:image/png;base64,{png}"><figcaption>GPU power (all the run\'s '
                  "GPUs, solid) and host power (dashed, where measured) over each run's "
                  "measured window, sampled at 10 Hz</figcaption></figure>")
    return table
