"""A real container, end to end: the workflow builds containers/pytorch.ch with Charliecloud
(a Debian base from Debian's packages + the .def's %files/%post/%environment/%test), then runs one
run of every family inside it with ch-run; the records name the runtime and the image's digest,
as seen from the submitting side and from inside the job. A job whose container cannot start
fails in one line naming the site file and key.

Needs ch-run and mmdebstrap (Debian: charliecloud-runtime, mmdebstrap; scripts/test.sh installs
them) and unprivileged user namespaces; skips without them unless HOPPERLAB_REQUIRE_CONTAINERS=1
(CI), which makes that a failure.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hopperlab.config.matrix import load_matrix
from hopperlab.node import charliecloud
from hopperlab.run import launch
from tests.helpers import copy_project, edit_yaml, snakemake
from tests.infra.shared import made_once

#: head_start: the image build is one long single-core unit that sets the suite's length
pytestmark = [pytest.mark.charliecloud, pytest.mark.head_start, pytest.mark.timeout(2400)]

REPO = Path(__file__).resolve().parents[2]
BUILD_CONTEXT = ("pyproject.toml", "README.md", "src")
SITE = "local-charliecloud"
#: one run of every family of the default matrix (the quickest of each)
ONE_PER_FAMILY = ["membench/alloc/host", "finetune/lora-llama2-7b/baseline",
                  "inference/kv-cache/resident", "recommender/latency/cpu-only",
                  "database/tpch/device"]


def _need_charliecloud() -> None:
    missing = [b for b in ("ch-run", "mmdebstrap") if shutil.which(b) is None]
    if missing:
        reason = f"{', '.join(missing)} not on PATH (apt-get install charliecloud-runtime " \
                 f"mmdebstrap)"
        if os.environ.get("HOPPERLAB_REQUIRE_CONTAINERS") == "1":
            pytest.fail(f"HOPPERLAB_REQUIRE_CONTAINERS=1 but {reason}")
        pytest.skip(reason)


def _only(keys: list[str]) -> str:
    return "only=[" + ",".join(keys) + "]"


def _build(folder: Path) -> dict:
    """The workflow in a project copy under ``folder``: the image, then one run of every family."""
    project = copy_project(folder / "project")
    for part in BUILD_CONTEXT:  # what the .def's %files takes from the project root
        src = REPO / part
        if src.is_dir():
            shutil.copytree(src, project / part, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(src, project / part)
    t0 = time.monotonic()
    out = snakemake(["--cores", "2", "--config", f"site={SITE}", _only(ONE_PER_FAMILY)],
                    project, timeout=2100)
    elapsed = time.monotonic() - t0
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-6000:]
    meta = charliecloud.image_meta(project / "containers/pytorch.ch")
    print(f"charliecloud: image built in {meta and meta['built_s']} s; workflow (image, assets, "
          f"{len(ONE_PER_FAMILY)} runs, report) {elapsed:.0f} s")
    return meta


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Built once per test run: the Slurm test below runs on the Slurm group's worker, the
    others wherever this file runs (tests/infra/shared.py)."""
    _need_charliecloud()
    folder, meta = made_once(tmp_path_factory, "charliecloud", _build)
    return folder / "project", meta


@pytest.mark.integration
def test_the_workflow_builds_the_image_from_the_def(built):
    project, meta = built
    image = project / "containers/pytorch.ch"
    assert meta["runtime"] == "charliecloud" and meta["image"] == "pytorch"
    assert meta["digest"] == charliecloud.tree_digest(image)
    assert meta["base"].startswith("debian:bookworm")
    # what the .def's %files and %environment put in, and what %post installed
    assert (image / "opt/hopperlab/pyproject.toml").is_file()
    env = (image / charliecloud.ENV_FILE).read_text().splitlines()
    assert "HOPPERLAB_IMAGE=pytorch" in env and "PYTHONNOUSERSITE=1" in env
    pins = (image / "opt/hopperlab/torch-stack-constraints.txt").read_text()
    assert pins.startswith("torch==2.13.0")
    freeze = (image / "opt/hopperlab/image-freeze.txt").read_text()
    assert "hopperlab @ file:///opt/hopperlab" in freeze


@pytest.mark.integration
def test_one_run_of_every_family_ran_inside_the_image(built):
    project, meta = built
    matrix = load_matrix(project, {"site": SITE, "only": ONE_PER_FAMILY})
    assert {k.split("/")[0] for k in matrix.runs} == set(matrix.config["families"])
    for key, spec in matrix.runs.items():
        rec = json.loads((project / spec.run_dir / "metrics.json").read_text())
        assert rec["status"] in ("ok", "skipped"), (key, rec["reason"])
        assert rec["container"] == {"runtime": "charliecloud", "image": "pytorch",
                                    "image_file": str(project / "containers/pytorch.ch"),
                                    "digest": meta["digest"]}, key
        # the job's own view, from inside: ch-run's variable and the image's record of itself
        inside = rec["hardware"]["container"]
        assert inside["runtime"] == "charliecloud" and inside["digest"] == meta["digest"], key
        assert rec["tags"]["container.digest"] == meta["digest"]


