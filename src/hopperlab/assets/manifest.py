"""Checksums of an asset folder: ``MANIFEST.sha256`` and its verification.

The manifest is the proof that an asset is complete: it is written last, after every file is in
place and checked, so a folder without one (an interrupted fetch or build) never passes for
complete. It uses the ``sha256sum`` format (``<hex>  <path>``), so ``sha256sum -c`` works too.
"""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterable, Mapping

from hopperlab.core.progress import progress_bar
from hopperlab.core.rundir import write_text_atomic
from hopperlab.core.stats import GIB

MANIFEST = "MANIFEST.sha256"
#: what the asset is and where it came from (kind, definition, fingerprint, source, file sizes)
INFO = "ASSET.json"
#: files of an asset folder that the manifest does not list (itself)
UNLISTED = frozenset({MANIFEST})
_CHUNK = 8 << 20


def sha256_file(path: Path, progress: Callable[[int], None] | None = None) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
            if progress:
                progress(len(chunk))
    return h.hexdigest()


def git_blob_sha1(path: Path) -> str:
    """The git object id of a file (what the Hub reports for files not stored in LFS)."""
    h = hashlib.sha1()
    h.update(f"blob {path.stat().st_size}\0".encode())
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def list_files(folder: Path) -> list[str]:
    """Every regular file under ``folder`` as a POSIX relative path, sorted, manifest excluded."""
    folder = Path(folder)
    out = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames.sort()
        for name in filenames:
            rel = (Path(dirpath) / name).relative_to(folder).as_posix()
            if rel not in UNLISTED:
                out.append(rel)
    return sorted(out)


def hash_files(folder: Path, paths: Iterable[str], *, desc: str = "") -> dict[str, str]:
    """sha256 of each path (threads: hashlib releases the GIL), with a progress bar past 1 GiB."""
    folder = Path(folder)
    paths = list(paths)
    total = sum((folder / p).stat().st_size for p in paths)
    workers = max(1, min(8, os.cpu_count() or 1, len(paths)))
    with progress_bar(f"sha256 {desc}".strip(), total, show=total > GIB, unit="B") as advance, \
            ThreadPoolExecutor(workers) as pool:
        digests = pool.map(lambda p: sha256_file(folder / p, advance), paths)
        return dict(zip(paths, digests))


def format_manifest(hashes: Mapping[str, str]) -> str:
    for path in hashes:
        if "\n" in path or "\\" in path:
            raise ValueError(f"file name not allowed in an asset: {path!r}")
    return "".join(f"{hashes[p]}  {p}\n" for p in sorted(hashes))


def write_manifest(folder: Path, hashes: Mapping[str, str]) -> Path:
    path = Path(folder) / MANIFEST
    write_text_atomic(path, format_manifest(hashes))
    return path


def read_manifest(folder: Path) -> dict[str, str] | None:
    """The manifest's ``path -> sha256``; None when there is none; ValueError when unreadable."""
    path = Path(folder) / MANIFEST
    if not path.exists():
        return None
    out = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        digest, sep, rel = line.partition("  ")
        if not sep or len(digest) != 64 or not rel:
            raise ValueError(f"{MANIFEST}: line {n} is not '<sha256>  <path>'")
        out[rel] = digest
    return out


def find_damage(folder: Path, reference: Mapping[str, str], *,
                sizes: Mapping[str, int] | None = None, deep: bool = True) -> dict[str, str]:
    """``path -> what is wrong`` for files of ``folder`` against ``path -> sha256``.

    Missing, partial (size differs from ``sizes``), corrupted (hash differs) and unlisted files.
    ``deep`` hashes every file; otherwise only presence and (when known) sizes are checked.
    """
    folder = Path(folder)
    damage: dict[str, str] = {}
    present = set(list_files(folder))
    for rel in sorted(present - set(reference)):
        damage[rel] = f"not listed in {MANIFEST} (unexpected file)"
    to_hash = []
    for rel in sorted(reference):
        if rel not in present:
            damage[rel] = "missing"
            continue
        size = (folder / rel).stat().st_size
        if sizes and rel in sizes and size != sizes[rel]:
            damage[rel] = f"{size} bytes, expected {sizes[rel]} (partial or corrupted)"
            continue
        to_hash.append(rel)
    if deep and to_hash:
        for rel, digest in hash_files(folder, to_hash, desc=folder.name).items():
            if digest != reference[rel]:
                damage[rel] = (f"sha256 {digest[:12]}… does not match the manifest's "
                               f"{reference[rel][:12]}… (corrupted)")
    return dict(sorted(damage.items()))


def describe(damage: Mapping[str, str]) -> list[str]:
    return [f"{rel}: {why}" for rel, why in damage.items()]


def verify(path: Path, *, deep: bool = True) -> list[str]:
    """Problems of the asset folder ``path`` (empty list: complete and intact)."""
    path = Path(path)
    if not path.is_dir():
        return [f"{path}: no such asset folder (not fetched or built yet)"]
    try:
        reference = read_manifest(path)
    except ValueError as exc:
        return [str(exc)]
    if reference is None:
        return [f"{MANIFEST}: missing: the asset is incomplete (an interrupted fetch or build)"]
    return describe(find_damage(path, reference, sizes=_recorded_sizes(path), deep=deep))


def _recorded_sizes(path: Path) -> dict[str, int] | None:
    import json

    try:
        files = json.loads((path / INFO).read_text()).get("files", {})
        return {rel: int(v["size"]) for rel, v in files.items()}
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None
