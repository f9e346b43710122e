"""Reading the project's YAML files and checking them: once, for every file and dataclass.

Every config, site, experiments and assets file goes through ``load_yaml`` and
``validate_against_schema``; every typed spec (a family's params, an asset kind's fields) is
built by ``typed_from_mapping``. Each error names the file, the key path and what was expected.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, TypeVar

import yaml

from hopperlab.core.errors import SHOWN_MAX, SpecError, clip, shown

T = TypeVar("T")


def key_path(parts: Iterable[Any]) -> str:
    """``a.b.0.c`` for a key path (``(top level)`` when empty)."""
    return ".".join(clip(str(p)) for p in parts) or "(top level)"


def load_yaml(path: Path, what: str) -> Any:
    """The YAML file at ``path`` (``{}`` when empty); a missing or broken file is a SpecError."""
    if not path.exists():
        raise SpecError(f"{path}: {what} file not found")
    return safe_load_yaml(path.read_text(), str(path)) or {}


#: the most values one YAML document may expand to, an alias counted in full at every use: the
#: project's largest file has about 1,000; a "billion laughs" file has 10^9 and more
YAML_MAX_VALUES = 100_000


#: libyaml's parser where PyYAML was built with it (the same safe constructor, about ten times
#: quicker: each `hopperlab submit` reads some 100 project files, 0.9 s of CPU in pure Python)
_SAFE_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def safe_load_yaml(text: str, source: str, limit: int = YAML_MAX_VALUES) -> Any:
    """``yaml.safe_load`` for every project YAML file, refusing an alias bomb before it expands.

    Aliases share one node, so a small file can stand for billions of values that a schema
    check, a merge key (``<<``) or an error message would then expand. The composed node graph
    is measured first (each alias at its full size) and refused past ``limit``, naming the file.
    """
    loader = _SAFE_LOADER(text)
    try:
        node = loader.get_single_node()
        if node is not None:
            check_expansion(node, _node_children, source, limit)
        return loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as exc:
        raise SpecError(f"{source}: not valid YAML: {exc}") from None
    except RecursionError:
        raise SpecError(f"{source}: not accepted: its values are nested too deeply") from None
    finally:
        loader.dispose()


def _node_children(node: Any) -> list[Any]:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return node.value if isinstance(node, yaml.SequenceNode) else []


def value_children(value: Any) -> list[Any]:
    """The keys, values or items inside a loaded value (for ``check_expansion``)."""
    if isinstance(value, Mapping):
        return [part for pair in value.items() for part in pair]
    return list(value) if isinstance(value, (list, tuple, set)) else []


def check_expansion(root: Any, children: Callable[[Any], list[Any]], source: str,
                    limit: int = YAML_MAX_VALUES) -> None:
    """Refuse ``root`` when its aliases add more than ``limit`` values (or it loops on itself).

    What the aliases add is the expansion less the document itself: a large file without
    aliases (10,000 variants) is as big as it looks and is accepted; a small one whose aliases
    stand for millions of values is not. Shared parts are measured once and counted at every
    use, so the cost is that of the unexpanded document however large its expansion.
    """
    written = _written_size(root, children)
    limit += written
    sizes: dict[int, int] = {}
    active: set[int] = set()

    def size(item: Any) -> int:
        key = id(item)
        if key in sizes:
            return sizes[key]
        if key in active:   # an alias inside itself: endless
            return limit + 1
        active.add(key)
        total = 1
        for child in children(item):
            total = min(total + size(child), limit + 1)
        active.discard(key)
        sizes[key] = total
        return total

    if size(root) > limit:
        raise SpecError(f"{source}: not accepted: its aliases (*name) expand to more than "
                        f"{limit - written:,} values beyond the {written:,} written "
                        f"(a YAML alias bomb?)")


def _written_size(root: Any, children: Callable[[Any], list[Any]]) -> int:
    """How many values the document holds as written: each container once, each leaf at
    every place it appears (a repeated word is no alias)."""
    seen: set[int] = set()
    leaves = 0
    stack = [root]
    while stack:
        item = stack.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        for child in children(item):
            if children(child):
                stack.append(child)
            else:
                leaves += 1
    return len(seen) + leaves


def _schema_message(err: Any) -> str:
    """jsonschema's message with the offending value cut short (it quotes the value whole)."""
    whole = repr(err.instance)
    return err.message.replace(whole, shown(err.instance)) if len(whole) > SHOWN_MAX \
        else err.message