@pytest.mark.integration
def test_the_job_prefix_runs_the_images_python_with_the_site_env(built):
    project, _ = built
    spec = load_matrix(project, {"site": SITE, "only": ONE_PER_FAMILY[:1]}).get(
        ONE_PER_FAMILY[0])
    prefix = launch.container_prefix(spec, project / spec.run_dir)
    probe = ("import hopperlab, os, sys; print(hopperlab.__file__); "
             "print(os.environ.get('HOPPERLAB_SITE')); print(os.environ.get('PYTHONPATH')); "
             "print(sys.version_info[:2])")
    env = {**os.environ, **charliecloud.user_env(), "PYTHONPATH": str(project / "src")}
    out = subprocess.run(prefix + ["python", "-c", probe], capture_output=True, text=True,
                         env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    where, site_env, pythonpath, version = out.stdout.splitlines()
    assert where.startswith("/usr/local/lib/python3.11/dist-packages/hopperlab/")  # the image's
    assert site_env == "local-charliecloud" and pythonpath == "None"
    assert version == "(3, 11)"


@pytest.mark.integration
def test_a_job_whose_container_cannot_start_fails_in_one_line(built):
    project, _ = built
    site = project / "configs/sites/cc-badbind.yaml"
    site.write_text((project / f"configs/sites/{SITE}.yaml").read_text())
    edit_yaml(site, lambda d: d.update(container_binds=["/nonexistent-hopperlab-bind"]))
    key = ONE_PER_FAMILY[0]
    out = snakemake(["--cores", "1", "--config", "site=cc-badbind", _only([key]),
                     "results_dir=results-badbind"], project, timeout=600)
    assert out.returncode != 0
    rec = json.loads((project / "results-badbind" / key / "record.json").read_text())
    assert rec["status"] == "failed"
    assert "\n" not in rec["reason"]
    assert rec["reason"].startswith(f"{site}: container_binds: the job could not start its "
                                    f"container (charliecloud, ")
    assert "ch-run[" in rec["reason"] and "/nonexistent-hopperlab-bind" in rec["reason"]


@pytest.mark.integration
def test_an_image_from_a_given_root_file_system(built, tmp_path):
    """The cluster path for an NGC base (``ch-convert`` of nvcr.io/nvidia/pytorch to a directory,
    then ``--base``): here the image just built stands in for that root file system. The .def's
    %post runs on it with the network (no wheel folder), %test passes, the base is recorded."""
    project, meta = built
    out_dir = tmp_path / "from-root.ch"
    got = subprocess.run(
        [sys.executable, "-m", "hopperlab.cli", "containers", "build", "pytorch", "--runtime",
         "charliecloud", "--base", str(project / "containers/pytorch.ch"), "--output",
         str(out_dir)], cwd=project, capture_output=True, text=True, timeout=1200,
        env={**os.environ, **charliecloud.user_env()})
    assert got.returncode == 0, got.stderr[-4000:]
    second = charliecloud.image_meta(out_dir)
    assert second["base"] == f"rootfs:{project / 'containers/pytorch.ch'}"
    assert second["digest"] == charliecloud.tree_digest(out_dir)
    # the base's own environment is kept under the .def's %environment
    env = (out_dir / charliecloud.ENV_FILE).read_text().splitlines()
    assert env[0] == f"PATH={charliecloud.IMAGE_PATH}" and "HOPPERLAB_IMAGE=pytorch" in env


@pytest.mark.integration
@pytest.mark.slurm
def test_a_slurm_job_runs_inside_the_image(built, slurm_cluster):
    """The same image through the real one-node Slurm cluster: sbatch, srun, then ch-run in the
    job; the site names the image as an existing one (``container_image``), so nothing is
    built again."""
    project, meta = built
    site = project / "configs/sites/slurm-charliecloud.yaml"
    site.write_text((project / f"configs/sites/{SITE}.yaml").read_text())
    image = project / "containers/pytorch.ch"
    edit_yaml(site, lambda d: d.update(
        executor="slurm", poll_interval_s=1, container_image=str(image),
        slurm={"partition": slurm_cluster.partition},
        resources={"smoke": {"gpus": 0, "cpus": 1, "mem_gb": 1, "time_min": 5},
                   "full": {"gpus": 0, "cpus": 1, "mem_gb": 1, "time_min": 5}}))
    key = ONE_PER_FAMILY[0]
    out = snakemake(["--profile", "profiles/slurm", "--config", "site=slurm-charliecloud",
                     _only([key]), "results_dir=results-slurm"], project,
                    env=slurm_cluster.env, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-4000:]
    rec = json.loads((project / "results-slurm" / key / "metrics.json").read_text())
    assert rec["status"] == "ok" and rec["slurm"]["job_id"], rec["reason"]
    assert rec["container"]["digest"] == meta["digest"]
    assert rec["hardware"]["container"]["runtime"] == "charliecloud"
    assert rec["hardware"]["container"]["digest"] == meta["digest"]
