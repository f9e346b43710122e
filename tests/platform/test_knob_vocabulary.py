"""One vocabulary per knob (ARCHITECTURE.md, rule 6): the families declare the values they
implement (``FamilyInfo.supported_knobs``); the experiments schema must agree with them, so a
value a family adds or drops cannot be refused (or let through) by the schema alone."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from hopperlab.core.schema import load_yaml
from hopperlab.workloads import FAMILY_MODULES, family_info
from hopperlab.workloads.base import KNOB_DEFAULTS, Knobs

SCHEMA = Path(__file__).resolve().parents[2] / "workflow/schemas/experiments.schema.yaml"
KNOBS = [f.name for f in fields(Knobs)]


def _schema_knobs() -> dict:
    return load_yaml(SCHEMA, "experiments schema")["definitions"]["variant"]["properties"]


def _declared(knob: str) -> set:
    values: set = set()
    for name in FAMILY_MODULES:
        values |= set(family_info(name).supported_knobs.get(knob, ()))
    return values


def test_families_declare_only_known_knobs():
    for name in FAMILY_MODULES:
        assert set(family_info(name).supported_knobs) <= set(KNOBS), name


@pytest.mark.parametrize("knob", KNOBS)
def test_schema_agrees_with_the_families(knob):
    entry = _schema_knobs()[knob]
    declared = _declared(knob)
    assert declared, f"no family declares {knob}"
    if "enum" in entry:
        # every value some family implements, and no other
        assert set(entry["enum"]) == declared, knob
        assert KNOB_DEFAULTS[knob] in declared, knob
    else:
        # an open range (num_workers): every declared value fits the schema's type and bounds
        assert entry["type"] == "integer", knob
        assert all(isinstance(v, int) and not isinstance(v, bool) for v in declared), knob
        assert min(declared) >= entry.get("minimum", min(declared)), knob
        assert max(declared) <= entry.get("maximum", max(declared)), knob
        assert KNOB_DEFAULTS[knob] in declared, knob
