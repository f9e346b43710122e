"""Fetch or build one asset into ``<assets_dir>/<name>/``, once, and keep it whole.

The files land in a temporary folder next to the asset, are checked (against the source's
checksums where it gives them, and file formats), get ``ASSET.json`` and then
``MANIFEST.sha256`` (last), and the folder is moved into place in one rename. A later call
verifies: a complete asset whose definition has not changed is left alone, a damaged one is
repaired (damaged files re-fetched, or the asset rebuilt), a changed definition is rebuilt.
One lock per asset keeps concurrent jobs from building the same asset twice.
"""

from __future__ import annotations

import fcntl
import logging
import os
import secrets
import shutil
import sys
from contextlib import contextmanager
from fnmatch import fnmatch
from pathlib import Path
from typing import Any, Iterator, Mapping

from hopperlab.core.errors import AssetError
from hopperlab.assets.formats import check_tree
from hopperlab.assets.manifest import (
    INFO,
    MANIFEST,
    describe,
    find_damage,
    git_blob_sha1,
    hash_files,
    list_files,
    read_manifest,
    sha256_file,
    write_manifest,
)
from hopperlab.assets.registry import (
    ASSETS_FILE,
    AssetKind,
    AssetSpec,
    BuildContext,
    RepairContext,
    asset_fingerprint,
    asset_inputs,
    definition,
    effective_spec,
    get_spec,
    kinds,
    load_assets,
    load_scales,
)
from hopperlab.core.rundir import read_json, utc_now, write_json_atomic
from hopperlab.core.errors import SpecError

log = logging.getLogger("hopperlab.assets")

DEFAULT_ASSETS_DIR = "results/assets"
TMP_DIR = ".tmp"
LOCK_DIR = ".locks"


# --------------------------------------------------------------------------- paths
def assets_root(root: Path | str, assets_dir: Path | str) -> Path:
    path = Path(assets_dir)
    return path if path.is_absolute() else Path(root) / path


def asset_dir(root: Path | str, assets_dir: Path | str, name: str) -> Path:
    """Where asset ``name`` lives: ``<root>/<assets_dir>/<name>`` (assets_dir may be absolute)."""
    return assets_root(root, assets_dir) / name


def asset_outputs(name: str, assets_dir: Path | str = DEFAULT_ASSETS_DIR) -> str:
    """The file Snakemake should watch for asset ``name``: its manifest, written last."""
    return f"{Path(assets_dir).as_posix()}/{name}/{MANIFEST}"


def read_info(folder: Path) -> dict[str, Any] | None:
    """The asset's ``ASSET.json`` (kind, definition, fingerprint, source, weights), or None."""
    try:
        info = read_json(Path(folder) / INFO)
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


