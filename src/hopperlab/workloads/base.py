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

    def load_entry(self) -> Callable[..., Any]:
        module_name, _, func = self.entry.partition(":")
        return getattr(importlib.import_module(module_name), func)