#: the longest file or folder name Linux file systems take (NAME_MAX, in bytes)
NAME_MAX = 255
#: the longest path the OS takes (PATH_MAX, in bytes, with its final NUL)
PATH_MAX = 4096
#: what a run directory keeps free of PATH_MAX for its own files (attempts/<n>/logs/...)
RUN_FILES_ROOM = 512


def check_path_name(name: str, where: str, room: int = 0) -> None:
    """Refuse a name that cannot be one folder name (plus ``room`` bytes of suffix).

    Such a name passes the schema, ``hopperlab list`` and ``snakemake -n``, and fails only when
    its folder is made (``File name too long``), after other runs have started.
    """
    if name in ("", ".", "..") or "/" in name or not name.isprintable():
        raise SpecError(f"{where}: {shown(name)} cannot be a folder name (empty, '.', '..', "
                        f"a '/' or a control character)")
    check_name_length(name, where, room)


def check_name_length(name: str, where: str, room: int = 0) -> None:
    """Refuse a path component longer than NAME_MAX (with ``room`` bytes of suffix)."""
    size = len(name.encode())
    if size + room > NAME_MAX:
        raise SpecError(f"{where}: the name {shown(name)} is {size} bytes long; as a folder "
                        f"name it may have at most {NAME_MAX - room}")


def check_path_length(path: Path, where: str, room: int = RUN_FILES_ROOM) -> None:
    """Refuse a folder whose path, with ``room`` bytes for what is written in it, is too long."""
    size = len(str(path).encode())
    if size + room > PATH_MAX:
        raise SpecError(f"{where}: its folder {clip(str(path))} would be a {size}-byte path; "
                        f"at most {PATH_MAX - room} bytes are left for it")


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
        lines.append(f"{source}: {key_path(path)}: {_schema_message(err)}")
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
    """A type hint as a reader would write it (``int | None``, ``one of a, b``)."""
    if typing.get_origin(tp) is typing.Literal:
        return "one of " + ", ".join(map(str, typing.get_args(tp)))
    if tp is bool:
        return "true or false"
    return getattr(tp, "__name__", None) or (
        str(tp).replace("typing.", "").replace("<class '", "").replace("'>", ""))


# --------------------------------------------------------------------------- declared bounds
#: the bounds a field may declare in its metadata (``bounded``), and how a message says each
BOUND_WORDS = {"at_least": "at least", "above": "more than", "at_most": "at most",
               "below": "less than"}


def bounded(default: Any, *, at_least: float | None = None, above: float | None = None,
            at_most: float | None = None, below: float | None = None,
            min_len: int | None = None, unique: bool = False, why: str = "") -> Any:
    """A dataclass field with declared bounds, read by ``field_problem`` (a list's bounds hold
    for each item; ``min_len`` and ``unique`` for the list): the one place a bound is written,
    so that the loader names the file and key and the message says the bound and ``why``."""
    meta = {k: v for k, v in (("at_least", at_least), ("above", above), ("at_most", at_most),
                              ("below", below), ("min_len", min_len)) if v is not None}
    if unique:
        meta["unique"] = True
    if why:
        meta["why"] = why
    return dataclasses.field(default=default, metadata=meta)


