"""Container images: the .def files, the exec prefix, the site check and the build through spython.

No Apptainer or Singularity exists on these machines (Debian 12 packages neither): where a test
needs to see what would be executed, a tiny fake runtime on PATH records its arguments.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hopperlab.cli.main import main as hopperlab
from hopperlab.core.errors import SpecError
from hopperlab.node.containers import (
    ContainerError,
    build,
    build_command,
    check_site_container,
    exec_prefix,
    find_runtime,
    image_path,
    job_binds,
    resolve_site_runtime,
)

REPO = Path(__file__).resolve().parents[2]
CONTAINERS = REPO / "containers"
DEF_FILES = sorted(CONTAINERS.glob("*.def"))
#: the NGC repository each image must start from, and the form of its pinned tag
PINNED_BASES = {
    "pytorch": re.compile(r"^nvcr\.io/nvidia/pytorch:\d{2}\.\d{2}-py3$"),
    "nemo": re.compile(r"^nvcr\.io/nvidia/nemo:\d{2}\.\d{2}(\.\d+)?$"),
}

FAKE_RUNTIME = """\
#!{python}
# A stand-in for apptainer/singularity: records how it was called; `build` writes its image.
import json, os, sys
record = {{"argv": sys.argv, "binary": os.path.realpath(__file__), "cwd": os.getcwd()}}
with open(os.environ["FAKE_RUNTIME_LOG"], "a") as log:
    log.write(json.dumps(record) + "\\n")
if sys.argv[1:2] == ["--version"]:
    print("{name} version 1.3.4")
    sys.exit(0)
if "build" in sys.argv:
    mode = os.environ.get("FAKE_BUILD", "ok")
    if mode != "no-output":
        with open(sys.argv[-2], "w") as out:
            out.write("partial image" if mode == "fail" else "SIF built from " + sys.argv[-1])
    if mode == "fail":
        print("FATAL: build failed on purpose", file=sys.stderr)
        sys.exit(255)
sys.exit(0)
"""


@pytest.fixture
def fake_bin(tmp_path, monkeypatch):
    """A PATH holding only the fake runtimes that a test installs (and nothing else)."""
    folder = tmp_path / "bin"
    folder.mkdir()
    log = tmp_path / "runtime.log"
    monkeypatch.setenv("PATH", str(folder))
    monkeypatch.setenv("FAKE_RUNTIME_LOG", str(log))

    def install(*names: str) -> Path:
        for name in names:
            script = folder / name
            script.write_text(FAKE_RUNTIME.format(python=sys.executable, name=name))
            script.chmod(0o755)
        return folder

    install.log = log  # type: ignore[attr-defined]
    install.calls = lambda: [json.loads(line) for line in log.read_text().splitlines()] \
        if log.exists() else []  # type: ignore[attr-defined]
    return install


# --------------------------------------------------------------------------- .def files
def test_both_images_have_a_definition_file():
    assert {p.stem for p in DEF_FILES} >= {"pytorch", "nemo"}


@pytest.mark.parametrize("def_file", DEF_FILES, ids=lambda p: p.stem)
def test_def_parses_with_spython_and_names_a_pinned_base(def_file):
    from spython.main.parse.parsers import SingularityParser

    lines = [ln.strip() for ln in def_file.read_text().splitlines() if ln.strip()]
    assert lines[0] == "Bootstrap: docker"  # the runtimes want Bootstrap as the first entry
    recipe = SingularityParser(str(def_file)).recipe
    assert list(recipe) == ["spython-base"], "one stage"
    layer = recipe["spython-base"]
    base = layer.fromHeader
    assert base and PINNED_BASES[def_file.stem].match(base), base
    assert "latest" not in base
    assert f"From: {base}" in lines  # the parser read the header's From, not some comment
    labels = dict(label.split(None, 1) for label in layer.labels)
    assert labels["org.hopperlab.base"] == base
    assert labels["org.hopperlab.image"] == def_file.stem
    # hopperlab goes in from this checkout: every %files source exists in the build context
    # (the project root), and %post installs it
    for entry in layer.files:
        source = entry.split()[0]
        assert (REPO / source).exists(), f"{def_file.name}: %files source {source} is missing"
    install = "\n".join(layer.install)
    assert "pip install --no-cache-dir /opt/hopperlab" in install
    assert "PIP_CONSTRAINT=" in install
    assert "import hopperlab.run.runner, submitit, torch" in install  # the %test script


def test_the_constraint_pattern_pins_the_torch_stack_and_nothing_else():
    """The grep in %post keeps NGC's torch/CUDA stack at its installed versions, only that."""
    script = (CONTAINERS / "pytorch.def").read_text()
    pattern = re.search(r"grep -Ei '([^']+)'", script).group(1)
    installed = ["torch==2.10.0a0+b4e4ee81d3", "torchvision==0.25.0a0", "numpy==1.26.4",
                 "nvidia-cudnn-cu13==9.13", "nvidia_nccl_cu13==2.27.7", "triton==3.5.0",
                 "transformer_engine==2.9.0", "apex==0.1", "flash_attn==2.7.4",
                 "torchmetrics==1.6", "requests==2.32.3", "numpydoc==1.8", "PyYAML==6.0.2"]
    kept = [line for line in installed if re.match(pattern, line, re.IGNORECASE)]
    assert kept == installed[:9]


