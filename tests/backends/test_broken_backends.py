"""A backend that cannot be loaded (issue 46, D19): a plugin that raises on import, or a stray
folder under hopperlab/backends/ without a ``BACKEND``, is skipped with one warning naming it,
as submitit skips a broken executor plugin; every verb works with the other backends, and only
a site naming the broken one is refused, with why."""

from __future__ import annotations

import logging
import os

import pytest
import yaml

from hopperlab import backends
from hopperlab.config.matrix import load_matrix
from hopperlab.core.errors import SpecError
from tests.helpers import REPO, copy_project, hopperlab


@pytest.fixture
def stray(tmp_path, monkeypatch):
    """Two folders on the package's path: one whose import raises, one without BACKEND."""
    extra = tmp_path / "extra"
    (extra / "raising").mkdir(parents=True)
    (extra / "raising/__init__.py").write_text("raise RuntimeError('half-installed plugin')\n")
    (extra / "leftover").mkdir()
    (extra / "leftover/__init__.py").write_text("")
    monkeypatch.setattr(backends, "__path__", [*backends.__path__, str(extra)])
    backends.forget()
    yield
    monkeypatch.undo()
    backends.forget()


def test_a_broken_backend_is_skipped_with_one_warning_each(stray, caplog):
    with caplog.at_level(logging.WARNING, logger=backends.__name__):
        assert {"local", "slurm", "debug"} <= set(backends.names())
        assert "raising" not in backends.names() and "leftover" not in backends.names()
        assert all(info.name != "raising" for info in backends.all_backends())
        backends.where_am_i({})  # what every job asks
        backends.names()
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2, said
    assert any("backend 'raising'" in m and "RuntimeError: half-installed plugin" in m
               for m in said), said
    assert any("backend 'leftover'" in m and "declares no BACKEND" in m for m in said), said
    assert "RuntimeError: half-installed plugin" in backends.broken()["raising"]


def test_the_matrix_loads_beside_a_broken_backend_and_a_site_naming_it_is_refused(
        stray, tmp_path):
    for site in sorted(p.stem for p in (REPO / "configs/sites").glob("*.yaml")):  # every site
        assert load_matrix(REPO, {"site": site, "only": "membench/copy/h2d-pinned"}).runs, site
    project = copy_project(tmp_path / "proj")
    (project / "configs/sites/broken.yaml").write_text(yaml.safe_dump(
        {"executor": "raising", "resources": {}}))
    with pytest.raises(SpecError) as err:
        load_matrix(project, {"site": "broken", "families": "selftest"})
    assert str(err.value).startswith(f"{project}/configs/sites/broken.yaml: executor: the "
                                     f"backend 'raising' could not be loaded: RuntimeError")


def test_a_plugin_that_raises_on_import_does_not_stop_a_verb(tmp_path):
    """Through an entry point, as a distribution installs one; a verb in a fresh process."""
    site = tmp_path / "site"
    (site / "badplugin").mkdir(parents=True)
    (site / "badplugin/__init__.py").write_text("import no_such_module_46\n")
    dist = site / "badplugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: hl-badplugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[hopperlab.backends]\nbadplugin = badplugin\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(site), str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    out = hopperlab(["list", "--config", "only=membench/copy/h2d-pinned"], REPO, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "membench" in out.stdout and "Traceback" not in out.stderr
    lines = [line for line in out.stderr.splitlines() if "badplugin" in line]
    # the distribution named: what to reinstall or remove (issue 55)
    assert lines == ["hopperlab: backend 'badplugin' (badplugin, distribution hl-badplugin 0.1) "
                     "skipped: ModuleNotFoundError: No module named 'no_such_module_46'"], \
        out.stderr
