"""The workflow compiles hopperlab's modules once (core/bytecode.py): the bytecode Python would
write itself, kept fresh against the source, never run stale."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from hopperlab.core.bytecode import PACKAGE_DIR, compile_package


def _package(tmp_path: Path) -> Path:
    pkg = tmp_path / "pkg_s37"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "mod.py").write_text("VALUE = 1\n")
    return pkg


def test_every_module_gets_its_bytecode(tmp_path):
    pkg = _package(tmp_path)
    assert compile_package(pkg)
    for source in (pkg / "__init__.py", pkg / "sub" / "mod.py"):
        assert Path(importlib.util.cache_from_source(str(source))).is_file()


def test_an_edited_module_is_compiled_again_not_run_stale(tmp_path):
    pkg = _package(tmp_path)
    mod = pkg / "sub" / "mod.py"
    compile_package(pkg)
    cached = Path(importlib.util.cache_from_source(str(mod)))
    first = cached.read_bytes()
    mod.write_text("VALUE = 2\n")
    later = cached.stat().st_mtime + 5  # the source is newer than its bytecode
    os.utime(mod, (later, later))
    assert compile_package(pkg)
    assert cached.read_bytes() != first
    sys.path.insert(0, str(tmp_path))
    try:
        from pkg_s37.sub import mod as loaded  # type: ignore[import-not-found]
        assert loaded.VALUE == 2
    finally:
        sys.path.remove(str(tmp_path))
        for name in [n for n in sys.modules if n.startswith("pkg_s37")]:
            del sys.modules[name]


def test_a_folder_it_cannot_write_is_left_alone(tmp_path):
    assert compile_package(tmp_path / "absent") is False
    assert not (tmp_path / "absent").exists()


def test_the_package_is_this_checkouts_hopperlab():
    assert (PACKAGE_DIR / "core" / "bytecode.py").is_file()
    assert PACKAGE_DIR.name == "hopperlab"


def test_the_workflow_compiles_it_before_the_jobs():
    onstart = (Path(__file__).resolve().parents[2] / "workflow" / "rules" / "report.smk").read_text()
    block = onstart.split("onstart:", 1)[1].split("\nonsuccess:", 1)[0]
    assert "compile_package()" in block
