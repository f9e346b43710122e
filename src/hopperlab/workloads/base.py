"""What every experiment family declares about itself, cheap to import (no torch).

The spec layer reads these declarations to refuse a knob a family does not support and to
type-check its parameters before anything is submitted; the runner imports ``entry`` lazily,
inside the job, so heavy imports stay on the compute node.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass(frozen=True)
class FamilyInfo:
    name: str
    #: "package.module:function" called as ``function(spec, recorder)`` inside the job.
    entry: str
    #: knob name -> the values this family implements. A knob not listed is unsupported.
    supported_knobs: dict[str, frozenset[Any]]
    #: frozen dataclass type of the family's parameters.
    params: type
    #: metric names the report charts for every experiment of the family.
    headline_metrics: tuple[str, ...] = field(default_factory=tuple)
    #: "package.module:function" drawing the family's own charts for one experiment:
    #: ``function(runs) -> list[FamilyChart]`` (runs: the report's rows of that experiment).
    #: The module imports matplotlib only (no torch): the report runs on the login node.
    charts: str | None = None

    def load_entry(self) -> Callable[..., Any]:
        return _load(self.entry)

    def load_charts(self) -> Callable[..., list["FamilyChart"]] | None:
        return _load(self.charts) if self.charts else None


@dataclass(frozen=True)
class FamilyChart:
    """One chart of a family's own (a matplotlib ``Figure``, made without pyplot)."""

    title: str
    caption: str
    figure: Any


def _load(ref: str) -> Callable[..., Any]:
    module_name, _, func = ref.partition(":")
    return getattr(importlib.import_module(module_name), func)
