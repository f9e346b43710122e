"""The runtimes beside apptainer: Charliecloud (ch-run, a directory image built from the .def on a
Debian base) and enroot + pyxis (srun options). Command lines, site keys, digests, records and
the one-line reasons; no image is built here (tests/node/test_containers_charliecloud.py does that)."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from hopperlab.cli.workflow import container_inputs
from hopperlab.config.matrix import load_matrix
from hopperlab.core.errors import SpecError
from hopperlab.backends.slurm import pyxis
from hopperlab.node import charliecloud
from hopperlab.node.containers import (
    exec_prefix,
    find_runtime,
    image_digest,
    image_path,
    inside_container,
    job_exec_prefix,
    start_failure,
)
from hopperlab.node.deffile import DefFileError, read_def
from hopperlab.run import launch, submit
from tests.helpers import copy_project, edit_yaml

REPO = Path(__file__).resolve().parents[2]
CONTAINERS = REPO / "containers"
KEY = "membench/alloc/host"


# --------------------------------------------------------------------------- the .def as the list
def test_def_sections_are_read_as_written():
    d = read_def(CONTAINERS / "pytorch.def")
    assert d.header["From"] == "nvcr.io/nvidia/pytorch:25.12-py3"
    assert d.files == [("pyproject.toml", "/opt/hopperlab/pyproject.toml"),
                       ("README.md", "/opt/hopperlab/README.md"), ("src", "/opt/hopperlab/src")]
    assert d.environment == {"HOPPERLAB_IMAGE": "pytorch", "PYTHONNOUSERSITE": "1"}
    post = d.script("post")
    # the install line as written (spython strips the indentation and continuation layout)
    assert "    PIP_CONSTRAINT=/opt/hopperlab/torch-stack-constraints.txt \\\n" in post
    assert "python3 -m pip install --no-cache-dir /opt/hopperlab" in post
    assert d.script("test").strip().startswith("python -c \"import hopperlab.run.runner")


def test_def_environment_refuses_what_other_runtimes_cannot_carry(tmp_path):
    f = tmp_path / "x.def"
    f.write_text("Bootstrap: docker\nFrom: x\n\n%environment\n    source /etc/profile\n")
    with pytest.raises(DefFileError, match="only 'export NAME=VALUE'"):
        read_def(f).environment
    f.write_text("%environment\n    export A='b c'\n    # note\n    B=1\n")
    assert read_def(f).environment == {"A": "b c", "B": "1"}


def test_the_local_base_replaces_only_the_from_line():
    base = charliecloud.DebianBase.load(CONTAINERS / charliecloud.BASE_FILE)
    assert base.suite == "bookworm" and "python3" in base.packages
    assert base.python == ("torch==2.13.0",)
    cmd = charliecloud.base_command(base, Path("/x/base.tar"))
    assert cmd == ["mmdebstrap", "--variant=minbase", "--format=tar",
                   "--include=python3,python3-pip,ca-certificates", "bookworm", "/x/base.tar"]


# --------------------------------------------------------------------------- ch-run
def test_charliecloud_prefix_is_exactly_the_ch_run_command(tmp_path):
    image = tmp_path / "pytorch.ch"
    got = exec_prefix("charliecloud", image, ["/r", "/a", "/r"], gpus=True,
                      env={"HF_HOME": "/a/hf", "X": "a b"})
    assert got == ["ch-run", "--set-env", "--set-env=HF_HOME=/a/hf", "--set-env=X=a b",
                   "--unset-env=PYTHONPATH", "--unset-env=PYTHONHOME",
                   "--unset-env=PYTHONSTARTUP", "--unset-env=VIRTUAL_ENV",
                   "--unset-env=CONDA_PREFIX", "-b", "/r", "-b", "/a", str(image), "--"]
    with pytest.raises(charliecloud.CharliecloudError, match="SRC\\[:DST\\], no options"):
        exec_prefix("charliecloud", image, ["/data:/data:ro"], gpus=False)


def test_apptainer_prefix_carries_the_site_env_only_when_there_is_one():
    assert exec_prefix("apptainer", "i.sif", ["/r"], gpus=False) == \
        ["apptainer", "exec", "--bind", "/r", "i.sif"]
    assert exec_prefix("apptainer", "i.sif", ["/r"], gpus=True, env={"A": "1"}) == \
        ["apptainer", "exec", "--nv", "--env", "A=1", "--bind", "/r", "i.sif"]


def test_charliecloud_job_prefix_makes_the_mount_points_in_the_image(tmp_path):
    image = tmp_path / "img.ch"
    (image / "ch").mkdir(parents=True)
    results = tmp_path / "work" / "results"
    got = job_exec_prefix("charliecloud", image, [results, tmp_path / "assets"], ["/opt/x:/mnt/x"],
                          gpus=False)
    assert got[-3:] == ["-b", "/opt/x:/mnt/x", str(image)] or got[-1] == "--"
    assert (image / str(results).lstrip("/")).is_dir()
    assert (image / str(tmp_path / "assets").lstrip("/")).is_dir()
    assert (image / "mnt/x").is_dir()


def test_find_runtime_finds_charliecloud_and_pyxis_by_their_binaries(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert find_runtime("charliecloud") is None and find_runtime("pyxis") is None
    for name in ("ch-run", "srun"):
        (tmp_path / name).write_text("#!/bin/sh\n")
        (tmp_path / name).chmod(0o755)
    assert find_runtime("charliecloud") == "charliecloud" and find_runtime("pyxis") == "pyxis"
    assert find_runtime("auto") is None  # auto means the .sif runtimes only


def test_image_paths_per_runtime(tmp_path):
    assert image_path("pytorch", tmp_path, runtime="charliecloud") == tmp_path / "pytorch.ch"
    assert image_path("pytorch", tmp_path, "aarch64", runtime="pyxis") == \
        tmp_path / "pytorch.aarch64.sqsh"
    assert image_path("pytorch", tmp_path) == tmp_path / "pytorch.sif"


# --------------------------------------------------------------------------- digests
def _tree(root: Path) -> Path:
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/bin/tool").write_text("v1")
    (root / "usr/bin/link").symlink_to("tool")
    (root / "ch").mkdir()
    return root


def test_tree_digest_follows_content_and_modes_not_place_or_meta(tmp_path):
    a = _tree(tmp_path / "a")
    first = charliecloud.tree_digest(a)
    b = tmp_path / "b"
    shutil.copytree(a, b, symlinks=True)
    assert charliecloud.tree_digest(b) == first
    (b / charliecloud.META_FILE).write_text("{}")  # the digest's own record is left out
    assert charliecloud.tree_digest(b) == first
    (b / "usr/bin/tool").chmod(0o700)
    assert charliecloud.tree_digest(b) != first
    (a / "usr/bin/tool").write_text("v2")
    assert charliecloud.tree_digest(a) != first
    second = charliecloud.tree_digest(a)
    (a / "work/results").mkdir(parents=True)  # a job's mount point
    (a / ".snakemake_timestamp").write_text("")  # the workflow's mark on a directory output
    assert charliecloud.tree_digest(a) == second


def test_image_digest_of_a_directory_and_of_a_file(tmp_path):
    image = _tree(tmp_path / "p.ch")
    assert image_digest(image, "charliecloud") is None  # not built by hopperlab: no record
    (image / charliecloud.META_FILE).write_text(json.dumps({"digest": "sha256:abc"}))
    assert image_digest(image, "charliecloud") == "sha256:abc"
    sif = tmp_path / "p.sif"
    sif.write_bytes(b"SIF")
    want = "sha256:" + __import__("hashlib").sha256(b"SIF").hexdigest()
    assert image_digest(sif, "apptainer") == want
    assert (tmp_path / ".p.sif.sha256").read_text().split("\n")[1] == want  # kept beside it
    assert image_digest("nvcr.io#nvidia/pytorch:25.12-py3", "pyxis") is None


def test_the_job_sees_its_container_from_inside(tmp_path):
    assert inside_container({}) is None
    (tmp_path / "ch").mkdir()
    (tmp_path / charliecloud.META_FILE).write_text(json.dumps(
        {"image": "pytorch", "digest": "sha256:abc", "base": "debian:bookworm"}))
    seen = inside_container({"CH_RUNNING": "Weird Al Yankovic"}, root=tmp_path)
    assert seen == {"runtime": "charliecloud", "image": "pytorch", "digest": "sha256:abc",
                    "base": "debian:bookworm"}
    seen = inside_container({"APPTAINER_CONTAINER": "/c/p.sif", "HOPPERLAB_IMAGE": "pytorch"})
    assert seen == {"runtime": "apptainer", "image_file": "/c/p.sif", "image": "pytorch"}


# --------------------------------------------------------------------------- pyxis
def test_pyxis_srun_options():
    got = pyxis.srun_args("/c/pytorch.sqsh", ["/r", "/a", "/d:/data:ro", "/r"], workdir="/r")
    assert got == ["--container-image=/c/pytorch.sqsh",
                   "--container-mounts=/r:/r,/a:/a,/d:/data:ro", "--container-workdir=/r"]
    assert pyxis.srun_args("nvcr.io#nvidia/pytorch:25.12-py3", []) == \
        ["--container-image=nvcr.io#nvidia/pytorch:25.12-py3"]
    with pytest.raises(SpecError):
        pyxis.srun_args("/c/p.sqsh", ["/a,b"])
    assert pyxis.env_setup({"A": "x y", "B": 1}) == ["export A='x y'", "export B=1"]
    assert pyxis.has_plugin("  --container-image=[USER@][REGISTRY#]IMAGE[:TAG]|PATH")
    assert not pyxis.has_plugin("Usage: srun [OPTIONS(0)... [executable(0) [args(0)...]]]")


# --------------------------------------------------------------------------- sites
@pytest.fixture(scope="module")
def project(tmp_path_factory):
    return copy_project(tmp_path_factory.mktemp("runtimes") / "project")


def _matrix(project: Path, site: str, **changes):
    path = project / "configs/sites" / f"{site}.yaml"
    if changes:
        base = project / "configs/sites/local-charliecloud.yaml"
        path.write_text(base.read_text())
        edit_yaml(path, lambda d: d.update(changes))
    return load_matrix(project, {"site": site, "only": [KEY]})


def test_a_charliecloud_site_runs_containers_pytorch_ch(project):
    m = _matrix(project, "local-charliecloud")
    c = m.site.container
    assert (c.image, c.runtime, c.existing) == ("pytorch", "charliecloud", False)
    assert c.image_file == str(project / "containers/pytorch.ch")
    assert container_inputs(m) == ["containers/pytorch.ch"]  # the workflow builds it first
    m = _matrix(project, "cc-existing", container_image="/srv/images/hl.ch")
    assert (m.site.container.image_file, m.site.container.existing) == ("/srv/images/hl.ch", True)
    assert container_inputs(m) == []  # an existing image: nothing to build
    m = _matrix(project, "cc-pyxis", container_runtime="pyxis",
                container_image="nvcr.io#nvidia/pytorch:25.12-py3")
    assert m.site.container.image_file == "nvcr.io#nvidia/pytorch:25.12-py3"
    assert container_inputs(m) == []


def test_a_job_whose_image_cannot_start_is_refused_in_one_line(project, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    (tmp_path / "ch-run").write_text("#!/bin/sh\n")
    (tmp_path / "ch-run").chmod(0o755)
    spec = _matrix(project, "local-charliecloud").get(KEY)
    with pytest.raises(SpecError) as err:
        launch.container_runtime(spec)
    text = str(err.value)
    assert "\n" not in text
    assert text.startswith(f"{project}/configs/sites/local-charliecloud.yaml: container: the "
                           f"image {project}/containers/pytorch.ch does not exist")
    assert "snakemake containers/pytorch.ch" in text
    spec = _matrix(project, "cc-missing", container_image="elsewhere.ch").get(KEY)
    with pytest.raises(SpecError, match=r"cc-missing.yaml: container_image: the image .*"
                                        r"elsewhere.ch does not exist"):
        launch.container_runtime(spec)
    image = tmp_path / "img.ch"
    (image / "ch").mkdir(parents=True)
    spec = _matrix(project, "cc-gpu", container_image=str(image)).get(KEY)
    assert launch.container_runtime(spec) == "charliecloud"
    gpu = replace(spec, resources=replace(spec.resources, gpus=1))
    with pytest.raises(SpecError, match=r"cc-gpu.yaml: container_image: the run asks for 1 "
                                        r"GPU\(s\).*ch-fromhost --nvidia"):
        launch.container_runtime(gpu)
    (image / "usr/lib/x86_64-linux-gnu").mkdir(parents=True)
    (image / "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1").write_text("")
    assert launch.container_runtime(gpu) == "charliecloud"


def test_the_job_prefix_applies_the_site_env_and_binds_results_and_assets(project, tmp_path,
                                                                          monkeypatch):
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    (tmp_path / "ch-run").write_text("#!/bin/sh\n")
    (tmp_path / "ch-run").chmod(0o755)
    image = tmp_path / "img.ch"
    (image / "ch").mkdir(parents=True)
    spec = _matrix(project, "cc-env", container_image=str(image)).get(KEY)
    run_dir = project / spec.run_dir
    cmd = launch.job_python(spec, run_dir).split()
    assert cmd[:3] == ["ch-run", "--set-env", "--set-env=HOPPERLAB_SITE=local-charliecloud"]
    binds = [cmd[i + 1] for i, a in enumerate(cmd) if a == "-b"]
    assert binds == [str(project / "results"), str(project / "assets")]
    assert cmd[-2:] == ["--", "python"]


def test_a_pyxis_job_carries_the_image_on_its_srun_line(project, tmp_path, monkeypatch):
    spec = _matrix(project, "cc-pyxis2", container_runtime="pyxis", executor="slurm",
                   container_image="nvcr.io#nvidia/pytorch:25.12-py3").get(KEY)
    run_dir = project / spec.run_dir
    assert launch.container_prefix(spec, run_dir) == []
    assert launch.container_srun_args(spec, run_dir) == [
        "--container-image=nvcr.io#nvidia/pytorch:25.12-py3",
        f"--container-mounts={project}/results:{project}/results,"
        f"{project}/assets:{project}/assets",
        f"--container-workdir={project}/results"]
    # an srun without the plugin: this machine's own, or none at all (plain pytest runs on a
    # machine without Slurm): one on PATH that answers as srun does, options without pyxis's
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "srun").write_text("#!/bin/sh\necho 'Usage: srun [OPTIONS]'\n")
    (fake / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setattr(pyxis, "srun_help", lambda: "Usage: srun [OPTIONS]")
    with pytest.raises(SpecError, match=r"cc-pyxis2.yaml: container_runtime: pyxis, but `srun "
                                        r"--help` here lists no --container-image"):
        launch.container_runtime(spec)


# --------------------------------------------------------------------------- failures, records
def test_start_failures_are_recognised():
    assert start_failure("x\nch-run[77]: error: can't bind: source not found: /nope (ch.c:1)\n")
    assert start_failure("FATAL:   could not open image /c/p.sif: no such file")
    assert start_failure("srun: unrecognized option '--container-image=/c/p.sqsh'")
    assert start_failure("pyxis: importing docker image: nvcr.io#nvidia/pytorch:25.12-py3")
    assert start_failure("Traceback (most recent call last):\nValueError: x") is None


def test_a_container_that_did_not_start_leaves_a_one_line_reason(project, tmp_path):
    spec = _matrix(project, "local-charliecloud").get(KEY)
    err = tmp_path / "job.err"
    err.write_text("ch-run[4242]: error: can't bind: source not found: /nope (ch_core.c:104)\n")
    outcome = launch.JobOutcome(job_id=None, state="FAILED", stderr=err)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    rec = submit._settle_record(run_dir, spec, 1, outcome)
    assert rec["status"] == "failed"
    assert rec["reason"] == (f"{project}/configs/sites/local-charliecloud.yaml: container: the "
                             f"job could not start its container (charliecloud, "
                             f"{project}/containers/pytorch.ch): ch-run[4242]: error: can't bind:"
                             f" source not found: /nope (ch_core.c:104)")
    assert rec["container"]["runtime"] == "charliecloud"
    assert rec["tags"]["container.runtime"] == "charliecloud"


def test_records_carry_the_image_digest_and_runtime(project, tmp_path):
    image = tmp_path / "img.ch"
    (image / "ch").mkdir(parents=True)
    (image / charliecloud.META_FILE).write_text(json.dumps({"digest": "sha256:feed"}))
    spec = _matrix(project, "cc-digest", container_image=str(image)).get(KEY)
    outcome = launch.JobOutcome(job_id=None, state="COMPLETED")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    rec = submit._settle_record(run_dir, spec, 1, outcome)
    assert rec["container"] == {"runtime": "charliecloud", "image": "pytorch",
                                "image_file": str(image), "digest": "sha256:feed"}
    assert rec["tags"]["container.digest"] == "sha256:feed"


# --------------------------------------------------------------------------- other bases
def test_the_def_as_one_script_for_enroot(tmp_path):
    from hopperlab.node.deffile import install_script

    d = read_def(CONTAINERS / "pytorch.def")
    script = install_script(d, "/opt/hopperlab-src")
    head, post = script.split("# %post of pytorch.def\n")
    assert head.splitlines()[3:] == [
        "mkdir -p /opt/hopperlab",
        "cp -a /opt/hopperlab-src/pyproject.toml /opt/hopperlab/pyproject.toml",
        "cp -a /opt/hopperlab-src/README.md /opt/hopperlab/README.md",
        "cp -a /opt/hopperlab-src/src /opt/hopperlab/src"]
    assert post == d.script("post")  # the %post exactly as the .def has it


def test_a_base_root_file_system_keeps_its_own_environment(tmp_path):
    env_file = tmp_path / "environment"
    env_file.write_text("PATH=/usr/local/cuda/bin:/usr/bin\nCUDA_VERSION=13.1\n")
    base = charliecloud.read_env_file(env_file)
    assert base == {"PATH": "/usr/local/cuda/bin:/usr/bin", "CUDA_VERSION": "13.1"}
    d = read_def(CONTAINERS / "pytorch.def")
    assert charliecloud.image_env(d, base) == {
        "PATH": "/usr/local/cuda/bin:/usr/bin", "CUDA_VERSION": "13.1",
        "HOPPERLAB_IMAGE": "pytorch", "PYTHONNOUSERSITE": "1"}
    assert charliecloud.image_env(d, {})["PATH"] == charliecloud.IMAGE_PATH
    assert charliecloud.read_env_file(tmp_path / "none") == {}
    # pip on such a base uses the network as the host reaches it, and never the host's PIP_* files
    got = charliecloud.rootfs_pip_env({"https_proxy": "http://p:3128", "PIP_CONFIG_FILE": "/x"})
    assert got == {"PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_ROOT_USER_ACTION": "ignore",
                   "PIP_BREAK_SYSTEM_PACKAGES": "1", "https_proxy": "http://p:3128"}
    ca = tmp_path / "ca.pem"
    ca.write_text("cert")
    assert charliecloud.host_ca_bundle({"SSL_CERT_FILE": str(ca)}) == ca
    assert charliecloud.host_ca_bundle({"PIP_CERT": str(tmp_path / "none")}) in (
        None, Path(charliecloud.HOST_CA_DEFAULT))
