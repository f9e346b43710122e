"""Models, tokenizers and data sets from the Hugging Face Hub, at a pinned revision.

Only the files a run needs are fetched (glob patterns, default: safetensors, config, tokenizer),
each checked against the Hub's own record (size, and sha256 for LFS files or the git blob id
for small ones) before the asset is moved into place. ``HF_TOKEN`` is read from the
environment, only here, and handed to huggingface_hub in-process: it never appears in argv,
specs, ASSET.json or messages. Without network the error says so and names the ways out:
``local_path`` (a copy made elsewhere) or, for models, ``weights: random``.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path
from typing import Any, Iterable, Literal, Mapping

from hopperlab.core.errors import AssetError, NoNetworkError
from hopperlab.assets.manifest import git_blob_sha1, list_files, read_manifest, sha256_file
from hopperlab.assets.registry import (
    NOT_DEFINITION,
    REVISION_RE,
    AssetKind,
    AssetSpec,
    BuildContext,
    RepairContext,
    register_kind,
)
from hopperlab.core.errors import SpecError
from hopperlab.core.progress import track
from hopperlab.core.secrets import scrub

log = logging.getLogger("hopperlab.assets")

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json",
                   "special_tokens_map.json")
MODEL_FILES = ("*.safetensors", "model.safetensors.index.json", "config.json",
               "generation_config.json") + TOKENIZER_FILES
DATASET_FILES = ("*.jsonl", "*.parquet", "*.json", "*.csv")
REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
#: exception class names (anywhere in the cause chain) that mean "the Hub cannot be reached"
_NETWORK_ERRORS = frozenset({
    "LocalEntryNotFoundError", "OfflineModeIsEnabled", "ConnectError", "ConnectionError",
    "ConnectTimeout", "ReadTimeout", "TimeoutException", "Timeout", "NewConnectionError",
    "NameResolutionError", "MaxRetryError", "ProxyError", "gaierror", "TransportError",
})


# --------------------------------------------------------------------------- specs
@dataclass(frozen=True, kw_only=True)
class HubSpec(AssetSpec):
    """A Hub repository at a pinned commit; ``files`` are glob patterns of what to fetch."""

    repo: str
    revision: str | None = None
    files: tuple[str, ...] = ()
    #: a folder that already holds these files (made on a machine with network): no download
    local_path: str | None = field(default=None, metadata={NOT_DEFINITION: False})

    repo_type = "model"


@dataclass(frozen=True, kw_only=True)
class HubModelSpec(HubSpec):
    files: tuple[str, ...] = MODEL_FILES
    #: the model's config.json kept in this repository (needed for ``weights: random``)
    architecture: str | None = None
    weights: Literal["pretrained", "random"] = "pretrained"


@dataclass(frozen=True, kw_only=True)
class HubTokenizerSpec(HubSpec):
    files: tuple[str, ...] = TOKENIZER_FILES


@dataclass(frozen=True, kw_only=True)
class HubDatasetSpec(HubSpec):
    files: tuple[str, ...] = DATASET_FILES

    repo_type = "dataset"


def repo_path(spec: AssetSpec, path: str) -> Path:
    """A path of the spec relative to the repository root (or absolute)."""
    p = Path(path).expanduser()
    return p if p.is_absolute() else Path(spec.root) / p


def _validate(spec: HubSpec, specs: Mapping[str, AssetSpec]) -> None:
    where = spec.where
    if not REPO_RE.match(spec.repo):
        raise SpecError(f"{where}.repo: expected a Hub repository id 'owner/name', "
                        f"got {spec.repo!r}")
    if spec.revision is None:
        raise SpecError(
            f"{where}.revision: required: the 40-hex commit id of {spec.repo} to fetch (the "
            f"Hub lists them under 'Files and versions' -> 'History'); a pinned commit keeps "
            f"every run on the same files")
    if not REVISION_RE.match(spec.revision):
        raise SpecError(
            f"{where}.revision: expected a 40-hex commit id of {spec.repo}, got "
            f"{spec.revision!r}: a branch or tag name (like 'main') moves, a commit does not")
    if not spec.files:
        raise SpecError(f"{where}.files: expected at least one file name or glob pattern")
    if isinstance(spec, HubModelSpec):
        if spec.architecture is not None and not repo_path(spec, spec.architecture).is_file():
            raise SpecError(f"{where}.architecture: no such file {spec.architecture!r} in the "
                            f"repository (a config.json with the model's architecture)")
        if spec.weights == "random" and spec.architecture is None:
            raise SpecError(f"{where}.architecture: required with weights: random (a "
                            f"config.json with the model's architecture, kept in the repository)")


def _definition_extra(spec: HubSpec) -> dict[str, Any]:
    if isinstance(spec, HubModelSpec) and spec.weights == "random" and spec.architecture:
        return {"architecture_sha256": sha256_file(repo_path(spec, spec.architecture))}
    return {}


def _produces(spec: HubSpec) -> tuple[str, ...]:
    if isinstance(spec, HubModelSpec):
        return ("config.json",) if spec.weights == "random" else ("config.json", "*.safetensors")
    if isinstance(spec, HubTokenizerSpec):
        return ("tokenizer.[jm]*",)  # tokenizer.json or tokenizer.model
    return ()


# --------------------------------------------------------------------------- the token
def hf_token() -> str | Literal[False]:
    """``HF_TOKEN`` from the environment, or False (never a token file, never an argument)."""
    return os.environ.get("HF_TOKEN") or False


# --------------------------------------------------------------------------- errors
def _chain(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    while exc is not None and exc not in out:
        out.append(exc)
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return out


def _names(exc: BaseException) -> set[str]:
    return {cls.__name__ for e in _chain(exc) for cls in type(e).__mro__}


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".strip()


def _unavailable_status(exc: BaseException) -> int | None:
    """The HTTP status of a Hub answer meaning "not now" (429, 5xx) in the chain, if any."""
    for e in _chain(exc):
        status = getattr(getattr(e, "response", None), "status_code", None)
        if isinstance(status, int) and (status == 429 or 500 <= status <= 599):
            return status
    return None


def no_network_message(spec: HubSpec, exc: BaseException | None = None) -> str:
    """What to say when the Hub cannot be reached: one line, the reason and the ways out."""
    why = f" ({_first_line(exc)[:160]})" if exc is not None else ""
    status = _unavailable_status(exc) if exc is not None else None
    if status is None:
        head = (f"cannot reach the Hugging Face Hub to fetch {spec.repo} at revision "
                f"{spec.revision}{why}: no network access to the Hub (or HF_HUB_OFFLINE is set)")
    else:
        head = (f"the Hugging Face Hub answered {status} when asked for {spec.repo} at revision "
                f"{spec.revision}{why}: try again later, or go on without it")
    return scrub(f"asset {spec.name!r}: {head}; ways out: {'; '.join(ways_out(spec))}")


def ways_out(spec: HubSpec) -> list[str]:
    """How to go on without the Hub: a stand-in asset, a local copy, or (models) random
    weights."""
    where = f"assets.{spec.name} in {spec.source}"
    dataset = " --repo-type dataset" if spec.repo_type == "dataset" else ""
    lines = [f"a stand-in: `--config asset_substitutes={spec.name}:<another asset>`",
             f"a copy: `local_path: /path/to/folder` under {where} (made where the Hub answers: "
             f"`hf download {spec.repo}{dataset} --revision <revision> --local-dir DIR`)"]
    if isinstance(spec, HubModelSpec):
        arch = spec.architecture or "a config.json of the model's architecture kept in the repo"
        lines.append(f"random weights: `weights: random` under assets.{spec.name} (built from "
                     f"{arch} alone)")
    return lines


def needs_hub(spec: AssetSpec) -> bool:
    """Whether building ``spec`` downloads from the Hub (no local copy, no random weights)."""
    if not isinstance(spec, HubSpec) or spec.local_path:
        return False
    return not (isinstance(spec, HubModelSpec) and spec.weights == "random")


def hub_unreachable(timeout_s: float = 5.0) -> str | None:
    """Why the Hub cannot be reached from here now (HF_HUB_OFFLINE, no answer), or None."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return "HF_HUB_OFFLINE is set"
    import urllib.error
    import urllib.request

    endpoint = os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
    try:
        urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"),
                               timeout=timeout_s).close()
    except urllib.error.HTTPError:
        return None  # it answered
    except (OSError, ValueError) as exc:
        return f"{endpoint} did not answer ({type(exc).__name__})"
    return None


