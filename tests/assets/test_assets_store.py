"""The asset store with built (not downloaded) assets: once, verified, rebuilt when changed.

Also the extension point: a new kind registered by a test plugs into the same mechanism.
"""

from __future__ import annotations

import csv
import dataclasses
import os
import textwrap
from pathlib import Path

import pytest

from hopperlab.cli.main import main as hopperlab
from hopperlab.assets import (
    MANIFEST,
    AssetKind,
    AssetSpec,
    asset_dir,
    materialize,
    read_info,
    register_kind,
    verify,
)
from hopperlab.assets.registry import KINDS
from hopperlab.assets.store import TMP_DIR
from hopperlab.core.errors import SpecError

TABLES = """
scales:
  smoke: [events-csv]
assets:
  events-csv:
    kind: generated-table
    rows: 50
    format: csv
    seed: 3
    columns:
      user: {type: int, low: 0, high: 10}
      score: {type: float, low: 0, high: 1}
      what: {type: category, values: [a, b]}
  events-parquet:
    kind: generated-table
    rows: 40
    columns:
      user: {type: int, low: 0, high: 10}
"""


def _root(tmp_path: Path, text: str = TABLES) -> Path:
    root = tmp_path / "repo"
    (root / "configs").mkdir(parents=True, exist_ok=True)
    (root / "configs" / "assets.yaml").write_text(textwrap.dedent(text))
    return root


def test_generated_table_is_built_once(tmp_path):
    root = _root(tmp_path)
    final = materialize("events-csv", root, "assets")
    assert final == asset_dir(root, "assets", "events-csv") == root / "assets" / "events-csv"
    rows = list(csv.DictReader(open(final / "table.csv")))
    assert len(rows) == 50 and set(rows[0]) == {"user", "score", "what"}
    assert {r["what"] for r in rows} <= {"a", "b"}
    assert verify(final) == []
    assert sorted(p.name for p in final.iterdir()) == ["ASSET.json", MANIFEST, "table.csv"]
    stamp = os.stat(final / "table.csv").st_ino, (final / MANIFEST).stat().st_mtime_ns
    materialize("events-csv", root, "assets")  # complete: left alone
    assert (os.stat(final / "table.csv").st_ino, (final / MANIFEST).stat().st_mtime_ns) == stamp


def test_parquet_table_is_seeded(tmp_path):
    import pyarrow.parquet as pq

    root = _root(tmp_path)
    a = pq.read_table(materialize("events-parquet", root, "a") / "table.parquet")
    b = pq.read_table(materialize("events-parquet", root, "b") / "table.parquet")
    assert a.num_rows == 40 and a.equals(b)


def test_changed_definition_rebuilds(tmp_path):
    root = _root(tmp_path)
    final = materialize("events-csv", root, "assets")
    fingerprint = read_info(final)["fingerprint"]
    _root(tmp_path, TABLES.replace("rows: 50", "rows: 20"))
    materialize("events-csv", root, "assets")
    assert read_info(final)["fingerprint"] != fingerprint
    assert len(list(csv.DictReader(open(final / "table.csv")))) == 20
    assert verify(final) == []


def test_corrupted_built_asset_is_rebuilt(tmp_path):
    root = _root(tmp_path)
    final = materialize("events-csv", root, "assets")
    with open(final / "table.csv", "r+b") as fh:
        fh.seek(20)
        byte = fh.read(1)
        fh.seek(20)
        fh.write(bytes([byte[0] ^ 1]))
    assert "table.csv: sha256" in verify(final)[0]
    materialize("events-csv", root, "assets")
    assert verify(final) == []


def test_lost_manifest_is_restored_without_rebuilding(tmp_path):
    """Snakemake deletes a rule's output before rerunning it: the files are still good."""
    root = _root(tmp_path)
    final = materialize("events-csv", root, "assets")
    manifest = (final / MANIFEST).read_text()
    inode = os.stat(final / "table.csv").st_ino
    (final / MANIFEST).unlink()
    assert "incomplete" in verify(final)[0]
    materialize("events-csv", root, "assets")
    assert (final / MANIFEST).read_text() == manifest
    assert os.stat(final / "table.csv").st_ino == inode


