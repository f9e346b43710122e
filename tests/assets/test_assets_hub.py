"""The Hugging Face download path, offline: huggingface_hub's calls answered by a local fake.

Checked: temporary folder, verification against the Hub's checksums, one move into place,
manifest, repair of a corrupted or missing file, resume of an interrupted fetch, the no-network
and gated messages, local_path, weights: random, and that HF_TOKEN is passed in-process but
never written to a file, a log or a message.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import huggingface_hub
import pytest

from hopperlab.assets import (
    MANIFEST,
    AssetError,
    NoNetworkError,
    load_assets,
    materialize,
    read_info,
    verify,
)
from hopperlab.assets.hub import no_network_message
from hopperlab.assets.store import TMP_DIR

ROOT = Path(__file__).resolve().parents[2]
SECRET = "hf_FAKEtokenNeverWritten0123456789"


def _safetensors(nbytes: int, fill: int) -> bytes:
    header = json.dumps({"w": {"dtype": "F32", "shape": [nbytes // 4],
                               "data_offsets": [0, nbytes]}}).encode()
    return struct.pack("<Q", len(header)) + header + bytes([fill]) * nbytes


def _git_blob(data: bytes) -> str:
    return hashlib.sha1(f"blob {len(data)}\0".encode() + data).hexdigest()


class FakeHub:
    """Stands in for HfApi.list_repo_tree and hf_hub_download, writing files like they do."""

    def __init__(self) -> None:
        self.files = {
            "config.json": json.dumps({"model_type": "llama"}).encode(),
            "model-00001-of-00002.safetensors": _safetensors(4096, 1),
            "model-00002-of-00002.safetensors": _safetensors(2048, 2),
            "model.safetensors.index.json": json.dumps({"weight_map": {
                "a": "model-00001-of-00002.safetensors",
                "b": "model-00002-of-00002.safetensors"}}).encode(),
            "tokenizer.json": b'{"version": "1.0"}',
            "tokenizer_config.json": b'{"eos_token": "</s>"}',
            "README.md": b"# not wanted\n",
            "pytorch_model-00001-of-00002.bin": b"not wanted",
            "original/params.json": b"{}",
        }
        self.lfs = {p for p in self.files if p.endswith((".safetensors", ".bin"))}
        self.downloads: list[str] = []
        self.tokens: list[object] = []
        self.fail_on: str | None = None  # download of this file dies half-way
        self.corrupt: set[str] = set()  # served with a flipped byte
        self.error: BaseException | None = None  # raised by every call

    def list_repo_tree(self, _api, repo_id, path_in_repo=None, *, recursive=False,
                       expand=False, revision=None, repo_type=None, token=None):
        self.tokens.append(token)
        assert recursive and len(revision) == 40
        if self.error is not None:
            raise self.error
        out = [SimpleNamespace(path="original", tree_id="0" * 40)]  # a folder: no size
        for path, data in self.files.items():
            lfs = SimpleNamespace(sha256=hashlib.sha256(data).hexdigest(), size=len(data)) \
                if path in self.lfs else None
            out.append(SimpleNamespace(path=path, size=len(data), blob_id=_git_blob(data),
                                       lfs=lfs))
        return iter(out)

    def hf_hub_download(self, repo_id, filename, *, repo_type=None, revision=None,
                        local_dir=None, token=None, **kwargs):
        self.tokens.append(token)
        if self.error is not None:
            raise self.error
        self.downloads.append(filename)
        local = Path(local_dir)
        book = local / ".cache" / "huggingface" / "download"
        book.mkdir(parents=True, exist_ok=True)
        data = self.files[filename]
        if filename == self.fail_on:
            (book / f"{Path(filename).name}.incomplete").write_bytes(data[: len(data) // 2])
            raise KeyboardInterrupt("killed during the download")
        if filename in self.corrupt:
            data = bytes([data[0] ^ 1]) + data[1:]
        (book / f"{Path(filename).name}.metadata").write_text(f"{revision}\n")
        target = local / filename
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        return str(target)


@pytest.fixture
def hub(monkeypatch):
    fake = FakeHub()
    monkeypatch.setattr(huggingface_hub.HfApi, "list_repo_tree",
                        lambda api, *a, **kw: fake.list_repo_tree(api, *a, **kw))
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake.hf_hub_download)
    monkeypatch.setenv("HF_TOKEN", SECRET)
    return fake


@pytest.fixture
def specs():
    return load_assets(ROOT)


def _all_bytes(folder: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file())


def test_fetch_downloads_only_wanted_files_verifies_and_moves(hub, specs, tmp_path, caplog,
                                                               capsys):
    caplog.set_level(logging.DEBUG)
    adir = tmp_path / "assets"
    final = materialize("llama-2-7b", ROOT, adir, specs=specs)
    assert final == adir / "llama-2-7b"
    assert sorted(hub.downloads) == sorted([
        "config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
        "model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json"])
    files = sorted(p.relative_to(final).as_posix() for p in final.rglob("*") if p.is_file())
    assert files == sorted(hub.downloads + ["ASSET.json", MANIFEST])  # no .cache bookkeeping
    assert sorted(json.loads((final / "ASSET.json").read_text())["files"]) == sorted(
        hub.downloads)
    assert verify(final) == []
    info = read_info(final)
    assert info["source"]["revision"] == specs["llama-2-7b"].revision
    assert info["source"]["repo"] == "meta-llama/Llama-2-7b-hf"
    assert info["weights"] == "pretrained"
    assert not list((adir / TMP_DIR).iterdir())  # the temporary folder was moved, not copied
    # the token went to huggingface_hub in-process, and nowhere else
    assert hub.tokens and all(t == SECRET for t in hub.tokens)
    out, err = capsys.readouterr()
    assert SECRET.encode() not in _all_bytes(tmp_path)
    assert SECRET not in caplog.text + out + err


def test_second_fetch_is_a_verified_no_op(hub, specs, tmp_path):
    adir = tmp_path / "assets"
    final = materialize("llama-2-7b", ROOT, adir, specs=specs)
    stamp = (final / MANIFEST).stat().st_mtime_ns
    hub.downloads.clear()
    materialize("llama-2-7b", ROOT, adir, specs=specs)
    assert hub.downloads == []
    assert (final / MANIFEST).stat().st_mtime_ns == stamp


def test_corrupted_file_is_named_and_repaired_alone(hub, specs, tmp_path):
    adir = tmp_path / "assets"
    final = materialize("llama-2-7b", ROOT, adir, specs=specs)
    shard = final / "model-00001-of-00002.safetensors"
    data = bytearray(shard.read_bytes())
    data[-7] ^= 0xFF
    shard.write_bytes(bytes(data))
    (final / "tokenizer.json").unlink()
    problems = verify(final)
    assert problems[0].startswith("model-00001-of-00002.safetensors: sha256")
    assert problems[1] == "tokenizer.json: missing"
    hub.downloads.clear()
    materialize("llama-2-7b", ROOT, adir, specs=specs)
    assert sorted(hub.downloads) == ["model-00001-of-00002.safetensors", "tokenizer.json"]
    assert verify(final) == []


def test_interrupted_fetch_leaves_nothing_complete_and_resumes(hub, specs, tmp_path):
    adir = tmp_path / "assets"
    hub.fail_on = "model-00002-of-00002.safetensors"
    with pytest.raises(KeyboardInterrupt):
        materialize("llama-2-7b", ROOT, adir, specs=specs)
    final = adir / "llama-2-7b"
    assert not final.exists()
    assert verify(final) and "no such asset folder" in verify(final)[0]
    partial = [p for p in (adir / TMP_DIR).iterdir()]
    assert len(partial) == 1 and not (partial[0] / MANIFEST).exists()
    done_before = set(hub.downloads) - {"model-00002-of-00002.safetensors"}
    assert "model-00001-of-00002.safetensors" in done_before
    # a finished file damaged meanwhile (same size) is not trusted on resume
    shard = partial[0] / "model-00001-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-1] + b"\x07")
    hub.fail_on = None
    hub.downloads.clear()
    materialize("llama-2-7b", ROOT, adir, specs=specs)
    assert verify(final) == []
    # the other files finished before the interruption were not downloaded again
    assert "model-00001-of-00002.safetensors" in hub.downloads
    assert "model-00002-of-00002.safetensors" in hub.downloads
    assert not set(hub.downloads) & (done_before - {"model-00001-of-00002.safetensors"})
    assert not list((adir / TMP_DIR).iterdir())


def test_corrupt_download_is_refused_and_never_moved_into_place(hub, specs, tmp_path):
    adir = tmp_path / "assets"
    hub.corrupt = {"model-00002-of-00002.safetensors", "tokenizer.json"}
    with pytest.raises(AssetError) as err:
        materialize("llama-2-7b", ROOT, adir, specs=specs)
    text = str(err.value)
    assert "model-00002-of-00002.safetensors: sha256 differs" in text
    assert "tokenizer.json: git blob id differs" in text
    assert not (adir / "llama-2-7b").exists()
    hub.corrupt = set()
    hub.downloads.clear()
    materialize("llama-2-7b", ROOT, adir, specs=specs)  # only the refused files again
    assert sorted(hub.downloads) == ["model-00002-of-00002.safetensors", "tokenizer.json"]


def _offline_error() -> BaseException:
    try:
        try:
            raise ConnectionError("[Errno -2] Name or service not known")
        except ConnectionError as cause:
            raise huggingface_hub.errors.LocalEntryNotFoundError(
                "An error happened while trying to locate the files on the Hub") from cause
    except Exception as exc:  # noqa: BLE001
        return exc


def test_no_network_error_names_the_ways_out(hub, specs, tmp_path):
    hub.error = _offline_error()
    with pytest.raises(NoNetworkError) as err:
        materialize("llama-2-7b", ROOT, tmp_path / "assets", specs=specs)
    text = str(err.value)
    assert text.startswith("asset 'llama-2-7b': cannot reach the Hugging Face Hub to fetch "
                           "meta-llama/Llama-2-7b-hf at revision "
                           f"{specs['llama-2-7b'].revision}")
    assert "no network access to the Hub" in text
    assert "`local_path: /path/to/folder` under assets.llama-2-7b in configs/assets.yaml" in text
    assert "`weights: random` under assets.llama-2-7b" in text
    assert "models/llama-2-7b/config.json" in text
    assert SECRET not in text
    assert not (tmp_path / "assets" / "llama-2-7b").exists()
    # a data set has no random weights: only the local copy is offered
    dataset = no_network_message(specs["dolly-15k"], hub.error)
    assert "local_path" in dataset and "weights: random" not in dataset
    assert "--repo-type dataset" in dataset


@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
def test_no_network_with_the_real_library(tmp_path):
    """huggingface_hub itself, offline (HF_HUB_OFFLINE): the same message, from the CLI."""
    env = {"HF_HUB_OFFLINE": "1", "HF_TOKEN": SECRET, "PATH": "/usr/bin:/bin",
           "HOME": str(tmp_path), "HF_HOME": str(tmp_path / "hf"),
           "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, "-m", "hopperlab.cli", "assets", "fetch", "llama-2-7b",
                          "--root", str(ROOT), "--assets-dir", str(tmp_path / "assets")],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 2  # an expected error: one message, exit status 2
    assert "cannot reach the Hugging Face Hub" in out.stderr
    assert "weights: random" in out.stderr and "local_path" in out.stderr
    assert SECRET not in out.stdout + out.stderr
    assert SECRET.encode() not in _all_bytes(tmp_path)


def _http_error(status: int) -> BaseException:
    """huggingface_hub's own error for an HTTP answer, as its HTTP client makes it."""
    http = sys.modules[type(huggingface_hub.get_session()).__module__.split(".")[0]]
    request = http.Request("GET", "https://huggingface.co/api/models/x/tree/main")
    return huggingface_hub.errors.HfHubHTTPError(
        f"{status} Server Error: Service Unavailable for url: {request.url}",
        response=http.Response(status, request=request))


