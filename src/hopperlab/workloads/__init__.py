"""The experiment families. Each sub-package exposes ``FAMILY: FamilyInfo`` in its ``__init__``.

Families are found by looking at the sub-packages of this package: a new family is a new folder
``hopperlab/workloads/<name>/`` whose ``__init__`` defines ``FAMILY`` (cheap to import: no torch),
plus ``experiments/<name>.yaml``. Nothing else needs an edit.
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

from hopperlab.workloads.base import FamilyInfo


def _discover() -> dict[str, str]:
    here = Path(__file__).parent
    found = {}
    for module in sorted(pkgutil.iter_modules([str(here)]), key=lambda m: m.name):
        if module.ispkg and not module.name.startswith("_"):
            found[module.name] = f"{__name__}.{module.name}"
    return found


#: family name -> module whose ``FAMILY`` describes it (every sub-package of this one).
FAMILY_MODULES: dict[str, str] = _discover()


def family_info(name: str) -> FamilyInfo:
    try:
        module = FAMILY_MODULES[name]
    except KeyError:
        known = ", ".join(sorted(FAMILY_MODULES))
        raise KeyError(f"unknown family {name!r}; known families: {known}") from None
    info = importlib.import_module(module).FAMILY
    if info.name != name:
        raise KeyError(f"{module}: FAMILY.name is {info.name!r}, expected {name!r} (the folder)")
    return info
