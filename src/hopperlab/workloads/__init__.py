"""The experiment families. Each sub-package exposes ``FAMILY: FamilyInfo`` in its ``__init__``."""

from __future__ import annotations

import importlib

from hopperlab.workloads.base import FamilyInfo

#: family name -> module whose ``FAMILY`` describes it. Add a family here.
FAMILY_MODULES: dict[str, str] = {
    "membench": "hopperlab.workloads.membench",
    "selftest": "hopperlab.workloads.selftest",
}


def family_info(name: str) -> FamilyInfo:
    try:
        module = FAMILY_MODULES[name]
    except KeyError:
        known = ", ".join(sorted(FAMILY_MODULES))
        raise KeyError(f"unknown family {name!r}; known families: {known}") from None
    return importlib.import_module(module).FAMILY