def test_hub_answering_503_names_the_ways_out(hub, specs, tmp_path):
    """A refused connection named the ways out; a 503 of the Hub said only "failed"."""
    hub.error = _http_error(503)
    with pytest.raises(NoNetworkError) as err:
        materialize("llama-2-7b", ROOT, tmp_path / "assets", specs=specs)
    text = str(err.value)
    assert text.startswith("asset 'llama-2-7b': the Hugging Face Hub answered 503")
    assert "try again later" in text
    assert "`local_path: /path/to/folder` under assets.llama-2-7b" in text
    assert "`weights: random` under assets.llama-2-7b" in text
    assert SECRET not in text


def test_gated_repository_says_to_set_the_token(hub, specs, tmp_path, monkeypatch):
    hub.error = type("GatedRepoError", (Exception,), {})("401 Client Error: access restricted")
    monkeypatch.delenv("HF_TOKEN")
    with pytest.raises(AssetError) as err:
        materialize("llama-2-7b", ROOT, tmp_path / "assets", specs=specs)
    assert "gated" in str(err.value) and "HF_TOKEN is not set" in str(err.value)
    assert hub.tokens == [False]  # no token file, no other source than the environment


def test_damaged_and_offline_names_the_files(hub, specs, tmp_path):
    adir = tmp_path / "assets"
    final = materialize("llama-2-7b", ROOT, adir, specs=specs)
    (final / "config.json").write_text("{}")
    hub.error = _offline_error()
    with pytest.raises(NoNetworkError) as err:
        materialize("llama-2-7b", ROOT, adir, specs=specs)
    text = str(err.value)
    assert text.startswith("asset 'llama-2-7b' is damaged (config.json: 2 bytes, expected")
    assert "cannot reach the Hugging Face Hub" in text and "local_path" in text