def test_scale_guard(tmp_path):
    root = _root(tmp_path)
    with pytest.raises(SpecError, match=r"scales.smoke: does not list asset 'events-parquet'"):
        materialize("events-parquet", root, "assets", scale="smoke")
    with pytest.raises(SpecError, match="no asset named 'nope'"):
        materialize("nope", root, "assets")
    assert materialize("events-csv", root, "assets", scale="smoke").is_dir()


# --------------------------------------------------------------------------- a new kind
@dataclasses.dataclass(frozen=True, kw_only=True)
class CountSpec(AssetSpec):
    upto: int = 3
    source_of: str | None = None  # an input: another counter


BUILDS: list[str] = []


def _build_count(spec, ctx):
    BUILDS.append(spec.name)
    start = 0
    if "source_of" in ctx.inputs:
        start = int((ctx.inputs["source_of"] / "numbers.txt").read_text().split()[-1]) + 1
    (ctx.out / "numbers.txt").write_text(" ".join(map(str, range(start, start + spec.upto))))
    if spec.upto == 99:
        (ctx.out / "half.txt").write_text("written before the crash")
        raise KeyboardInterrupt("the job was killed")
    return {"from": "counted"}


@pytest.fixture
def count_kind():
    register_kind(AssetKind(name="count", spec=CountSpec, build=_build_count,
                            produces=lambda spec: ("numbers.txt",),
                            input_kinds={"source_of": ("count",)}))
    BUILDS.clear()
    yield
    KINDS.pop("count")


COUNTS = """
assets:
  first: {kind: count, upto: 3}
  second: {kind: count, upto: 2, source_of: first}
  broken: {kind: count, upto: 99}
"""


def test_a_registered_kind_plugs_in_with_its_inputs(tmp_path, count_kind):
    root = _root(tmp_path, COUNTS)
    final = materialize("second", root, "assets")
    assert (final / "numbers.txt").read_text() == "3 4"
    assert BUILDS == ["first", "second"]
    info = read_info(final)
    assert info["inputs"]["source_of"]["name"] == "first" and info["source"]["from"] == "counted"
    materialize("second", root, "assets")
    assert BUILDS == ["first", "second"]  # both complete: nothing rebuilt


def test_interrupted_build_leaves_nothing_that_passes_for_complete(tmp_path, count_kind):
    root = _root(tmp_path, COUNTS)
    with pytest.raises(KeyboardInterrupt):
        materialize("broken", root, "assets")
    assert not (root / "assets" / "broken").exists()
    assert verify(root / "assets" / "broken")
    assert not list((root / "assets" / TMP_DIR).iterdir())


def test_interrupted_rebuild_keeps_the_old_complete_version(tmp_path, count_kind):
    root = _root(tmp_path, COUNTS)
    final = materialize("first", root, "assets")
    _root(tmp_path, COUNTS.replace("upto: 3", "upto: 99"))
    with pytest.raises(KeyboardInterrupt):
        materialize("first", root, "assets")
    assert (final / "numbers.txt").read_text() == "0 1 2" and verify(final) == []
    # a leftover of a killed process (no cleanup ran) is removed by the next run
    (root / "assets" / TMP_DIR / "first@build.1.dead").mkdir()
    _root(tmp_path, COUNTS)
    materialize("first", root, "assets")
    assert not list((root / "assets" / TMP_DIR).iterdir())


def test_cli_fetch_verify_list(tmp_path, capsys):
    root = _root(tmp_path)
    args = ["--root", str(root), "--assets-dir", "assets"]
    assert hopperlab(["assets", "fetch", "--scale", "smoke", *args]) == 0
    assert capsys.readouterr().out.strip() == str(root / "assets" / "events-csv")
    assert hopperlab(["assets", "verify", *args]) == 0
    assert "events-csv: ok" in capsys.readouterr().out
    (root / "assets" / "events-csv" / "table.csv").write_text("x")
    assert hopperlab(["assets", "verify", "events-csv", *args]) == 1
    assert "table.csv" in capsys.readouterr().out
    assert hopperlab(["assets", "list", *args]) == 0
    out = capsys.readouterr().out
    assert "events-csv" in out and "events-parquet" in out and "absent" in out
    assert hopperlab(["assets", "fetch", "nope", *args]) == 2
    assert "config error" in capsys.readouterr().err