# --------------------------------------------------------------------------- exec prefix
@pytest.mark.parametrize("runtime", ["apptainer", "singularity"])
def test_exec_prefix_is_exactly_the_runtime_command(runtime):
    image = Path("/proj/containers/pytorch.sif")
    binds = ["/proj/results", "/data/assets"]
    assert exec_prefix(runtime, image, binds, gpus=True) == [
        runtime, "exec", "--nv", "--bind", "/proj/results,/data/assets",
        "/proj/containers/pytorch.sif"]
    assert exec_prefix(runtime, image, binds, gpus=False) == [
        runtime, "exec", "--bind", "/proj/results,/data/assets", "/proj/containers/pytorch.sif"]
    assert exec_prefix(runtime, image, [], gpus=True) == [
        runtime, "exec", "--nv", "/proj/containers/pytorch.sif"]
    # duplicates go, src:dest:opts entries pass through as written
    assert exec_prefix(runtime, image, ["/a", "/a", "/b:/in:ro"], gpus=False) == [
        runtime, "exec", "--bind", "/a,/b:/in:ro", "/proj/containers/pytorch.sif"]


def test_exec_prefix_refuses_what_the_runtime_would_misread():
    with pytest.raises(ValueError, match="docker"):
        exec_prefix("docker", "x.sif", [], gpus=False)
    with pytest.raises(ValueError, match="','"):
        exec_prefix("apptainer", "x.sif", ["/data/a,b"], gpus=False)
    with pytest.raises(ValueError):
        exec_prefix("apptainer", "x.sif", [""], gpus=False)


def test_exec_prefix_reaches_the_runtime_argument_for_argument(fake_bin, tmp_path):
    """A path with spaces stays one argument, directly and through submitit's shell line."""
    fake_bin("apptainer")
    results = tmp_path / "my results"
    prefix = exec_prefix("apptainer", tmp_path / "img dir" / "pytorch.sif",
                         job_binds([results, tmp_path / "assets"]), gpus=True)
    command = prefix + ["python", "-u", "-m", "submitit.core._submit", "/x"]
    subprocess.run(command, check=True)
    subprocess.run(["/bin/sh", "-c", shlex.join(command)], check=True)
    calls = fake_bin.calls()
    assert [c["argv"][1:] for c in calls] == [command[1:], command[1:]]
    assert calls[0]["argv"][4] == f"{results},{tmp_path / 'assets'}"


