"""Sweeps: an experiment's ``sweep:`` block expanded into one variant per point and technique.

The matrix was a hand list of points (issue 49). A sweep names axes over the family's params
or the knobs; ``axes`` are crossed, ``zip`` axes move together (equal lengths, one step each):

    sweep:
      axes: {micro_batch: [1, 2, 4]}
      zip: {seq_len: [128, 256], warmup_steps: [1, 2]}

A scale block's ``sweep`` replaces the experiment's at that scale (smoke values are small).
Each written variant V becomes ``V.<axis>-<value>...`` per point, axes in the order written,
so a name depends only on its own point: growing an axis adds names and changes none, and
Snakemake plans only the new points. ``V.p`` is compared with its reference's run at the same
point. A point the family refuses (a param's bounds, a knob it lacks, a contradiction) is
left out and named with why (``refused``; ``hopperlab list`` prints them). Pure: no machine.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from hopperlab.config.spec import build_params, check_knobs, check_variant
from hopperlab.core.errors import SpecError, one_line, shown
from hopperlab.core.schema import load_yaml
from hopperlab.workloads import family_info
from hopperlab.workloads.base import KNOB_DEFAULTS, FamilyInfo

#: between a variant's name and its point, and between the point's axes
SEPARATOR = "."


@dataclass(frozen=True)
class Refused:
    """A point the family refuses: its would-be variant name and the one-line reason."""

    variant: str
    why: str


@dataclass(frozen=True)
class Expanded:
    """An experiment with its sweep expanded (``experiment`` is the YAML mapping, rewritten),
    the axes in order with their values, and the points refused."""

    experiment: dict[str, Any]
    axes: dict[str, list[Any]]
    refused: list[Refused]


def value_text(value: Any, where: str) -> str:
    """An axis value as it reads in a variant name: ``512``, ``0p5`` (a dot would split the
    name), ``true``, ``activations``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # 0.0 reads 0, as written in most YAML
    if isinstance(value, (int, float)):
        return repr(value).replace(".", "p").replace("-", "m").replace("+", "")
    text = str(value)
    if not text or any(not (c.isalnum() or c in "_-") for c in text) or text != text.lower():
        raise SpecError(f"{where}: {shown(value)} cannot be part of a variant name (lower-case "
                        f"letters, digits, '_' and '-')")
    return text


def _block(exp: Mapping[str, Any], scale: str) -> Mapping[str, Any] | None:
    scale_block = (exp.get("scales") or {}).get(scale) or {}
    return scale_block.get("sweep") or exp.get("sweep")


def points(sweep: Mapping[str, Any], where: str) -> list[dict[str, Any]]:
    """Every point of a sweep, in order: the cross product of ``axes`` (the first axis slowest)
    with the steps of ``zip``."""
    axes = dict(sweep.get("axes") or {})
    zipped = dict(sweep.get("zip") or {})
    both = set(axes) & set(zipped)
    if both:
        raise SpecError(f"{where}.zip: {', '.join(sorted(both))} is an axis already")
    lengths = {len(v) for v in zipped.values()}
    if len(lengths) > 1:
        raise SpecError(f"{where}.zip: its axes move together and need equal lengths, got "
                        + ", ".join(f"{k}: {len(v)}" for k, v in zipped.items()))
    steps = [dict(zip(zipped, values)) for values in zip(*zipped.values())] if zipped else [{}]
    out = []
    for values in itertools.product(*axes.values()):
        for step in steps:
            out.append({**dict(zip(axes, values)), **step})
    return out


def point_name(variant: str, point: Mapping[str, Any], where: str) -> str:
    return SEPARATOR.join([variant, *(f"{axis}-{value_text(value, f'{where}.{axis}')}"
                                      for axis, value in point.items())])


def _with_point(var: Mapping[str, Any], point: Mapping[str, Any], scale: str) -> dict[str, Any]:
    """The variant at one point: knob axes as the variant's knobs, param axes in its scale
    block's params (the last layer the matrix merges, so the point's value wins)."""
    out = copy.deepcopy(dict(var))
    for axis, value in point.items():
        if axis in KNOB_DEFAULTS:
            out[axis] = value
        else:
            scales = out.setdefault("scales", {})
            scales.setdefault(scale, {}).setdefault("params", {})[axis] = value
    return out