def _local_copy(hub: FakeHub, folder: Path) -> Path:
    for rel, data in hub.files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
    return folder


def _with(specs, name, **changes):
    import dataclasses

    return {**specs, name: dataclasses.replace(specs[name], **changes)}


def test_local_path_needs_no_network_and_is_checked(hub, specs, tmp_path):
    hub.error = _offline_error()
    local = _local_copy(hub, tmp_path / "copy")
    local_specs = _with(specs, "llama-2-7b", local_path=str(local))
    final = materialize("llama-2-7b", ROOT, tmp_path / "assets", specs=local_specs)
    assert verify(final) == []
    assert read_info(final)["source"]["from"] == "local_path"
    assert not (final / "README.md").exists()
    # a cut shard in the local copy is detected and named before anything is moved into place
    shard = local / "model-00002-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-10])
    with pytest.raises(AssetError) as err:
        materialize("llama-2-7b", ROOT, tmp_path / "other", specs=local_specs)
    assert "model-00002-of-00002.safetensors" in str(err.value) and "partial" in str(err.value)
    assert not (tmp_path / "other" / "llama-2-7b").exists()


def test_weights_random_downloads_nothing_and_says_so(hub, specs, tmp_path):
    from hopperlab.assets.random_weights import build_random_model, weights_tags

    hub.error = _offline_error()
    final = materialize("llama-2-7b", ROOT, tmp_path / "assets", weights="random", specs=specs)
    assert sorted(p.name for p in final.iterdir()) == ["ASSET.json", "MANIFEST.sha256",
                                                       "config.json"]
    assert read_info(final)["weights"] == "random"
    tags = weights_tags(final)
    assert tags["model.weights"] == "random" and tags["model.asset"] == "llama-2-7b"
    model, n = build_random_model(final, "meta")
    assert n == 6_738_415_616
    # the definition changed (pretrained again): the next fetch rebuilds, from the Hub
    hub.error = None
    materialize("llama-2-7b", ROOT, tmp_path / "assets", specs=specs)
    assert read_info(final)["weights"] == "pretrained"
    assert (final / "model-00001-of-00002.safetensors").exists()


def test_the_no_network_message_is_one_short_line_naming_asset_substitutes(hub, specs):
    """Issue 37 (minor): the Hub error was ~900 characters in lines joined into `.;` artefacts,
    and did not name asset_substitutes, the quickest way on without the Hub."""
    for name in ("llama-2-7b", "dolly-15k"):
        text = no_network_message(specs[name], _offline_error())
        assert "\n" not in text and ".;" not in text and ":;" not in text, text
        assert f"asset_substitutes={name}:" in text, text
        assert len(text) <= 700, len(text)