def translate_error(exc: BaseException, spec: HubSpec, what: str) -> AssetError:
    """A Hub exception as an AssetError that says what happened and what to do."""
    names = _names(exc)
    head = f"asset {spec.name!r}: {what} {spec.repo} at revision {spec.revision}"
    if "GatedRepoError" in names:
        token = ("HF_TOKEN is not set in the environment" if not hf_token() else
                 "the account of HF_TOKEN has not been granted access")
        msg = (f"{head}: the repository is gated and {token}. Accept its license on the Hub "
               f"with your account, then `export HF_TOKEN=...` (a read token) before fetching.")
    elif "RevisionNotFoundError" in names:
        msg = (f"{head}: the Hub has no such revision; check assets.{spec.name}.revision in "
               f"{spec.source}")
    elif "RepositoryNotFoundError" in names:
        msg = (f"{head}: repository not found, or it needs a token (HF_TOKEN is "
               f"{'set' if hf_token() else 'not set'}); check assets.{spec.name}.repo in "
               f"{spec.source}")
    elif names & _NETWORK_ERRORS or _unavailable_status(exc) is not None:
        return NoNetworkError(no_network_message(spec, exc))
    elif "EntryNotFoundError" in names:
        msg = f"{head}: a file is not in the repository ({_first_line(exc)})"
    else:
        msg = f"{head}: failed ({_first_line(exc)})"
    return AssetError(scrub(msg))


