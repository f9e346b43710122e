"""Validation once (issue 31): the Snakefile read and checked the config three times (hopperlab's
schema check, Snakemake's ``validate``, then ``load_matrix`` again). Now the thin Snakefile calls
one package function, once, and that function checks the config against its schema once."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hopperlab.cli import workflow
from hopperlab.config import matrix as matrix_module

ROOT = Path(__file__).resolve().parents[2]


def test_the_snakefile_validates_through_one_package_call():
    text = (ROOT / "Snakefile").read_text()
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    assert "configfile:" not in code and "validate(" not in code
    assert len(re.findall(r"\bworkflow_matrix\(", code)) == 1
    rules = "\n".join(p.read_text() for p in (ROOT / "workflow" / "rules").glob("*.smk"))
    assert "load_matrix(" not in rules and "validate(" not in rules


def test_workflow_matrix_checks_the_config_schema_once(monkeypatch):
    seen: list[str] = []
    real = matrix_module.validate_against_schema

    def counting(data, schema, source):
        seen.append(source)
        return real(data, schema, source)

    monkeypatch.setattr(matrix_module, "validate_against_schema", counting)
    m = workflow.workflow_matrix(ROOT, {"families": "membench", "scale": "full"})
    assert m.config["scale"] == "full" and m.config["families"] == ["membench"]
    config_checks = [s for s in seen if "config.yaml" in s]
    assert config_checks == ["configs/config.yaml (with --config overrides)"]


def test_a_config_mistake_stops_in_one_line(capsys):
    with pytest.raises(SystemExit) as exit_:
        workflow.workflow_matrix(ROOT, {"sacle": "full"})
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "sacle: unknown key" in err