def _items_hint(tp: Any) -> Any | None:
    """The item type of a list or tuple hint (through ``| None``); None for other hints."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        inner = [_items_hint(a) for a in typing.get_args(tp) if a is not type(None)]
        return inner[0] if len(inner) == 1 else None
    if typing.get_origin(tp) in (list, tuple):
        args = [a for a in typing.get_args(tp) if a is not Ellipsis]
        return args[0] if args else Any
    return None


def _noun(tp: Any) -> str:
    tp = next((a for a in typing.get_args(tp) if a is not type(None)), tp) \
        if typing.get_origin(tp) in (typing.Union, types.UnionType) else tp
    return {int: "a whole number", float: "a number"}.get(tp, type_name(tp))


def field_problem(value: Any, tp: Any, meta: Mapping[str, Any]) -> str | None:
    """What is wrong with ``value`` for a field of type ``tp`` with declared bounds ``meta``
    (None: nothing): ``expected <what>, got <value>``."""
    if not value_fits(value, tp):
        items = _items_hint(tp)
        if items is not None and isinstance(value, (list, tuple)):
            bad = next(v for v in value if not value_fits(v, items))
            return f"expected each {type_name(items)}, got {shown(bad)} in {shown(list(value))}"
        return f"expected {type_name(tp)}, got {type(value).__name__} {shown(value)}"
    if value is None:
        return None
    why = f" ({meta['why']})" if meta.get("why") else ""
    items = _items_hint(tp)
    if items is not None:
        if "min_len" in meta and len(value) < meta["min_len"]:
            n = meta["min_len"]
            what = "one value" if n == 1 else f"{n} values"
            return f"expected at least {what}{why}, got {shown(list(value))}"
        if meta.get("unique") and len(set(value)) != len(value):
            return f"expected each value at most once{why}, got {shown(list(value))}"
    words = [f"{BOUND_WORDS[k]} {meta[k]}" for k in BOUND_WORDS if k in meta]
    if not words:
        return None
    for v in (value if items is not None else (value,)):
        if (v != v or ("at_least" in meta and v < meta["at_least"])  # NaN fits no bound
                or ("above" in meta and v <= meta["above"])
                or ("at_most" in meta and v > meta["at_most"])
                or ("below" in meta and v >= meta["below"])):
            noun = _noun(items if items is not None else tp)
            each = " each" if items is not None else ""
            return f"expected {noun} of {' and '.join(words)}{each}{why}, got {shown(value)}"
    return None


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def settle_fields(obj: Any) -> None:
    """Check a frozen dataclass's fields against their types (``Literal`` choices included)
    and declared bounds (``bounded``), making YAML lists tuples where a field is a tuple: the
    first thing a params class's ``__post_init__`` does; what it writes after are the checks
    across fields. Raises ValueError ``<field>: expected ..., got ...``."""
    hints = _hints(type(obj))
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, list) and not _wants_list(hints[f.name]):
            value = tuple(value)
            object.__setattr__(obj, f.name, value)
        problem = field_problem(value, hints[f.name], f.metadata)
        if problem:
            raise ValueError(f"{f.name}: {problem}")


def typed_from_mapping(cls: type[T], values: Mapping[str, Any], where: str, unknown: str, *,
                       hidden: Iterable[str] = (), fixed: Mapping[str, Any] | None = None) -> T:
    """``cls(**values)`` for a frozen dataclass, refusing unknown keys and wrong types.

    ``where`` is the file and key path (``experiments/x.yaml: a.params``); ``unknown`` says what
    a key is (``parameter of the finetune family``); ``hidden`` fields are not the file's to set
    and come from ``fixed``. Lists become tuples where the field is a tuple. Each value is
    checked against its field's type and declared bounds (``bounded``) here, naming its key;
    the dataclass's own ``__post_init__`` checks (fields that go together) become SpecErrors
    at ``where``.
    """
    hints = typing.get_type_hints(cls)
    hidden = set(hidden)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name not in hidden}
    for key, value in values.items():
        if key not in fields:
            raise SpecError(f"{where}.{clip(str(key))}: unknown {unknown}; "
                            f"expected one of: {', '.join(sorted(fields))}")
        problem = field_problem(value, hints[key], fields[key].metadata)
        if problem:
            raise SpecError(f"{where}.{key}: {problem}")
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


def project_schema(root: Path, name: str) -> dict[str, Any]:
    """The JSON Schema workflow/schemas/``name`` of the project at ``root``."""
    path = root / "workflow" / "schemas" / name
    return safe_load_yaml(path.read_text(), str(path))