# --------------------------------------------------------------------------- the Hub
@dataclass(frozen=True)
class RemoteFile:
    path: str
    size: int
    sha256: str | None  # LFS files
    git_blob: str | None  # files stored in git


def remote_files(spec: HubSpec, token: str | Literal[False]) -> list[RemoteFile]:
    """Every file of the repository at the pinned revision, with the Hub's checksums."""
    import huggingface_hub

    try:
        entries = list(huggingface_hub.HfApi().list_repo_tree(
            spec.repo, recursive=True, revision=spec.revision, repo_type=spec.repo_type,
            token=token))
    except Exception as exc:  # noqa: BLE001 - every Hub failure is translated
        raise translate_error(exc, spec, "listing") from exc
    out = []
    for entry in entries:
        size = getattr(entry, "size", None)
        if size is None:  # a folder
            continue
        lfs = getattr(entry, "lfs", None)
        sha = (lfs.get("sha256") if isinstance(lfs, Mapping) else getattr(lfs, "sha256", None)) \
            if lfs else None
        out.append(RemoteFile(entry.path, int(size), sha,
                              None if lfs else getattr(entry, "blob_id", None)))
    return out


def _wanted(spec: HubSpec, paths: Iterable[str]) -> list[str]:
    return sorted(p for p in paths if any(fnmatch(p, pat) for pat in spec.files)
                  and not p.startswith(".cache/"))


def download_file(spec: HubSpec, rel: str, dest: Path, token: str | Literal[False]) -> Path:
    """Download one file of the repository to ``dest/rel``."""
    import huggingface_hub

    try:
        got = Path(huggingface_hub.hf_hub_download(
            spec.repo, rel, repo_type=spec.repo_type, revision=spec.revision,
            local_dir=str(dest), token=token))
    except Exception as exc:  # noqa: BLE001
        raise translate_error(exc, spec, f"downloading {rel} of") from exc
    target = dest / rel
    if got.resolve() != target.resolve():  # an older huggingface_hub may answer a cache path
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(got, target)
    return target


def _link_or_copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    real = os.path.realpath(src)
    try:
        os.link(real, dst)
    except OSError:
        shutil.copyfile(real, dst)