@contextmanager
def _lock(adir: Path, name: str) -> Iterator[None]:
    (adir / LOCK_DIR).mkdir(parents=True, exist_ok=True)
    with open(adir / LOCK_DIR / f"{name}.lock", "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("%s: waiting for another process that fetches or builds it", name)
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


# --------------------------------------------------------------------------- the entry point
def materialize(name: str, root: Path | str, assets_dir: Path | str = DEFAULT_ASSETS_DIR, *,
                scale: str | None = None, weights: str | None = None,
                specs: Mapping[str, AssetSpec] | None = None) -> Path:
    """Fetch or build asset ``name`` (and the assets it is built from); return its folder.

    Idempotent: a complete asset is verified (every file hashed) and left alone; a damaged one
    is repaired; one whose definition changed is rebuilt. ``scale``, when given, refuses an asset
    that ``scales.<scale>`` of configs/assets.yaml does not list. ``weights`` overrides a model's
    ``weights`` field (``random``: built from its architecture alone, nothing downloaded).
    """
    root = Path(root).resolve()
    specs = specs if specs is not None else load_assets(root)
    get_spec(specs, name)
    if scale is not None:
        scales = load_scales(root)
        if scale not in scales:
            raise SpecError(f"{ASSETS_FILE}: scales: no scale {scale!r}; "
                            f"known scales: {', '.join(scales)}")
        if name not in scales[scale]:
            raise SpecError(f"{ASSETS_FILE}: scales.{scale}: does not list asset {name!r} "
                            f"(it lists: {', '.join(scales[scale])})")
    if weights is not None and weights not in ("pretrained", "random"):
        raise SpecError(f"weights: expected pretrained or random, got {weights!r}")
    return _materialize(name, root, assets_root(root, assets_dir), specs, weights, deep=True)


def _materialize(name: str, root: Path, adir: Path, specs: Mapping[str, AssetSpec],
                 weights: str | None, *, deep: bool) -> Path:
    spec = effective_spec(get_spec(specs, name), weights)
    kind = kinds()[spec.kind]
    # inputs are checked quickly (presence, sizes): a full hash of a large input on every
    # dependent build would cost minutes; `verify` or fetching the input itself hashes it all
    inputs = {role: _materialize(dep, root, adir, specs, None, deep=False)
              for role, dep in asset_inputs(name, specs).items()}
    fingerprint = asset_fingerprint(name, specs, weights=weights)
    final = adir / name
    with _lock(adir, name):
        _clean_temps(adir, name, keep=_partial_name(name, fingerprint) if kind.resumable else None)
        if _settle_existing(spec, kind, final, adir, fingerprint, deep=deep):
            return final
        _build(spec, kind, root, adir, final, inputs, fingerprint, weights)
    return final


# --------------------------------------------------------------------------- existing assets
def _settle_existing(spec: AssetSpec, kind: AssetKind, final: Path, adir: Path,
                     fingerprint: str, *, deep: bool) -> bool:
    """True when ``final`` is (now) complete: intact, or repaired in place."""
    if not final.is_dir():
        return False
    info = read_info(final)
    if info is None or info.get("fingerprint") != fingerprint:
        why = "has no readable ASSET.json" if info is None else "has a changed definition"
        log.info("%s: %s: rebuilding", spec.name, why)
        return False
    try:
        manifest = read_manifest(final)
    except ValueError:
        manifest = None
    reference, sizes = _reference(final, info, manifest)
    damage = find_damage(final, reference, sizes=sizes, deep=deep)
    if not damage:
        if manifest != reference:
            write_manifest(final, reference)  # the manifest was lost (e.g. removed by Snakemake)
        log.info("%s: complete (%d files%s)", spec.name, len(reference),
                 ", every one hashed" if deep else "")
        return True
    log.warning("%s: damaged:\n  %s", spec.name, "\n  ".join(describe(damage)))
    if kind.repair is None or INFO in damage:
        return False
    _repair(spec, kind, final, adir, reference, damage)
    return True


def _reference(final: Path, info: Mapping[str, Any],
               manifest: dict[str, str] | None) -> tuple[dict[str, str], dict[str, int]]:
    files = info.get("files") or {}
    sizes = {rel: int(v["size"]) for rel, v in files.items()}
    if manifest is not None:
        return manifest, sizes
    reference = {rel: v["sha256"] for rel, v in files.items()}
    reference[INFO] = sha256_file(final / INFO)  # it parsed and its fingerprint matched
    return reference, sizes


def _repair(spec: AssetSpec, kind: AssetKind, final: Path, adir: Path,
            reference: dict[str, str], damage: Mapping[str, str]) -> None:
    for rel, why in damage.items():
        if rel not in reference:  # unlisted: not part of the asset
            log.warning("%s: removing %s (%s)", spec.name, rel, why)
            (final / rel).unlink()
    damaged = [rel for rel in damage if rel in reference]
    if damaged:
        tmp = _new_temp(adir, spec.name, "repair")
        try:
            assert kind.repair is not None
            kind.repair(spec, RepairContext(spec.name, final, tmp, damaged, reference))
        except AssetError as exc:
            raise type(exc)(f"asset {spec.name!r} is damaged ({'; '.join(describe(damage))}) "
                            f"and could not be repaired:\n{exc}") from exc
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        left = find_damage(final, {rel: reference[rel] for rel in damaged}, deep=True)
        left = {rel: why for rel, why in left.items() if rel in damaged}
        if left:
            raise AssetError(f"asset {spec.name!r}: repair failed, still damaged:\n  "
                             + "\n  ".join(describe(left)))
    write_manifest(final, reference)
    log.info("%s: repaired %d file(s): %s", spec.name, len(damage), ", ".join(damage))


# --------------------------------------------------------------------------- building
# temporary folders are named "<asset>@<what>...": "@" is not allowed in asset names, so the
# leftovers of one asset are never taken for another's
def _partial_name(name: str, fingerprint: str) -> str:
    return f"{name}@{fingerprint}.partial"


def _new_temp(adir: Path, name: str, what: str) -> Path:
    path = adir / TMP_DIR / f"{name}@{what}.{os.getpid()}.{secrets.token_hex(4)}"
    path.mkdir(parents=True)
    return path


def _clean_temps(adir: Path, name: str, keep: str | None) -> None:
    """Remove what earlier, interrupted runs left for ``name`` (we hold its lock)."""
    tmp = adir / TMP_DIR
    if not tmp.is_dir():
        return
    for path in tmp.iterdir():
        if path.name.startswith(f"{name}@") and path.name != keep:
            log.info("%s: removing leftovers of an interrupted run: %s", name, path.name)
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink()


def _build(spec: AssetSpec, kind: AssetKind, root: Path, adir: Path, final: Path,
           inputs: dict[str, Path], fingerprint: str, weights: str | None) -> None:
    if kind.resumable:
        tmp = adir / TMP_DIR / _partial_name(spec.name, fingerprint)
        tmp.mkdir(parents=True, exist_ok=True)
    else:
        tmp = _new_temp(adir, spec.name, "build")
    ctx = BuildContext(name=spec.name, out=tmp, root=root, inputs=inputs, weights=weights,
                       previous=final if final.is_dir() else None)
    ok = False
    try:
        log.info("%s: building (%s)", spec.name, spec.kind)
        provenance = dict(kind.build(spec, ctx) or {})
        files = list_files(tmp)
        for reserved in (INFO, MANIFEST):
            if reserved in files:
                raise AssetError(f"asset {spec.name!r}: the {spec.kind} build wrote {reserved}, "
                                 f"a name the asset store owns")
        if not files:
            raise AssetError(f"asset {spec.name!r}: the {spec.kind} build produced no file")
        for rel in files:  # readable by colleagues, whatever umask or mkstemp made
            mode = (tmp / rel).stat().st_mode
            if mode & 0o044 != 0o044:
                (tmp / rel).chmod(mode | 0o044)
        hashes = hash_files(tmp, files, desc=spec.name)
        problems = (_check_expected(tmp, ctx.expected, hashes) + _check_produces(spec, kind, files)
                    + check_tree(tmp, files))
        if problems:
            _drop_failed(tmp, problems, ctx.expected)
            raise AssetError(f"asset {spec.name!r}: the new files failed verification:\n  "
                             + "\n  ".join(problems))
        info = {
            "name": spec.name,
            "kind": spec.kind,
            "fingerprint": fingerprint,
            "definition": definition(spec),
            "inputs": {role: {"name": path.name, "fingerprint": (read_info(path) or {}).get(
                "fingerprint")} for role, path in inputs.items()},
            "source": provenance,
            "weights": provenance.get("weights"),
            "built_at": utc_now(),
            "built_with": _versions(),
            "files": {rel: {"sha256": hashes[rel], "size": (tmp / rel).stat().st_size}
                      for rel in files},
        }
        write_json_atomic(tmp / INFO, info)
        hashes[INFO] = sha256_file(tmp / INFO)
        write_manifest(tmp, hashes)  # last: from here on the folder is a complete asset
        _swap_into_place(tmp, final, adir)
        ok = True
        log.info("%s: ready in %s (%d files)", spec.name, final, len(hashes))
    finally:
        if not ok and not kind.resumable:
            shutil.rmtree(tmp, ignore_errors=True)


def _check_expected(tmp: Path, expected: Mapping[str, Mapping[str, Any]],
                    hashes: Mapping[str, str]) -> list[str]:
    problems = []
    for rel, checks in sorted(expected.items()):
        if rel not in hashes:
            problems.append(f"{rel}: missing")
            continue
        size = (tmp / rel).stat().st_size
        if "size" in checks and size != checks["size"]:
            problems.append(f"{rel}: {size} bytes, the source says {checks['size']} (partial)")
        elif "sha256" in checks and hashes[rel] != checks["sha256"]:
            problems.append(f"{rel}: sha256 differs from the source's (corrupted)")
        elif "git_blob" in checks and git_blob_sha1(tmp / rel) != checks["git_blob"]:
            problems.append(f"{rel}: git blob id differs from the source's (corrupted)")
    return problems


def _check_produces(spec: AssetSpec, kind: AssetKind, files: list[str]) -> list[str]:
    return [f"{pattern}: no such file was produced (the {spec.kind} kind must produce it)"
            for pattern in kind.produces(spec) if not any(fnmatch(f, pattern) for f in files)]


def _drop_failed(tmp: Path, problems: list[str], expected: Mapping[str, Any]) -> None:
    """Delete files that failed, so that a resumed fetch downloads them again."""
    for line in problems:
        rel = line.split(": ", 1)[0]
        if rel in expected and (tmp / rel).is_file():
            (tmp / rel).unlink()


def _swap_into_place(tmp: Path, final: Path, adir: Path) -> None:
    if final.exists():
        old = adir / TMP_DIR / f"{final.name}@old.{os.getpid()}.{secrets.token_hex(4)}"
        os.rename(final, old)
        os.rename(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, final)
    final.chmod(0o755)


def _versions() -> dict[str, str]:
    out = {"python": sys.version.split()[0]}
    for mod in ("torch", "transformers", "tokenizers", "huggingface_hub"):
        if mod in sys.modules:
            out[mod] = str(getattr(sys.modules[mod], "__version__", "?"))
    return out
