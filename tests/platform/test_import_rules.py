"""The rules of the house that import-linter does not check (ARCHITECTURE.md, rules 5 and 1-3).

import-linter (``lint-imports``, run by scripts/test.sh) keeps the layers; these tests read the
package's own source with ``ast`` and keep the rest: no import cycle between modules, hopperlab's
own modules imported only at module top, heavy third-party packages only inside functions, and
``importlib`` only in the family and backend registries.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = SRC / "hopperlab"
HEAVY = {"torch", "mlflow", "matplotlib", "submitit", "transformers"}
#: the family and backend registries: the places that may import modules by name
IMPORTLIB_ALLOWED = {"hopperlab.workloads", "hopperlab.workloads.base", "hopperlab.backends"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, ast.Module]:
    return {module_name(p): ast.parse(p.read_text(), str(p)) for p in sorted(PACKAGE.rglob("*.py"))}


def imported(node: ast.AST, current: str) -> list[str]:
    """The absolute module names an Import/ImportFrom node names (``from a import b`` gives
    ``a.b`` when that is a module of ours, else ``a``)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            parent = current.split(".")[: len(current.split(".")) - node.level + 1]
            base = ".".join(parent + ([base] if base else []))
        return [base] + [f"{base}.{alias.name}" for alias in node.names]
    return []


def top_level_imports(tree: ast.Module) -> list[ast.stmt]:
    """Import statements executed when the module is imported (not inside a def)."""
    found = []
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            for field in ("body", "orelse", "finalbody", "handlers"):
                for child in getattr(node, field, []):
                    todo.extend(child.body if isinstance(child, ast.ExceptHandler) else [child])
    return found


def function_imports(tree: ast.Module) -> list[ast.stmt]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for inner in ast.walk(node):
                if isinstance(inner, (ast.Import, ast.ImportFrom)):
                    found.append(inner)
    return found


@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
def test_no_hopperlab_import_inside_a_function():
    found = []
    for name, tree in modules().items():
        for node in function_imports(tree):
            ours = [m for m in imported(node, name) if m.split(".")[0] == "hopperlab"]
            if ours or (isinstance(node, ast.ImportFrom) and node.level):
                found.append(f"{name}:{node.lineno}: {ast.unparse(node)}")
    assert not found, "hopperlab modules imported inside functions:\n" + "\n".join(found)


def job_side_modules() -> set[str]:
    """The compute modules pyproject.toml lets import torch at module level (ruff TID253)."""
    import fnmatch
    import tomllib

    config = tomllib.loads((SRC.parent / "pyproject.toml").read_text())
    ignores = config["tool"]["ruff"]["lint"]["per-file-ignores"]
    patterns = [p for p, rules in ignores.items() if "TID253" in rules]
    expanded = []
    for pattern in patterns:  # ruff's {a,b} alternatives
        head, brace, rest = pattern.partition("{")
        if not brace:
            expanded.append(pattern)
            continue
        names, _, tail = rest.partition("}")
        expanded += [head + n + tail for n in names.split(",")]
    found = set()
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(SRC.parent).as_posix()
        if any(fnmatch.fnmatch(rel, p) for p in expanded):
            found.add(module_name(path))
    return found


@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
def test_heavy_packages_are_imported_inside_functions_only():
    """Except in the declared job-side compute modules (whose module top is torch code)."""
    job_side = job_side_modules()
    assert job_side, "pyproject.toml declares no job-side module"
    found = []
    for name, tree in modules().items():
        if name in job_side:
            continue
        for node in top_level_imports(tree):
            heavy = {m.split(".")[0] for m in imported(node, name)} & HEAVY
            if heavy:
                found.append(f"{name}:{node.lineno}: {ast.unparse(node)}")
    assert not found, "heavy packages imported at module level:\n" + "\n".join(found)


def test_the_login_node_command_line_loads_no_heavy_package():
    """Importing the command line (what a login node runs) reaches no job-side module."""
    code = ("import sys, hopperlab.cli.main, hopperlab.cli.workflow\n"
            "print(' '.join(sorted({m.split('.')[0] for m in sys.modules} & set(sys.argv[1:]))))")
    out = subprocess.run([sys.executable, "-c", code, *sorted(HEAVY)], capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == ""


@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
def test_importlib_only_in_the_family_registry():
    found = []
    for name, tree in modules().items():
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and name not in IMPORTLIB_ALLOWED:
                if any(m.split(".")[0] == "importlib" for m in imported(node, name)):
                    found.append(f"{name}:{node.lineno}: {ast.unparse(node)}")
    assert not found, "importlib outside the family registry:\n" + "\n".join(found)


def import_graph() -> dict[str, set[str]]:
    trees = modules()
    graph: dict[str, set[str]] = {name: set() for name in trees}
    for name, tree in trees.items():
        for node in top_level_imports(tree) + function_imports(tree):
            for target in imported(node, name):
                if target in trees and target != name:
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_cycle_finder_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
def test_no_import_cycle_between_modules():
    # a package's __init__ importing its own submodules is not a cycle of design
    graph = {name: {t for t in targets if not name.startswith(t + ".")}
             for name, targets in import_graph().items()}
    assert cycles(graph) == []


@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
def test_lint_imports_keeps_the_layers():
    pytest.importorskip("importlinter")
    out = subprocess.run([sys.executable, "-c", "from importlinter.cli import lint_imports_command;"
                          "lint_imports_command()"], cwd=SRC.parent, capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
