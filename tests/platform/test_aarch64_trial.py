"""The aarch64 trial (scripts/aarch64_trial.sh, issue 46 item 4) stays runnable and honest
without running it here (it builds an arm64 root under qemu for half an hour: docs/gh200.md).

What it found is kept here: PyPI's aarch64 CPU torch 2.9.1 was inside pyproject.toml's torch
range, and with it torchao 0.18 does not import (``torch.nn.functional.ScalingType`` is new in
torch 2.10), which breaks every model build because transformers imports torchao when present.
"""

from __future__ import annotations

import re
import subprocess
import tomllib

from packaging.requirements import Requirement

from tests.helpers import REPO

SCRIPT = REPO / "scripts" / "aarch64_trial.sh"


def _torch_range():
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    return next(Requirement(r) for r in extras["gpu"] if Requirement(r).name == "torch").specifier


def test_the_script_parses_and_its_torch_is_inside_the_declared_range():
    out = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    pin = re.search(r"^TORCH=\$\{AARCH64_TORCH:-torch==([\d.]+)\}$", SCRIPT.read_text(), re.M)
    assert pin, "the script names no default torch pin"
    assert pin.group(1) in _torch_range()


def test_the_declared_torch_range_leaves_out_the_torch_torchao_cannot_import_with():
    # the trial's first finding (docs/gh200.md): torch 2.9.1 with torchao 0.18
    assert "2.9.1" not in _torch_range()


def test_the_trial_is_not_in_cis_default_path():
    for path in (REPO / ".ci" / "run", REPO / "scripts" / "test.sh"):
        assert "aarch64_trial" not in path.read_text(), path
