"""Would the README's install work on an aarch64 (GH200) node? pip's own resolver, asked for
manylinux aarch64 wheels only (``--dry-run``: metadata, nothing installed), for every dependency
of pyproject.toml and the torch the README installs. A package with no aarch64 build fails it.

The one honest fallback: a dependency published only as an sdist must be pure Python (its wheel,
built here, is ``py3-none-any``); it is handed to the resolver as that wheel.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: what the README installs first on either architecture (PyPI's aarch64 build is CUDA 13)
TORCH = "torch==2.13.0"
#: dependencies PyPI has only as sdists; each must build as a pure-Python wheel
PURE_PYTHON_SDISTS = ("connection_pool",)
#: glibc 2.17 (manylinux2014) up to Ubuntu 24.04's 2.39: with --platform pip takes only the tags
#: it is given, so every manylinux_2_x a GH200 OS accepts is listed
PLATFORMS = ["manylinux2014_aarch64", *(f"manylinux_2_{v}_aarch64" for v in range(17, 40))]

pytestmark = pytest.mark.network


def _pypi_reachable() -> bool:
    try:
        socket.create_connection(("pypi.org", 443), timeout=5).close()
        return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def online() -> None:
    if not _pypi_reachable():
        if os.environ.get("HOPPERLAB_REQUIRE_NETWORK") == "1":
            pytest.fail("PyPI (pypi.org:443) is unreachable and HOPPERLAB_REQUIRE_NETWORK=1")
        pytest.skip("PyPI (pypi.org:443) is unreachable: the aarch64 resolution needs it")


def _pip(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True,
                          timeout=timeout, check=False)


def test_every_dependency_has_an_aarch64_build(online, tmp_path):
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    wheels = tmp_path / "pure"
    for name in PURE_PYTHON_SDISTS:
        out = _pip("wheel", "--no-deps", "-q", "-w", str(wheels), name)
        assert out.returncode == 0, out.stderr[-2000:]
    for wheel in wheels.glob("*.whl"):
        assert wheel.name.endswith("-none-any.whl"), f"{wheel.name} is not pure Python"
    req = tmp_path / "requirements.txt"
    req.write_text("\n".join([*deps, TORCH]) + "\n")
    report = tmp_path / "report.json"
    platforms = [a for p in PLATFORMS for a in ("--platform", p)]
    out = _pip("install", "--dry-run", "--ignore-installed", "--report", str(report),
               "--only-binary=:all:", *platforms, "--python-version", "3.11",
               "--implementation", "cp", "--target", str(tmp_path / "t"),
               "--find-links", str(wheels), "-r", str(req))
    assert out.returncode == 0, "no aarch64 resolution:\n" + out.stderr[-4000:]
    chosen = {i["metadata"]["name"].lower().replace("_", "-"): i["download_info"]["url"]
              for i in json.loads(report.read_text())["install"]}
    for name, url in chosen.items():
        wheel = url.rsplit("/", 1)[-1]
        assert wheel.endswith("-any.whl") or "aarch64" in wheel, f"{name}: {wheel}"
    assert "aarch64" in chosen["torch"] and "duckdb-extension-tpch" in chosen