def test_job_binds_are_absolute_deduplicated_and_created(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    binds = job_binds(["results", tmp_path / "results", "results/membench", "assets"],
                      extra=["/scratch:/scratch:ro"])
    assert binds == [str(tmp_path / "results"), str(tmp_path / "assets"), "/scratch:/scratch:ro"]
    assert (tmp_path / "assets").is_dir()
    with pytest.raises(ValueError, match="','"):
        job_binds([tmp_path / "a,b"])
    with pytest.raises(ValueError):
        job_binds([tmp_path / "a:b"])


def test_image_path_and_names(tmp_path):
    assert image_path("pytorch", tmp_path) == tmp_path / "pytorch.sif"
    for bad in ("../x", "a/b", "", "pytorch.sif", "-x"):
        with pytest.raises(ValueError):
            image_path(bad, tmp_path)


# --------------------------------------------------------------------------- runtime and site
def test_find_runtime_looks_on_path(fake_bin):
    assert find_runtime(None) is None
    fake_bin("singularity")
    assert find_runtime(None) == "singularity"
    assert find_runtime("auto") == "singularity"
    assert find_runtime("apptainer") is None  # asked for apptainer: no fallback
    fake_bin("apptainer")
    assert find_runtime(None) == "apptainer"  # apptainer first
    assert find_runtime("singularity") == "singularity"
    with pytest.raises(ValueError):
        find_runtime("docker")


def test_site_without_a_container_needs_no_runtime(fake_bin):
    assert check_site_container("configs/sites/slurm.yaml", "apptainer", None) is None
    assert resolve_site_runtime("configs/sites/slurm.yaml", "auto", None) is None


def test_site_asking_for_a_container_without_runtime_fails_naming_site_key_and_binary(fake_bin):
    with pytest.raises(SpecError) as err:
        check_site_container("configs/sites/gh200.yaml", "apptainer", "pytorch")
    text = str(err.value)
    assert text.startswith("configs/sites/gh200.yaml: container_runtime:")
    assert "`apptainer` is not on PATH" in text and "container: pytorch" in text
    with pytest.raises(SpecError) as err:
        check_site_container("configs/sites/gh200.yaml", "auto", "pytorch")
    text = str(err.value)
    assert text.startswith("configs/sites/gh200.yaml: container: 'pytorch'")
    assert "`apptainer`" in text and "`singularity`" in text
    fake_bin("singularity")
    with pytest.raises(SpecError, match="`apptainer` is not on PATH"):  # no silent fallback
        check_site_container("configs/sites/gh200.yaml", "apptainer", "pytorch")
    assert resolve_site_runtime("configs/sites/gh200.yaml", "auto", "pytorch") == "singularity"
    assert check_site_container("configs/sites/gh200.yaml", "singularity", "pytorch") is None


def test_site_container_settings_that_cannot_work(fake_bin):
    fake_bin("apptainer")
    with pytest.raises(SpecError, match=r"x.yaml: container_runtime: is 'none'"):
        check_site_container("x.yaml", "none", "pytorch")
    with pytest.raises(SpecError, match=r"x.yaml: container_runtime: unknown container runtime"):
        check_site_container("x.yaml", "docker", "pytorch")
    with pytest.raises(SpecError, match=r"x.yaml: container: 'pytorch.sif': name the image"):
        check_site_container("x.yaml", "auto", "pytorch.sif")
    with pytest.raises(SpecError, match=r"no image 'tensorflow'.*pytorch"):
        check_site_container("x.yaml", "auto", "tensorflow", containers_dir=CONTAINERS)
    check_site_container("x.yaml", "auto", "nemo", containers_dir=CONTAINERS)
    with pytest.raises(SpecError, match=r"x.yaml: site.image:"):  # the lead may name keys
        check_site_container("x.yaml", "auto", "a/b", image_key="site.image")


# --------------------------------------------------------------------------- build
def _spython_build(def_file: Path, sif: Path, fakeroot: bool) -> None:
    """What a plain spython user would do (spython runs `singularity` from PATH)."""
    from spython.main import get_client

    client = get_client()
    client.build(recipe=str(def_file), image=str(sif), sudo=False,
                 options=["--fakeroot"] if fakeroot else [], quiet=True)


@pytest.mark.parametrize("fakeroot", [True, False])
def test_build_command_is_what_spython_runs(fake_bin, tmp_path, fakeroot):
    fake_bin("singularity")
    def_file, sif = CONTAINERS / "pytorch.def", tmp_path / "out" / "pytorch.sif"
    _spython_build(def_file, sif, fakeroot)
    builds = [c["argv"] for c in fake_bin.calls() if "build" in c["argv"]]
    assert len(builds) == 1
    ran = [os.path.basename(builds[0][0])] + builds[0][1:]
    assert ran == build_command(def_file, sif, "singularity", fakeroot)
    assert build_command(def_file, sif, "apptainer", fakeroot) == ["apptainer"] + ran[1:]
    expected = ["build"] + (["--fakeroot"] if fakeroot else []) + [str(sif), str(def_file)]
    assert ran[1:] == expected


def test_build_runs_apptainer_through_spython_and_moves_the_image_into_place(
        fake_bin, tmp_path, monkeypatch):
    fake_bin("apptainer")  # apptainer only: no `singularity` anywhere on PATH
    monkeypatch.setenv("MESSAGELEVEL", "QUIET")  # would make spython add --quiet
    target = tmp_path / "images" / "pytorch.sif"
    out = build(CONTAINERS / "pytorch.def", target, "apptainer", fakeroot=True, context=REPO)
    assert out == target and target.read_text().startswith("SIF built from ")
    calls = [c for c in fake_bin.calls() if "build" in c["argv"]]
    assert len(calls) == 1
    call = calls[0]
    assert call["binary"] == str((tmp_path / "bin" / "apptainer").resolve())
    partial = Path(call["argv"][-2])
    assert call["argv"][1:] == build_command(CONTAINERS / "pytorch.def", partial,
                                             "apptainer", True)[1:]
    assert partial.parent == target.parent and partial.name.startswith(".pytorch.")
    assert call["cwd"] == str(REPO)  # %files sources are relative to the project root
    assert sorted(p.name for p in target.parent.iterdir()) == ["pytorch.sif"]
    assert os.environ["PATH"] == str(tmp_path / "bin")  # the shim folder is gone again


def test_a_failed_build_leaves_no_image_and_keeps_the_old_one(fake_bin, tmp_path, monkeypatch,
                                                                capsys):
    fake_bin("singularity")
    target = tmp_path / "pytorch.sif"
    target.write_text("the previous image")
    monkeypatch.setenv("FAKE_BUILD", "fail")
    with pytest.raises(ContainerError, match="exit status 255"):
        build(CONTAINERS / "pytorch.def", target, "singularity", fakeroot=False, context=REPO)
    assert target.read_text() == "the previous image"
    assert sorted(p.name for p in tmp_path.iterdir() if "pytorch" in p.name) == ["pytorch.sif"]
    assert "build failed on purpose" in capsys.readouterr().err  # the runtime's stderr is shown
    monkeypatch.setenv("FAKE_BUILD", "no-output")
    target.unlink()
    with pytest.raises(ContainerError, match="wrote no image"):
        build(CONTAINERS / "pytorch.def", target, "singularity", fakeroot=False, context=REPO)
    assert not target.exists()


def test_build_needs_its_runtime_and_spython(fake_bin, tmp_path, monkeypatch):
    with pytest.raises(ContainerError, match="`apptainer` is not on PATH"):
        build(CONTAINERS / "nemo.def", tmp_path / "nemo.sif", "apptainer", fakeroot=False)
    fake_bin("apptainer")
    monkeypatch.setitem(sys.modules, "spython.main", None)
    with pytest.raises(ContainerError, match="needs spython"):
        build(CONTAINERS / "nemo.def", tmp_path / "nemo.sif", "apptainer", fakeroot=False)


def test_module_imports_without_spython():
    code = ("import sys; sys.modules['spython'] = None\n"
            "import hopperlab.node.containers as c\n"
            "print(c.exec_prefix('singularity', 'i.sif', ['/r'], True))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['singularity', 'exec', '--nv', '--bind', '/r', 'i.sif']"


# --------------------------------------------------------------------------- command line
def test_cli_command_and_runtime(fake_bin, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    assert hopperlab(["containers", "command", "nemo", "--runtime", "singularity", "--fakeroot"]) == 0
    assert capsys.readouterr().out.split() == [
        "singularity", "build", "--fakeroot", "containers/nemo.sif", "containers/nemo.def"]
    assert hopperlab(["containers", "runtime"]) == 1  # an answer: none found
    assert "`apptainer or singularity or charliecloud` is not on PATH" in capsys.readouterr().err
    assert hopperlab(["containers", "build", "nemo", "--runtime", "apptainer",
                      "--output", str(tmp_path / "n.sif")]) == 2  # an expected error
    assert "`apptainer` is not on PATH" in capsys.readouterr().err
    fake_bin("apptainer")
    assert hopperlab(["containers", "runtime"]) == 0
    assert capsys.readouterr().out.strip() == "apptainer"
    assert hopperlab(["containers", "build", "nosuch", "--output", str(tmp_path / "n.sif")]) == 2
    assert "no such definition file (images: nemo, pytorch)" in capsys.readouterr().err


# --------------------------------------------------------------------------- the rule
@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
def test_rule_builds_the_image_and_rebuilds_when_the_def_changes(fake_bin, tmp_path):
    """containers.smk in a scratch workflow: builds through the CLI, reruns on a .def change."""
    project = tmp_path / "project"
    (project / "containers").mkdir(parents=True)
    (project / "src").mkdir()
    (project / "containers" / "tiny.def").write_text(
        "Bootstrap: docker\nFrom: nvcr.io/nvidia/pytorch:25.12-py3\n\n%files\n    src /opt/src\n")
    (project / "Snakefile").write_text(textwrap.dedent(f"""\
        from types import SimpleNamespace
        SETTINGS = SimpleNamespace(runtime="apptainer", fakeroot=True)
        MATRIX = SimpleNamespace(site=SimpleNamespace(container=SETTINGS))
        HOPPERLAB = {shlex.quote(sys.executable) + " -m hopperlab.cli"!r}
        include: {str(REPO / "workflow" / "rules" / "containers.smk")!r}
        """))
    fake_bin("apptainer")
    env = {**os.environ, "PATH": os.pathsep.join([str(tmp_path / "bin"),
                                                  str(Path(sys.executable).parent), "/usr/bin",
                                                  "/bin"])}
    snakemake = [sys.executable, "-m", "snakemake", "--cores", "1", "containers/tiny.sif"]

    def run(*extra: str) -> str:
        out = subprocess.run(snakemake + list(extra), cwd=project, env=env, text=True,
                             capture_output=True, timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr
        return out.stdout + out.stderr

    run()
    sif = project / "containers" / "tiny.sif"
    assert sif.read_text().startswith("SIF built from ")
    builds = [c for c in fake_bin.calls() if "build" in c["argv"]]
    assert len(builds) == 1 and builds[0]["cwd"] == str(project)
    assert builds[0]["argv"][1:3] == ["build", "--fakeroot"]
    assert builds[0]["argv"][-1] == str(project / "containers" / "tiny.def")
    assert "Nothing to be done" in run("-n")
    definition = project / "containers" / "tiny.def"
    definition.write_text(definition.read_text() + "\n%labels\n    changed yes\n")
    assert "container_image" in run("-n")
    run()
    assert len([c for c in fake_bin.calls() if "build" in c["argv"]]) == 2
