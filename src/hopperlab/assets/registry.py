"""Asset kinds and the asset list of ``configs/assets.yaml``, loaded into typed, validated specs.

An asset kind is the extension point: a typed spec dataclass (the YAML fields), a build function
that writes the asset's files into a fresh folder, the files it must produce, and the other
assets it is built from. Models, tokenizers and data sets are kinds; recommender or TPC-H tables
plug in the same way (``register_kind``). Config mistakes fail here, before anything is fetched,
naming the file, the key and what was expected (``SpecError``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from hopperlab.core.errors import SpecError, clip, shown
from hopperlab.core.schema import (
    check_path_name,
    load_yaml,
    safe_load_yaml,
    typed_from_mapping,
    validate_against_schema,
)

ASSETS_FILE = "configs/assets.yaml"
#: more asset files, one per family (same format as ASSETS_FILE), merged in name order
ASSETS_EXTRA_GLOB = "configs/assets.d/*.yaml"
SCHEMA_FILE = "workflow/schemas/assets.schema.yaml"
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
#: bytes of a folder name the store adds to an asset's name ("@<fingerprint>.partial", ...)
ASSET_NAME_ROOM = 64
REVISION_RE = re.compile(r"^[0-9a-f]{40}$")
#: spec fields that say where or how, not what: they never change an asset's fingerprint
NOT_DEFINITION = "definition"


# --------------------------------------------------------------------------- the interface
@dataclass(frozen=True, kw_only=True)
class AssetSpec:
    """Fields every asset has; each kind subclasses this with its own typed fields."""

    name: str
    kind: str
    description: str = field(default="", metadata={NOT_DEFINITION: False})
    #: the file the spec came from and the repository root (for messages and repo-relative paths)
    source: str = field(default=ASSETS_FILE, metadata={NOT_DEFINITION: False}, compare=False)
    root: str = field(default=".", metadata={NOT_DEFINITION: False}, compare=False)

    @property
    def where(self) -> str:
        return f"{self.source}: assets.{self.name}"


@dataclass
class BuildContext:
    """What a kind's build function gets: where to write, its inputs, and what to expect.

    ``out`` is a fresh temporary folder; the build writes every file of the asset there and
    nothing else. ``expect`` records checksums or sizes known from the source (e.g. the Hub's),
    which are checked against the files before the asset is moved into place.
    """

    name: str
    out: Path
    root: Path
    inputs: dict[str, Path]
    weights: str | None = None  # an override of a model's ``weights`` field
    previous: Path | None = None  # the asset's old folder, if any: files may be reused from it
    expected: dict[str, dict[str, Any]] = field(default_factory=dict)

    def expect(self, rel: str, **checks: Any) -> None:
        """Record checks of one file: ``sha256=``, ``size=``, ``git_blob=`` (None: unknown)."""
        self.expected.setdefault(rel, {}).update({k: v for k, v in checks.items() if v is not None})


@dataclass
class RepairContext:
    """What a kind's repair function gets: the asset folder, the damaged files, the reference."""

    name: str
    folder: Path
    tmp: Path  # a scratch folder on the same file system (for atomic replaces)
    damaged: list[str]  # relative paths that are missing or do not match ``reference``
    reference: dict[str, str]  # path -> sha256 of the complete asset


@dataclass(frozen=True)
class AssetKind:
    """One kind of asset.

    ``build(spec, ctx) -> dict`` writes the files into ``ctx.out`` and returns where they came
    from (recorded in ASSET.json). ``produces(spec)`` are glob patterns that must each match a
    file of the built asset. ``input_kinds`` maps each spec field that names another asset to the
    kinds it may be. ``repair(spec, ctx)``, when given, replaces damaged files in place
    (e.g. re-downloads them); without it a damaged asset is rebuilt whole. Bump ``version`` when
    the build's output changes, so that built assets are rebuilt.
    """

    name: str
    spec: type[AssetSpec]
    build: Callable[[Any, BuildContext], Mapping[str, Any] | None]
    produces: Callable[[Any], tuple[str, ...]] = lambda spec: ()
    input_kinds: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    repair: Callable[[Any, RepairContext], None] | None = None
    validate: Callable[[Any, Mapping[str, AssetSpec]], None] | None = None
    #: extra definition for the fingerprint (e.g. the content of a repo file the spec names)
    definition_extra: Callable[[Any], Mapping[str, Any]] | None = None
    version: int = 1
    #: a failed fetch keeps its partial folder, and the next fetch resumes into it (downloads)
    resumable: bool = False
    summary: str = ""


KINDS: dict[str, AssetKind] = {}


def register_kind(kind: AssetKind) -> AssetKind:
    """Add (or replace) an asset kind: the extension point for new families' inputs."""
    if not NAME_RE.match(kind.name):
        raise ValueError(f"asset kind name {kind.name!r} must match {NAME_RE.pattern}")
    if not (dataclasses.is_dataclass(kind.spec) and issubclass(kind.spec, AssetSpec)):
        raise TypeError(f"asset kind {kind.name!r}: spec must be an AssetSpec dataclass")
    KINDS[kind.name] = kind
    return kind


def kinds() -> dict[str, AssetKind]:
    """Every registered kind; the built-in ones register when ``hopperlab.assets`` is imported
    (``hopperlab.assets.builtin_kinds``), which importing this module does first."""
    return KINDS


# --------------------------------------------------------------------------- loading
def _build_spec(kind: AssetKind, name: str, data: Mapping[str, Any], source: str,
                root: Path) -> AssetSpec:
    return typed_from_mapping(kind.spec, data, f"{source}: assets.{name}",
                              f"key for kind {kind.name!r}", hidden=("name", "source", "root"),
                              fixed={"name": name, "source": source, "root": str(root)})


def _schema_checked(root: Path, rel: str) -> dict[str, Any]:
    data = load_yaml(root / rel, "assets")
    schema_path = root / SCHEMA_FILE
    if not schema_path.exists():  # a test root or an installed package: the bundled schema
        schema_path = Path(__file__).resolve().parents[3] / SCHEMA_FILE
    if schema_path.exists():
        schema = safe_load_yaml(schema_path.read_text(), str(schema_path))
        validate_against_schema(data, schema, rel)
    if not isinstance(data.get("assets"), dict):
        raise SpecError(f"{rel}: assets: expected a mapping of asset name -> fields")
    return data


def load_assets_file(root: Path | str) -> dict[str, Any]:
    """``configs/assets.yaml`` merged with ``configs/assets.d/*.yaml``, each schema-checked.

    The result has ``assets``, ``scales`` and ``sources`` (asset name -> the file defining it).
    A name defined in two files is refused, naming both.
    """
    root = Path(root)
    files = [ASSETS_FILE] + sorted(str(p.relative_to(root)) for p in root.glob(ASSETS_EXTRA_GLOB))
    merged: dict[str, Any] = {"assets": {}, "scales": {}, "sources": {}}
    for rel in files:
        if rel != ASSETS_FILE and not (root / rel).is_file():
            continue
        data = _schema_checked(root, rel)
        for name, fields_ in data["assets"].items():
            if name in merged["sources"]:
                raise SpecError(f"{rel}: assets.{name}: already defined in "
                                f"{merged['sources'][name]}; asset names are unique")
            merged["assets"][name] = fields_
            merged["sources"][name] = rel
        for scale, names in (data.get("scales") or {}).items():
            merged["scales"].setdefault(scale, []).extend(names)
    return merged


def load_assets(root: Path | str,
                substitutes: Mapping[str, str] | None = None) -> dict[str, AssetSpec]:
    """Every asset of ``configs/assets.yaml`` as a typed spec, in file order, validated.

    With ``substitutes`` (``asset_substitutes`` of the config), the assets derived from
    substituted ones are added (``apply_substitutes``), so that their names can be built.
    """
    root = Path(root).resolve()
    data = load_assets_file(root)
    registry = kinds()
    specs: dict[str, AssetSpec] = {}
    for name, fields_ in data["assets"].items():
        source = data["sources"][name]
        where = f"{source}: assets.{clip(str(name))}"
        if not NAME_RE.match(str(name)):
            raise SpecError(f"{where}: asset names must match {NAME_RE.pattern}")
        check_path_name(name, f"{source}: assets.{clip(name)}", room=ASSET_NAME_ROOM)
        if not isinstance(fields_, dict) or "kind" not in fields_:
            raise SpecError(f"{where}.kind: required; one of: {', '.join(sorted(registry))}")
        kind = registry.get(fields_["kind"])
        if kind is None:
            raise SpecError(f"{where}.kind: unknown kind {shown(fields_['kind'])}; "
                            f"expected one of: {', '.join(sorted(registry))}")
        specs[name] = _build_spec(kind, name, fields_, source, root)
    for spec in specs.values():
        _check_inputs(spec, specs)
        validate = registry[spec.kind].validate
        if validate is not None:
            validate(spec, specs)
    _check_cycles(specs)
    for scale, names in (data.get("scales") or {}).items():
        for i, name in enumerate(names):
            if name not in specs:
                raise SpecError(f"{ASSETS_FILE}: scales.{scale}[{i}]: unknown asset {shown(name)}")
    if substitutes:
        specs, _ = apply_substitutes(specs, substitutes)
    return specs


def load_scales(root: Path | str) -> dict[str, list[str]]:
    """``scales`` of ``configs/assets.yaml``: which assets each scale (smoke, full) uses."""
    return {k: list(v) for k, v in (load_assets_file(root).get("scales") or {}).items()}


def _check_inputs(spec: AssetSpec, specs: Mapping[str, AssetSpec]) -> None:
    kind = KINDS[spec.kind]
    for role, allowed in kind.input_kinds.items():
        dep = getattr(spec, role)
        if dep is None:
            continue
        if dep not in specs:
            raise SpecError(f"{spec.where}.{role}: unknown asset {shown(dep)}; "
                            f"known assets: {', '.join(specs)}")
        if specs[dep].kind not in allowed:
            raise SpecError(f"{spec.where}.{role}: {dep!r} is of kind {specs[dep].kind!r}; "
                            f"expected an asset of kind {' or '.join(allowed)}")


def _check_cycles(specs: Mapping[str, AssetSpec]) -> None:
    state: dict[str, int] = {}

    def visit(name: str, path: list[str]) -> None:
        if state.get(name) == 2:
            return
        if state.get(name) == 1:
            cycle = " -> ".join(path[path.index(name):] + [name])
            raise SpecError(f"{specs[name].where}: assets are built from each other: {cycle}")
        state[name] = 1
        for dep in asset_inputs(name, specs).values():
            visit(dep, path + [name])
        state[name] = 2

    for name in specs:
        visit(name, [])


# --------------------------------------------------------------------------- substitutes
#: what a derived asset's name adds to the name of the asset it stands in for
SUBSTITUTED_TAG = ".sub-"
_SUBSTITUTES_WHERE = "configs/config.yaml (with --config overrides): asset_substitutes"


def apply_substitutes(specs: Mapping[str, AssetSpec], substitutes: Mapping[str, str]
                      ) -> tuple[dict[str, AssetSpec], dict[str, str]]:
    """The specs with derived assets added, and the asset each name is replaced by.

    A substitute replaces an asset wherever it is used, inputs of other assets included: an
    asset built (directly or not) from a substituted one is replaced by a derived spec built
    from the substitute. The derived spec has its own name (``NAME.sub-HASH``) and, since its
    inputs differ, its own fingerprint, so that a folder built from the real input is never
    taken for it. Names no substitution touches map to themselves.
    """
    out = dict(specs)
    renames: dict[str, str] = {}
    in_progress: set[str] = set()

    def effective(name: str) -> str:
        if name not in renames:
            if name in in_progress:
                raise SpecError(f"{_SUBSTITUTES_WHERE}: {name!r} would be built from itself "
                                f"(a substitute built from the asset it replaces)")
            in_progress.add(name)
            renames[name] = _derived(_substitute_of(name, substitutes), out, effective)
            in_progress.discard(name)
        return renames[name]

    for name in specs:
        effective(name)
    return out, renames


def _substitute_of(name: str, substitutes: Mapping[str, str]) -> str:
    """Follow ``a:b, b:c`` to ``c``: what stands in for a substitute stands in for it too."""
    seen = [name]
    while name in substitutes:
        name = substitutes[name]
        if name in seen:
            raise SpecError(f"{_SUBSTITUTES_WHERE}: substitutes go round in a circle: "
                            f"{' -> '.join(seen + [name])}")
        seen.append(name)
    return name


def _derived(name: str, out: dict[str, AssetSpec], effective: Callable[[str], str]) -> str:
    """``name``, or the name of a derived spec whose inputs are their substitutes (added to
    ``out``); the hash in the name says which inputs, so different substitutions never share
    a folder."""
    inputs = asset_inputs(name, out)
    replaced = {role: effective(dep) for role, dep in inputs.items()}
    if replaced == inputs:
        return name
    digest = hashlib.sha256(json.dumps(replaced, sort_keys=True).encode()).hexdigest()[:8]
    new_name = f"{name}{SUBSTITUTED_TAG}{digest}"
    if new_name not in out:
        spec = out[name]
        changes = ", ".join(f"{role}: {replaced[role]} for {dep}" for role, dep in inputs.items()
                            if replaced[role] != dep)
        derived = dataclasses.replace(
            spec, name=new_name, **replaced,
            description=f"{spec.description} [asset_substitutes: {changes}]".lstrip())
        try:
            _check_inputs(derived, out)
            validate = KINDS[derived.kind].validate
            if validate is not None:
                validate(derived, out)
        except SpecError as exc:
            raise SpecError(f"{_SUBSTITUTES_WHERE}: {name} built with {changes}: {exc}") from None
        out[new_name] = derived
    return new_name


# --------------------------------------------------------------------------- questions
def _specs(root_or_specs: Path | str | Mapping[str, AssetSpec]) -> Mapping[str, AssetSpec]:
    if isinstance(root_or_specs, Mapping):
        return root_or_specs
    return load_assets(root_or_specs)


def get_spec(specs: Mapping[str, AssetSpec], name: str) -> AssetSpec:
    try:
        return specs[name]
    except KeyError:
        raise SpecError(f"{ASSETS_FILE}: assets: no asset named {shown(name)}; "
                        f"known assets: {', '.join(specs)}") from None


def asset_inputs(name: str, root_or_specs: Path | str | Mapping[str, AssetSpec]) -> dict[str, str]:
    """The assets ``name`` is built from, as ``{role: asset name}`` (e.g. tokenizer, data)."""
    specs = _specs(root_or_specs)
    spec = get_spec(specs, name)
    kind = kinds()[spec.kind]
    return {role: getattr(spec, role) for role in kind.input_kinds
            if getattr(spec, role) is not None}


def definition(spec: AssetSpec) -> dict[str, Any]:
    """The fields that say what the asset is (not where it comes from, nor its description)."""
    out = {}
    for f in dataclasses.fields(spec):
        if f.metadata.get(NOT_DEFINITION, True) and f.name != "name":
            value = getattr(spec, f.name)
            out[f.name] = list(value) if isinstance(value, tuple) else value
    return out


def effective_spec(spec: AssetSpec, weights: str | None) -> AssetSpec:
    """The spec with a ``weights`` override applied (models only; others are unchanged)."""
    if weights and hasattr(spec, "weights") and getattr(spec, "weights") != weights:
        return dataclasses.replace(spec, weights=weights)
    return spec


def asset_fingerprint(name: str, root_or_specs: Path | str | Mapping[str, AssetSpec], *,
                      weights: str | None = None) -> str:
    """A hash of what the asset is: its definition, its kind's version and its inputs'.

    A changed definition means a different fingerprint, and ``materialize`` rebuilds.
    Snakemake can take it as a rule ``params`` value so that such a change reruns the rule.
    """
    specs = _specs(root_or_specs)
    spec = effective_spec(get_spec(specs, name), weights)
    kind = kinds()[spec.kind]
    data = definition(spec)
    data["kind_version"] = kind.version
    if kind.definition_extra is not None:
        data["extra"] = dict(kind.definition_extra(spec))
    data["inputs"] = {role: asset_fingerprint(dep, specs)
                      for role, dep in asset_inputs(name, specs).items()}
    blob = json.dumps(data, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]
