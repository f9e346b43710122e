"""The machines page's first section: per family and machine, one short verdict against the
reference machine (in how many runs faster or slower, by how much, and cheaper per unit of
work), before the per-run tables."""

from __future__ import annotations

from typing import Sequence

from hopperlab.core.stats import percentile
from hopperlab.results.machines.cost import cheaper_words
from hopperlab.results.correctness import NOT_A_FINDING
from hopperlab.results.marks import STAND_IN


def machine_verdicts(lines: Sequence, reference: str) -> dict[str, list[str]]:
    """family -> one line per other machine, from each run's first headline metric
    (``compare.Line``s; a cell's ``better`` is the noise test's word where both runs measured
    with repeats, else the fixed band's)."""
    firsts: dict[tuple[str, str, str], object] = {}
    for line in lines:
        firsts.setdefault((line.family, line.experiment, line.variant), line)
    out: dict[str, list[str]] = {}
    families = sorted({k[0] for k in firsts})
    for family in families:
        fam_lines = [ln for k, ln in firsts.items() if k[0] == family]
        machines = [c.machine for c in fam_lines[0].cells if c.machine != reference]
        for machine in machines:
            times, cheaper, words, stand_ins, wrong = [], [], [], 0, []
            for ln in fam_lines:
                cell = next(c for c in ln.cells if c.machine == machine)
                ref = next((c for c in ln.cells if c.machine == reference), None)
                if cell.stand_in or (ref is not None and ref.stand_in):
                    stand_ins += 1  # a CPU stand-in's ratio is no finding: never ranked
                    continue
                if getattr(cell, "different", None) or getattr(ref, "different", None):
                    wrong.append(ln.variant)  # another computation: never ranked
                    continue
                if cell.ratio and ln.direction:
                    times.append(cell.ratio if ln.direction == "higher" else 1 / cell.ratio)
                    words.append(cell.better)
                if cell.cheaper:
                    cheaper.append(cell.cheaper)
            if stand_ins:
                out.setdefault(family, []).append(
                    f"{machine}: {stand_ins} run(s) with a {STAND_IN} on either side (no GPU "
                    "measured): not ranked")
            if wrong:
                out.setdefault(family, []).append(
                    f"{machine}: {len(wrong)} run(s) reading DIFFERENT on either side "
                    f"({NOT_A_FINDING}: {', '.join(wrong)}): not ranked")
            if not times:
                continue
            n = len(times)
            better, worse = words.count("better"), words.count("worse")
            text = (f"{machine}: faster in {better} of {n} runs, slower in {worse} "
                    f"(median {percentile(times, 50):.2f}x the speed of {reference}, "
                    f"from {min(times):.2f}x to {max(times):.2f}x)")
            if cheaper:
                text += (f"; per unit of work {cheaper_words(percentile(cheaper, 50))} "
                         f"(median of {len(cheaper)} runs)")
            out.setdefault(family, []).append(text)
    return out
