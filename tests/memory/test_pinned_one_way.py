"""Pinned host memory has one way in (issue 38): ``hopperlab.memory.pinned``, which registers
exactly the bytes asked for. ``Tensor.pin_memory()`` (PyTorch's caching host allocator, every
block rounded up to a power of two) appears nowhere else in the package, nor does a
``pin_memory=`` allocation in the families and techniques; cuda/ (below memory/) and membench
(whose subject is PyTorch's allocators) allocate pinned memory themselves."""

from __future__ import annotations

import ast

from tests.helpers import REPO

PACKAGE = REPO / "src" / "hopperlab"
#: the family that measures PyTorch's own allocators (pinned among them)
MEASURES_ALLOCATORS = ("workloads/membench/",)
#: torch's tensor factories (``pin_memory=`` of a DataLoader, save_on_cpu or FSDP's offload
#: policy is a feature's switch, not an allocation of ours)
ALLOCATORS = {"empty", "zeros", "ones", "full", "empty_like", "zeros_like", "ones_like",
              "full_like", "empty_strided", "tensor", "as_tensor"}


def test_pinned_memory_only_through_memory_pinned():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel == "memory/pinned.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), rel)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    node.func.attr == "pin_memory":
                found.append(f"{rel}:{node.lineno} .pin_memory()")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    node.func.attr in ALLOCATORS and \
                    any(k.arg == "pin_memory" for k in node.keywords) and \
                    rel.startswith(("workloads/", "memory/")) and \
                    not rel.startswith(MEASURES_ALLOCATORS):
                found.append(f"{rel}:{node.lineno} torch.{node.func.attr}(pin_memory=...)")
    assert found == [], "pinned memory outside memory.pinned:\n" + "\n".join(found)