def refusal(info: FamilyInfo, exp: Mapping[str, Any], var: Mapping[str, Any], scale: str,
            source: str, path: str) -> str | None:
    """Why the family refuses this variant (its params, knobs or their contradiction), or
    None. The layers are merged as the matrix merges them."""
    scale_block = (exp.get("scales") or {}).get(scale) or {}
    var_scale = (var.get("scales") or {}).get(scale) or {}
    merged = {**exp.get("params", {}), **scale_block.get("params", {}),
              **var.get("params", {}), **var_scale.get("params", {})}
    try:
        params = build_params(info, merged, source, f"{path}.params")
        knobs = check_knobs(info, {k: var[k] for k in KNOB_DEFAULTS if k in var}, source, path)
        check_variant(info, knobs, params, source, path)
    except SpecError as exc:
        return one_line(exc, prefix="refused")
    return None


def _check_axes(info: FamilyInfo, names: Sequence[str], where: str) -> None:
    fields = {f.name for f in dataclasses.fields(info.params)}
    for name in names:
        if name not in KNOB_DEFAULTS and name not in fields:
            raise SpecError(f"{where}: {shown(name)} is neither a knob ({', '.join(KNOB_DEFAULTS)}) "
                            f"nor a parameter of the {info.name} family")


def expand(family: str, exp_name: str, exp: Mapping[str, Any], scale: str,
           source: str) -> Expanded:
    """``exp`` with each variant replaced by its points (unchanged when it has no sweep at
    ``scale``); its baseline becomes the baseline's first point the family takes."""
    sweep = _block(exp, scale)
    if not sweep:
        return Expanded(dict(exp), {}, [])
    where = f"{source}: experiments.{exp_name}.sweep"
    info = family_info(family)
    axes = {**(sweep.get("axes") or {}), **(sweep.get("zip") or {})}
    _check_axes(info, list(axes), where)
    if exp["baseline"] not in exp["variants"]:
        return Expanded(dict(exp), axes, [])  # the matrix names this mistake
    variants: dict[str, Any] = {}
    refused: list[Refused] = []
    for point in points(sweep, where):
        for var_name, var in exp["variants"].items():
            name = point_name(var_name, point, where)
            at_point = _with_point(var, point, scale)
            reference = var.get("compare_to") or (None if var_name == exp["baseline"]
                                                  else exp["baseline"])
            at_point.pop("compare_to", None)
            if reference is not None:
                at_point["compare_to"] = point_name(reference, point, where)
            why = refusal(info, exp, at_point, scale, source,
                          f"experiments.{exp_name}.variants.{name}")
            if why:
                refused.append(Refused(name, why))
            else:
                variants[name] = at_point
    for var in variants.values():  # a reference refused at its point: the baseline's instead
        if var.get("compare_to") not in variants:
            var.pop("compare_to", None)
    first = next((n for n in variants if n.split(SEPARATOR, 1)[0] == exp["baseline"]), None)
    if first is None:
        raise SpecError(f"{where}: the family refuses the baseline {shown(exp['baseline'])} at "
                        f"every point: " + (refused[0].why if refused else "no points"))
    out = {k: v for k, v in exp.items() if k != "sweep"}
    out["scales"] = {s: {k: v for k, v in (b or {}).items() if k != "sweep"}
                     for s, b in (exp.get("scales") or {}).items()}
    out["variants"], out["baseline"] = variants, first
    return Expanded(out, axes, refused)


def technique(variant: str) -> str:
    """The written variant a point's variant was made from (``baseline`` of
    ``baseline.micro_batch-4``)."""
    return variant.split(SEPARATOR, 1)[0]


def family_sweeps(root: Path, family: str, scale: str) -> dict[str, Expanded]:
    """experiment -> its expansion, for the swept experiments of ``experiments/<family>.yaml``
    (``hopperlab list``: the axes and the refused points)."""
    path = root / "experiments" / f"{family}.yaml"
    source = str(path.relative_to(root))
    data = load_yaml(path, "experiments")
    out = {}
    for exp_name, exp in (data.get("experiments") or {}).items():
        if _block(exp, scale):
            out[exp_name] = expand(family, exp_name, exp, scale, source)
    return out
