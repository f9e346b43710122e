"""MANIFEST.sha256 and verification: a flipped byte, a cut file, a lost manifest are caught."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from hopperlab.assets.formats import check_safetensors, check_tree
from hopperlab.assets.manifest import (
    MANIFEST,
    hash_files,
    list_files,
    read_manifest,
    verify,
    write_manifest,
)


def _asset(folder: Path) -> Path:
    (folder / "sub").mkdir(parents=True)
    (folder / "a.txt").write_text("alpha\n")
    (folder / "sub" / "b.bin").write_bytes(bytes(range(256)) * 10)
    write_manifest(folder, hash_files(folder, list_files(folder)))
    return folder


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def test_complete_asset_verifies(tmp_path):
    folder = _asset(tmp_path / "x")
    assert verify(folder) == []
    assert sorted(read_manifest(folder)) == ["a.txt", "sub/b.bin"]


def test_flipped_byte_is_caught_and_named(tmp_path):
    folder = _asset(tmp_path / "x")
    _flip(folder / "sub" / "b.bin", 1000)
    problems = verify(folder)
    assert len(problems) == 1
    assert problems[0].startswith("sub/b.bin: sha256") and "corrupted" in problems[0]
    # a quick check (sizes only) cannot see a flipped byte; the deep one (default) does
    assert verify(folder, deep=False) == []


def test_missing_unlisted_and_lost_manifest(tmp_path):
    folder = _asset(tmp_path / "x")
    (folder / "a.txt").unlink()
    (folder / "stray.tmp").write_text("?")
    assert verify(folder) == ["a.txt: missing",
                              f"stray.tmp: not listed in {MANIFEST} (unexpected file)"]
    (folder / MANIFEST).unlink()
    assert "incomplete" in verify(folder)[0]
    assert "no such asset folder" in verify(tmp_path / "nothing")[0]


def test_cut_file_is_partial_when_sizes_are_recorded(tmp_path):
    folder = _asset(tmp_path / "x")
    (folder / "ASSET.json").write_text(json.dumps(
        {"files": {"a.txt": {"size": 6}, "sub/b.bin": {"size": 2560}}}))
    hashes = hash_files(folder, list_files(folder))
    write_manifest(folder, hashes)
    with open(folder / "sub" / "b.bin", "r+b") as fh:
        fh.truncate(100)
    problems = verify(folder, deep=False)
    assert problems == ["sub/b.bin: 100 bytes, expected 2560 (partial or corrupted)"]


def test_manifest_is_sha256sum_format(tmp_path):
    if shutil.which("sha256sum") is None:
        pytest.skip("no sha256sum on this machine")
    folder = _asset(tmp_path / "x")
    out = subprocess.run(["sha256sum", "-c", MANIFEST], cwd=folder, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def _safetensors(path: Path, nbytes: int = 16) -> None:
    header = json.dumps({"w": {"dtype": "F32", "shape": [nbytes // 4],
                               "data_offsets": [0, nbytes]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * nbytes)


def test_safetensors_structure(tmp_path):
    good = tmp_path / "model.safetensors"
    _safetensors(good)
    assert check_safetensors(good) is None
    data = good.read_bytes()
    good.write_bytes(data[:-3])
    assert "partial" in check_safetensors(good)
    good.write_bytes(data[:5])
    assert "too short" in check_safetensors(good)
    (tmp_path / "config.json").write_text('{"a": ')
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"w": "model-00002-of-00002.safetensors"}}))
    problems = check_tree(tmp_path, list_files(tmp_path))
    assert [p.split(":")[0] for p in problems] == [
        "config.json", "model.safetensors", "model.safetensors.index.json"]
    assert "model-00002-of-00002.safetensors" in problems[2]
