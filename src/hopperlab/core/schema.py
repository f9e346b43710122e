"""Reading the project's YAML files and checking them: once, for every file and dataclass.

Every config, site, experiments and assets file goes through ``load_yaml`` and
``validate_against_schema``; every typed spec (a family's params, an asset kind's fields) is
built by ``typed_from_mapping``. Each error names the file, the key path and what was expected.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, Iterable, Mapping, TypeVar

import yaml

from hopperlab.core.errors import SpecError

T = TypeVar("T")


def key_path(parts: Iterable[Any]) -> str:
    """``a.b.0.c`` for a key path (``(top level)`` when empty)."""
    return ".".join(str(p) for p in parts) or "(top level)"


def load_yaml(path: Path, what: str) -> Any:
    """The YAML file at ``path`` (``{}`` when empty); a missing or broken file is a SpecError."""
    if not path.exists():
        raise SpecError(f"{path}: {what} file not found")
    try:
        return yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: not valid YAML: {exc}") from None


def validate_against_schema(data: Any, schema: Mapping[str, Any], source: str) -> None:
    """Validate with jsonschema; raise SpecError naming file, key path and what was expected."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(data), key=lambda e: list(map(str, e.absolute_path)))
    if not errors:
        return
    lines = []
    for err in errors[:5]:
        path = list(err.absolute_path)
        if err.validator == "additionalProperties":
            allowed = sorted(err.schema.get("properties", {}))
            extra = sorted(set(err.instance) - set(allowed))
            for key in extra:
                hint = f"; expected one of: {', '.join(allowed)}" if allowed else ""
                lines.append(f"{source}: {key_path(path + [key])}: unknown key{hint}")
            continue
        lines.append(f"{source}: {key_path(path)}: {err.message}")
    raise SpecError("\n".join(lines))


def value_fits(value: Any, tp: Any) -> bool:
    """Whether a YAML value fits the type hint ``tp`` (bools are not numbers)."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(value_fits(value, arg) for arg in typing.get_args(tp))
    if origin is typing.Literal:
        return value in typing.get_args(tp)
    if tp is type(None):
        return value is None
    if origin in (list, tuple):
        args = [a for a in typing.get_args(tp) if a is not Ellipsis]
        inner = args[0] if args else Any
        return isinstance(value, (list, tuple)) and all(value_fits(v, inner) for v in value)
    if origin is dict or tp is dict:
        return isinstance(value, dict)
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(tp, type):
        return isinstance(value, tp)
    return True


def type_name(tp: Any) -> str:
    """A type hint as a reader would write it (``int | None``, ``one of 'a', 'b'``)."""
    if typing.get_origin(tp) is typing.Literal:
        return "one of " + ", ".join(map(repr, typing.get_args(tp)))
    return getattr(tp, "__name__", None) or (
        str(tp).replace("typing.", "").replace("<class '", "").replace("'>", ""))


def typed_from_mapping(cls: type[T], values: Mapping[str, Any], where: str, unknown: str, *,
                       hidden: Iterable[str] = (), fixed: Mapping[str, Any] | None = None) -> T:
    """``cls(**values)`` for a frozen dataclass, refusing unknown keys and wrong types.

    ``where`` is the file and key path (``experiments/x.yaml: a.params``); ``unknown`` says what
    a key is (``parameter of the finetune family``); ``hidden`` fields are not the file's to set
    and come from ``fixed``. Lists become tuples where the field is a tuple. The dataclass's own
    ``__post_init__`` checks (bounds, fields that go together) become SpecErrors at ``where``.
    """
    hints = typing.get_type_hints(cls)
    hidden = set(hidden)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name not in hidden}
    for key, value in values.items():
        if key not in fields:
            raise SpecError(f"{where}.{key}: unknown {unknown}; "
                            f"expected one of: {', '.join(sorted(fields))}")
        if not value_fits(value, hints[key]):
            raise SpecError(f"{where}.{key}: expected {type_name(hints[key])}, "
                            f"got {type(value).__name__} {value!r}")
    missing = [f.name for f in fields.values() if f.name not in values
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise SpecError(f"{where}: missing required key(s): {', '.join(missing)}")
    converted = {k: tuple(v) if isinstance(v, list) and not _wants_list(hints[k]) else v
                 for k, v in values.items()}
    try:
        return cls(**converted, **(fixed or {}))
    except (TypeError, ValueError) as exc:
        raise SpecError(f"{where}: {exc}") from None


def _wants_list(tp: Any) -> bool:
    """Whether a hint asks for a list (else a YAML list becomes a tuple: frozen specs hash)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return any(_wants_list(arg) for arg in typing.get_args(tp))
    return tp is list or typing.get_origin(tp) is list
