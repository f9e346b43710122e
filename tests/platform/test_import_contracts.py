"""pyproject.toml's import-linter contracts list families and memory modules by name: a new
family folder or memory module left out of its list is not checked, and nothing said so
(issue 31). These tests compare each list with the folders and modules on disk."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"


def _folder(module: str) -> Path:
    return SRC.joinpath(*module.split("."))


def children(package: str, *, folders_only: bool) -> set[str]:
    """The sub-packages (folders with ``__init__.py``) of ``package``, and unless
    ``folders_only`` its modules (``*.py`` but ``__init__``)."""
    folder = _folder(package)
    out = {p.name for p in folder.iterdir() if (p / "__init__.py").is_file()}
    if not folders_only:
        out |= {p.stem for p in folder.glob("*.py") if p.stem != "__init__"}
    return out


def contract_gaps(pyproject: dict[str, Any]) -> list[str]:
    """What each contract's list misses: for an independence contract, a sibling package of the
    ones it names; for a layers contract with containers, a module of the container."""
    gaps = []
    for contract in pyproject["tool"]["importlinter"]["contracts"]:
        if contract["type"] == "independence":
            if all(m.endswith(".*") for m in contract["modules"]):
                continue  # "package.*": every child, a new folder included, by import-linter
            parents = {m.rsplit(".", 1)[0] for m in contract["modules"]}
            for parent in sorted(parents):
                listed = {m.rsplit(".", 1)[1] for m in contract["modules"]
                          if m.rsplit(".", 1)[0] == parent}
                for name in sorted(children(parent, folders_only=True) - listed):
                    gaps.append(f"{contract['name']!r}: {parent}.{name} is not listed")
        for container in contract.get("containers", []):
            listed = {part.strip() for layer in contract["layers"] for part in layer.split("|")}
            for name in sorted(children(container, folders_only=False) - listed):
                gaps.append(f"{contract['name']!r}: {container}.{name} is not in any layer")
    return gaps


def _pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_every_family_and_memory_module_is_in_its_contract():
    assert contract_gaps(_pyproject()) == []


def test_a_missing_family_or_memory_module_is_found():
    data = _pyproject()
    contracts = data["tool"]["importlinter"]["contracts"]
    families = next(c for c in contracts if c["type"] == "independence"
                    and "hopperlab.workloads.finetune" in c["modules"])
    families["modules"].remove("hopperlab.workloads.finetune")
    memory = next(c for c in contracts if "hopperlab.memory" in c.get("containers", []))
    memory["layers"] = [layer.replace("pinned", "unrelated") for layer in memory["layers"]]
    gaps = contract_gaps(data)
    assert any("hopperlab.workloads.finetune is not listed" in g for g in gaps), gaps
    assert any("hopperlab.memory.pinned is not in any layer" in g for g in gaps), gaps
    assert len(gaps) == 2, gaps


def test_results_never_imports_a_memory_technique():
    """A new memory technique touches no results/ code (ARCHITECTURE.md's walk): its report
    table lives with its family (finetune's saved-tensor census: ``FamilyInfo.tables``)."""
    import ast

    offenders = []
    for path in sorted((SRC / "hopperlab" / "results").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{path.relative_to(SRC)}: {n}" for n in names
                          if n == "hopperlab.memory" or n.startswith("hopperlab.memory.")]
    assert offenders == []
    contracts = _pyproject()["tool"]["importlinter"]["contracts"]
    assert any(c["type"] == "forbidden" and c["source_modules"] == ["hopperlab.results"]
               and "hopperlab.memory" in c["forbidden_modules"] for c in contracts)


@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
def test_only_cli_parses_arguments():
    """cli/ is the only argument parser (ARCHITECTURE.md): membench's sweep had its own
    argparse inside the family; the workflow runs the sweep now."""
    import ast

    offenders = []
    for path in sorted((SRC / "hopperlab").rglob("*.py")):
        if path.relative_to(SRC / "hopperlab").parts[0] == "cli":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [str(path.relative_to(SRC)) for n in names if n == "argparse"]
    assert offenders == []
