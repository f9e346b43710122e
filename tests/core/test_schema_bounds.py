"""Validate once (ARCHITECTURE.md rule 7, issue 31): a family's params declare their bounds
(``Literal`` choices, ``core.schema.bounded``) and ``core.schema`` reads them, for the loader
(naming the file and key) and for a dataclass built in code alike; ``__post_init__`` keeps the
checks across fields."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
import typing

import pytest

from hopperlab.config.matrix import load_matrix
from hopperlab.core.errors import SpecError
from hopperlab.core.schema import bounded, field_problem, settle_fields, typed_from_mapping
from hopperlab.workloads import FAMILY_MODULES, family_info
from hopperlab.workloads.finetune import FinetuneParams
from tests.helpers import copy_project, edit_yaml

FAMILIES = sorted(FAMILY_MODULES)


def _params(family: str) -> type:
    return family_info(family).params


@pytest.mark.parametrize("family", FAMILIES)
def test_post_init_holds_no_hand_coded_bound(family):
    """No ``isinstance`` or ``value not in CHOICES`` left in ``__post_init__``: the bounds are
    the fields' declarations, read by ``settle_fields``."""
    cls = _params(family)
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls.__post_init__)))
    calls = [n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Name)]
    assert "settle_fields" in calls, family
    assert "isinstance" not in calls, family
    memberships = [n for n in ast.walk(tree) if isinstance(n, ast.Compare)
                   and any(isinstance(op, (ast.In, ast.NotIn)) for op in n.ops)]
    assert not memberships, f"{family}: a choice checked by hand in __post_init__"


@pytest.mark.parametrize("family", FAMILIES)
def test_every_declared_choice_and_bound_is_enforced(family):
    """Each Literal field refuses a value outside it; each bounded field one past its bound;
    the message names the field."""
    cls = _params(family)
    hints = typing.get_type_hints(cls)
    checked = 0
    for f in dataclasses.fields(cls):
        tp, meta = hints[f.name], f.metadata
        if typing.get_origin(tp) is typing.Literal:
            bad: object = "not-a-choice"
        elif "at_least" in meta:
            bad = meta["at_least"] - 1
        elif "above" in meta:
            bad = meta["above"]
        else:
            continue
        if typing.get_origin(tp) is tuple or typing.get_origin(
                next((a for a in typing.get_args(tp) if a is not type(None)), tp)) is tuple:
            bad = (bad,)
        with pytest.raises(ValueError, match=f"^{f.name}: expected"):
            cls(**{f.name: bad})
        checked += 1
    assert checked >= 2, family


def test_the_loader_names_the_file_and_the_key_of_a_bad_bound():
    where = "experiments/finetune.yaml: experiments.lora.variants.a.params"
    with pytest.raises(SpecError) as err:
        typed_from_mapping(FinetuneParams, {"lora_rank": 0}, where, "parameter")
    assert str(err.value) == (f"{where}.lora_rank: expected a whole number of at least 1, "
                              f"got 0")
    with pytest.raises(SpecError, match=r"params\.measured_steps: expected a whole number of "
                                        r"at least 2 \(a loss drop needs two\), got 1"):
        typed_from_mapping(FinetuneParams, {"measured_steps": 1}, where, "parameter")
    with pytest.raises(SpecError, match=r"params\.backend: expected one of torch, got str 'jax'"):
        typed_from_mapping(FinetuneParams, {"backend": "jax"}, where, "parameter")


def test_a_bad_bound_in_an_experiments_file_names_file_and_key(tmp_path):
    project = copy_project(tmp_path / "project")
    path = project / "experiments/membench.yaml"
    edit_yaml(path, lambda d: d["experiments"]["copy"]["variants"]["h2d-pinned"]["params"]
              .update(sizes_mb=[1, 0]))
    with pytest.raises(SpecError) as err:
        load_matrix(project, {"families": ["membench"]})
    assert ("experiments/membench.yaml: experiments.copy.variants.h2d-pinned.params.sizes_mb: "
            "expected a whole number of at least 1 each, got [1, 0]") in str(err.value)


def test_bounds_of_a_small_dataclass():
    @dataclasses.dataclass(frozen=True)
    class P:
        share: float = bounded(0.5, at_least=0, below=1, why="a share")
        sizes: tuple[int, ...] = bounded((1,), at_least=1, min_len=1, unique=True)
        kind: typing.Literal["a", "b"] = "a"

        def __post_init__(self) -> None:
            settle_fields(self)

    assert P(sizes=[2, 3]).sizes == (2, 3)
    for bad, needle in (({"share": 1.0}, "share: expected a number of at least 0 and less than "
                                          "1 (a share), got 1.0"),
                        ({"share": float("nan")}, "share: expected a number"),
                        ({"sizes": ()}, "sizes: expected at least one value"),
                        ({"sizes": (2, 2)}, "sizes: expected each value at most once"),
                        ({"kind": "c"}, "kind: expected one of a, b, got str 'c'"),
                        ({"share": True}, "share: expected float, got bool True")):
        with pytest.raises(ValueError) as err:
            P(**bad)
        assert needle in str(err.value)
    assert field_problem(None, int | None, {"at_least": 1}) is None
