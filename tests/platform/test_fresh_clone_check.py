"""`hopperlab check` on a fresh clone judges the shipped references of the lent kinds: only the
files git tracks (what a clone gets) are copied, and the runs the references were taken from
(tests/fixtures/machines) are checked there through the CLI, as a user on that node would."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.helpers import REPO

FIX = REPO / "tests" / "fixtures" / "machines"


@pytest.mark.integration
@pytest.mark.parametrize("results, machine, strict", [
    # the one-run values of 2026-11-24: references from repeats replaced most of them since
    # (tests/fixtures/machines/README.md): none a regression, some inconclusive or unjudged
    ("results-h200", "h200-141g-pcie5-x86_64", False),
    ("results-h100", "h100-80g-pcie5-x86_64", True),
    # the fresh runs (repeats=1) of references_gpu.sh's 2026-11-28 calls, judged by the
    # references shipped from their repeats: 1-GPU (host CPU [GenuineIntel 6-207-2]) and TP 2
    ("results-h200-fresh", "h200-141g-pcie5-x86_64", True),
    ("results-2xh200-fresh", "2xh200-141g-pcie5-x86_64", True)])
def test_a_fresh_clone_judges_every_run_of_the_lent_kind(tmp_path, results, machine, strict):
    tracked = subprocess.run(["git", "-C", str(REPO), "ls-files", "Snakefile", "configs",
                              "experiments", "workflow", "models"], capture_output=True,
                             text=True, check=True).stdout.split()
    assert f"configs/references/{machine}.yaml" in tracked      # shipped, not a local file
    clone = tmp_path / "clone"
    for name in tracked:
        (clone / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, clone / name)
    runs = shutil.copytree(FIX / results, tmp_path / results)
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    # a folder of some of the referenced runs says which (a strict check fails on the others)
    held = ",".join(sorted("/".join(d.relative_to(runs).parts) for d in runs.glob("*/*/*")))
    done = subprocess.run([sys.executable, "-m", "hopperlab.cli", "check", str(runs), "--root",
                           str(clone)] + (["--strict", "--config", f"only={held}"] if strict
                                          else []),
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    line = next(x for x in done.stdout.splitlines() if x.startswith("[hopperlab] check"))
    assert f"({machine})" in line and "pass" in line and "regression" not in line, line
    if strict:
        assert "no-reference" not in line and "inconclusive" not in line, line