# --------------------------------------------------------------------------- build, repair
def _build(spec: HubSpec, ctx: BuildContext) -> dict[str, Any]:
    source: dict[str, Any] = {"repo": spec.repo, "revision": spec.revision,
                              "repo_type": spec.repo_type}
    if isinstance(spec, HubModelSpec):
        source["weights"] = spec.weights
        if spec.weights == "random":
            assert spec.architecture is not None
            _clear(ctx.out)
            shutil.copyfile(repo_path(spec, spec.architecture), ctx.out / "config.json")
            log.info("%s: weights: random: architecture only (%s), nothing downloaded",
                     spec.name, spec.architecture)
            return {**source, "from": "architecture", "architecture": spec.architecture}
    if spec.local_path:
        _clear(ctx.out)  # a partial download of an earlier attempt is not part of this copy
        return {**source, **_copy_local(spec, ctx)}
    token = hf_token()
    remote = {f.path: f for f in remote_files(spec, token)}
    wanted = _wanted(spec, remote)
    if not wanted:
        raise AssetError(f"asset {spec.name!r}: no file of {spec.repo} at {spec.revision} "
                         f"matches files: {list(spec.files)} (the repository has: "
                         f"{', '.join(sorted(remote)[:20])})")
    old = _previous_hashes(ctx.previous)
    fetched = reused = 0
    for rel in track(wanted, f"{spec.name}: {spec.repo}"):
        f = remote[rel]
        dest = ctx.out / rel
        ctx.expect(rel, size=f.size, sha256=f.sha256, git_blob=f.git_blob)
        if dest.is_file() and _matches(dest, f):
            continue  # downloaded whole by an earlier, interrupted fetch
        dest.unlink(missing_ok=True)
        if f.sha256 and old.get(rel) == f.sha256 and ctx.previous is not None:
            _link_or_copy(ctx.previous / rel, dest)
            reused += 1
            continue
        download_file(spec, rel, ctx.out, token)
        fetched += 1
    shutil.rmtree(ctx.out / ".cache", ignore_errors=True)  # huggingface_hub's bookkeeping
    log.info("%s: %d file(s) downloaded, %d reused from the previous version", spec.name,
             fetched, reused)
    return {**source, "from": "hub", "files": len(wanted),
            "bytes": sum(remote[r].size for r in wanted)}


def _matches(path: Path, f: RemoteFile) -> bool:
    if path.stat().st_size != f.size:
        return False
    if f.sha256:
        return sha256_file(path) == f.sha256
    return f.git_blob is None or git_blob_sha1(path) == f.git_blob


def _clear(folder: Path) -> None:
    for path in folder.iterdir():
        shutil.rmtree(path) if path.is_dir() else path.unlink()


def _previous_hashes(previous: Path | None) -> dict[str, str]:
    if previous is None:
        return {}
    try:
        return read_manifest(previous) or {}
    except ValueError:
        return {}


def _local_source(spec: HubSpec) -> Path:
    assert spec.local_path is not None
    src = repo_path(spec, spec.local_path)
    if not src.is_dir():
        raise AssetError(f"{spec.where}.local_path: {src} is not a folder on this machine")
    return src


def _copy_local(spec: HubSpec, ctx: BuildContext) -> dict[str, Any]:
    src = _local_source(spec)
    chosen = _wanted(spec, list_files(src))
    if not chosen:
        raise AssetError(f"{spec.where}.local_path: no file in {src} matches files: "
                         f"{list(spec.files)}")
    for rel in chosen:
        _link_or_copy(src / rel, ctx.out / rel)
    log.info("%s: %d file(s) taken from local_path %s", spec.name, len(chosen), src)
    return {"from": "local_path", "local_path": str(src), "files": len(chosen)}


def _repair(spec: HubSpec, ctx: RepairContext) -> None:
    """Fetch the damaged files again (from the Hub, local_path or architecture file)."""
    token = hf_token()
    for rel in ctx.damaged:
        if isinstance(spec, HubModelSpec) and spec.weights == "random":
            got = ctx.tmp / rel
            shutil.copyfile(repo_path(spec, spec.architecture or ""), got)
        elif spec.local_path:
            got = ctx.tmp / rel
            _link_or_copy(_local_source(spec) / rel, got)
        else:
            log.info("%s: downloading %s again", spec.name, rel)
            got = download_file(spec, rel, ctx.tmp, token)
        if sha256_file(got) != ctx.reference[rel]:
            raise AssetError(f"{rel}: the file fetched again does not match the manifest "
                             f"either; the source differs from when the asset was made")
        (ctx.folder / rel).parent.mkdir(parents=True, exist_ok=True)
        os.replace(got, ctx.folder / rel)


for _name, _spec, _summary in (
        ("hf-model", HubModelSpec, "a causal LM from the Hugging Face Hub (or random weights)"),
        ("hf-tokenizer", HubTokenizerSpec, "a tokenizer from the Hugging Face Hub"),
        ("hf-dataset", HubDatasetSpec, "a data set from the Hugging Face Hub")):
    register_kind(AssetKind(
        name=_name, spec=_spec, build=_build, produces=_produces, repair=_repair,
        validate=_validate, definition_extra=_definition_extra, resumable=True,
        summary=_summary))
