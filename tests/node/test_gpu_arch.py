"""A site whose GPU nodes have another architecture than the login node (issue 21, part 3b)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hopperlab.config.site import load_site
from hopperlab.node.containers import ContainerError, check_build_arch, image_path
from tests.helpers import copy_project, edit_yaml


def test_image_named_by_the_gpu_arch():
    assert image_path("pytorch", "containers") == Path("containers/pytorch.sif")
    assert image_path("pytorch", "containers", "aarch64") == Path("containers/pytorch.aarch64.sif")


def test_build_refuses_another_architecture():
    check_build_arch(None, "x86_64")
    check_build_arch("aarch64", "aarch64")
    with pytest.raises(ContainerError, match="build it on one of those nodes"):
        check_build_arch("aarch64", "x86_64")


def test_site_key(tmp_path):
    root = copy_project(tmp_path / "p")
    edit_yaml(root / "configs/sites/gh200.yaml",
              lambda d: d.update(gpu_arch="aarch64", container="pytorch"))
    site = load_site(root, "gh200", "results")
    assert site.gpu_arch == "aarch64"
    assert site.container.image_file.endswith("containers/pytorch.aarch64.sif")
