"""Container images for the jobs: build ``containers/<name>.sif`` from ``containers/<name>.def``
(spython), and the one exec prefix that runs a job's python inside such an image.

Runtimes: ``apptainer`` or ``singularity`` (the site's choice, or whichever is on PATH). The
prefix is an argument list, never a shell string: ``[runtime, "exec", ("--nv",) "--bind",
"<paths>", "<image>.sif"]``. spython is imported only when an image is built. How the build and
the binds work: docs/node.md.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import socket
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from hopperlab.core.errors import NodeError, SpecError

#: the runtimes we know, in the order ``auto`` tries them
RUNTIMES = ("apptainer", "singularity")
#: the site keys (configs/sites/<site>.yaml) that ask for an image and name its runtime
SITE_IMAGE_KEY = "container"
SITE_RUNTIME_KEY = "container_runtime"
#: a valid image name: the stem of containers/<name>.def
IMAGE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
DEF_SUFFIX = ".def"
SIF_SUFFIX = ".sif"


class ContainerError(NodeError):
    """An image could not be built (no runtime, no spython, a failed build)."""


# --------------------------------------------------------------------------- names and paths
def check_image_name(name: str) -> str:
    """``name`` if it names an image (``pytorch``, ``nemo``); ValueError otherwise."""
    if not isinstance(name, str) or not IMAGE_NAME.match(name):
        raise SpecError(f"{name!r} is not an image name (letters, digits, '.', '_', '-'; "
                         f"the stem of containers/<name>{DEF_SUFFIX})")
    for suffix in (DEF_SUFFIX, SIF_SUFFIX):
        if name.endswith(suffix):
            raise SpecError(f"{name!r}: name the image without {suffix} "
                             f"(e.g. {name[:-len(suffix)]!r})")
    return name


def image_path(name: str, images_dir: Path | str, arch: str | None = None) -> Path:
    """Where the image ``name`` lives: ``<images_dir>/<name>.sif``, or ``<name>.<arch>.sif`` for
    a site whose GPU nodes say their architecture (``gpu_arch``): an image runs only on the
    architecture it was built on, and x86 and aarch64 images may share one folder."""
    suffix = f".{arch}" if arch else ""
    return Path(images_dir) / f"{check_image_name(name)}{suffix}{SIF_SUFFIX}"


def check_build_arch(target: str | None, here: str) -> None:
    """Refuse to build an image for another architecture than the building machine's (an NGC
    base pulled on x86 gives an x86 image, whatever the name says)."""
    if target and target != here:
        raise ContainerError(f"this image is for {target} GPU nodes, but this machine is {here}: "
                             f"build it on one of those nodes (e.g. srun ... hopperlab "
                             f"containers build NAME --arch {target})")


def def_path(name: str, containers_dir: Path | str) -> Path:
    """The definition file of the image ``name``: ``<containers_dir>/<name>.def``."""
    return Path(containers_dir) / f"{check_image_name(name)}{DEF_SUFFIX}"


def known_images(containers_dir: Path | str) -> list[str]:
    """The image names that have a definition file in ``containers_dir``."""
    return sorted(p.stem for p in Path(containers_dir).glob(f"*{DEF_SUFFIX}"))


# --------------------------------------------------------------------------- runtime
def find_runtime(preferred: str | None = None) -> str | None:
    """The container runtime to use, by name, if it is on PATH; else None.

    ``preferred`` None or ``"auto"``: apptainer, else singularity. ``"apptainer"`` or
    ``"singularity"``: that one only (no silent fallback to the other).
    """
    if preferred in (None, "auto"):
        candidates: Sequence[str] = RUNTIMES
    elif preferred in RUNTIMES:
        candidates = (preferred,)
    else:
        raise SpecError(f"unknown container runtime {preferred!r}; "
                         f"expected auto, {' or '.join(RUNTIMES)}")
    for name in candidates:
        if shutil.which(name):
            return name
    return None


def check_site_image(site_source: str, runtime_setting: str | None, image_name: str | None,
                     *, containers_dir: Path | str | None = None,
                     image_key: str = SITE_IMAGE_KEY,
                     runtime_key: str = SITE_RUNTIME_KEY) -> str | None:
    """The site's runtime setting (auto, apptainer or singularity), None without a container.

    Checks what the files say, never the machine: the image name, its definition file (or
    image) in ``containers_dir``, and a runtime setting that can run it. Raises SpecError naming
    the site file and the key.
    """
    if image_name in (None, ""):
        return None
    setting = runtime_setting or "auto"
    try:
        check_image_name(image_name)
    except ValueError as exc:
        raise SpecError(f"{site_source}: {image_key}: {exc}") from None
    if containers_dir is not None:
        cdir = Path(containers_dir)
        if not def_path(image_name, cdir).exists() and not image_path(image_name, cdir).exists():
            known = ", ".join(known_images(cdir)) or "none"
            raise SpecError(f"{site_source}: {image_key}: no image {image_name!r}: neither "
                            f"{def_path(image_name, cdir)} nor {image_path(image_name, cdir)} "
                            f"exists (definition files there: {known})")
    if setting == "none":
        raise SpecError(f"{site_source}: {runtime_key}: is 'none', but {image_key}: "
                        f"{image_name!r} asks to run every job in a container; set {runtime_key} "
                        f"to auto, apptainer or singularity, or {image_key}: null")
    if setting not in ("auto",) + RUNTIMES:
        raise SpecError(f"{site_source}: {runtime_key}: unknown container runtime {setting!r}; "
                        f"expected auto, {' or '.join(RUNTIMES)}")
    return setting


def resolve_site_runtime(site_source: str, runtime_setting: str | None, image_name: str | None,
                         **kwargs: object) -> str | None:
    """The runtime binary a site's jobs will use on this machine, None without a container.

    Looks on PATH (the submitting side's check, never the spec's): raises SpecError, naming the
    site file, the key and the missing binary, when the site asks for an image and this machine
    has no runtime for it. Keyword arguments as for :func:`check_site_image`.
    """
    image_key = str(kwargs.get("image_key", SITE_IMAGE_KEY))
    runtime_key = str(kwargs.get("runtime_key", SITE_RUNTIME_KEY))
    setting = check_site_image(site_source, runtime_setting, image_name,
                               **kwargs)  # type: ignore[arg-type]
    if setting is None:
        return None
    try:
        found = find_runtime(setting)
    except ValueError as exc:
        raise SpecError(f"{site_source}: {runtime_key}: {exc}") from None
    if found:
        return found
    host = socket.gethostname()
    if setting == "auto":
        raise SpecError(
            f"{site_source}: {image_key}: {image_name!r} runs every job in a container, but "
            f"neither `apptainer` nor `singularity` is on PATH on {host}; install one (or load "
            f"its module before running), name it with {runtime_key}, or set {image_key}: null")
    raise SpecError(
        f"{site_source}: {runtime_key}: {setting!r}, but `{setting}` is not on PATH on {host} "
        f"(the site runs every job in the container {image_name!r}, {image_key}: {image_name}); "
        f"install {setting} (or load its module before running), or set {image_key}: null")


def check_site_container(site_source: str, runtime_setting: str | None, image_name: str | None,
                         **kwargs: object) -> None:
    """Refuse (SpecError) a site that asks for a container this machine cannot run.

    Nothing to check when ``image_name`` is None. Keyword arguments as for
    :func:`resolve_site_runtime`.
    """
    resolve_site_runtime(site_source, runtime_setting, image_name,
                         **kwargs)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- exec prefix
def job_binds(paths: Iterable[Path | str], extra: Iterable[str] = (), *,
              create: bool = True) -> list[str]:
    """Host folders to bind at the same path inside the container, as absolute paths.

    ``paths`` (results, assets, ...) are resolved, created when ``create`` (the runtimes refuse
    to bind a missing folder), and dropped when inside another one already bound. ``extra``
    entries (``src[:dest[:opts]]`` from the site file) are kept as written, after them.
    """
    resolved: list[Path] = []
    for p in paths:
        path = Path(p).expanduser().resolve()
        text = str(path)
        if "," in text or ":" in text:
            raise SpecError(f"{text}: cannot bind a path holding ',' or ':' "
                             f"(the runtimes split --bind values on them)")
        if create:
            path.mkdir(parents=True, exist_ok=True)
        resolved.append(path)
    kept: list[str] = []
    for path in resolved:
        if any(other != path and other in path.parents for other in resolved):
            continue
        if str(path) not in kept:
            kept.append(str(path))
    for spec in extra:
        if spec not in kept:
            kept.append(spec)
    return kept


def job_exec_prefix(runtime: str, image: Path | str, folders: Iterable[Path | str],
                    extra_binds: Iterable[str] = (), *, gpus: bool) -> list[str]:
    """The exec prefix of a job that reads and writes ``folders`` (results, assets...) inside
    ``image``: the one place that turns a job's folders into binds (``job_binds``)."""
    return exec_prefix(runtime, image, job_binds(folders, extra_binds), gpus=gpus)


def exec_prefix(runtime: str, image: Path | str, binds: Sequence[str], gpus: bool) -> list[str]:
    """``[runtime, "exec", ("--nv",) ("--bind", "a,b",) image]``: what goes before ``python``.

    One ``--bind`` whose value is the comma-joined ``binds`` (left out when there are none);
    ``--nv`` only when ``gpus``. An argument list for subprocess/submitit, never a shell string.
    """
    if runtime not in RUNTIMES:
        raise SpecError(f"unknown container runtime {runtime!r}; expected {' or '.join(RUNTIMES)}")
    specs: list[str] = []
    for spec in binds:
        if not spec or "," in spec:
            raise SpecError(f"bind {spec!r}: empty, or holds a ',' (which separates binds)")
        if spec not in specs:
            specs.append(spec)
    cmd = [runtime, "exec"]
    if gpus:
        cmd.append("--nv")
    if specs:
        cmd += ["--bind", ",".join(specs)]
    cmd.append(str(image))
    return cmd


# --------------------------------------------------------------------------- build
def build_command(def_path: Path | str, sif_path: Path | str, runtime: str,
                  fakeroot: bool) -> list[str]:
    """The command spython's ``Client.build`` runs for this image, with ``runtime`` as the binary.

    spython 0.3.x exposes no command builder apart from running it, so this mirrors what it
    assembles for ``build(recipe, image, sudo=False, options=[...])`` on a client that is
    neither quiet nor debug (as :func:`build` makes it): ``binary build [options] image recipe``.
    tests/test_containers.py checks it against the command spython really starts.
    """
    if runtime not in RUNTIMES:
        raise SpecError(f"unknown container runtime {runtime!r}; expected {' or '.join(RUNTIMES)}")
    cmd = [runtime, "build"]
    if fakeroot:
        cmd.append("--fakeroot")
    return cmd + [str(sif_path), str(def_path)]


def _spython_client():  # noqa: ANN202 - spython has no types
    try:
        from spython.main import get_client
    except ImportError as exc:
        raise ContainerError(f"building an image needs spython ({exc}); "
                             f"install it: pip install 'spython>=0.3.14'") from None
    client = get_client(quiet=True)
    # A quiet or debug client puts --quiet/--debug into the command (MESSAGELEVEL=QUIET in the
    # environment makes it quiet): keep the command exactly build_command's.
    client.quiet = False
    client.debug = False
    return client


@contextlib.contextmanager
def _as_singularity(binary: str) -> Iterator[None]:
    """PATH with a first folder in which ``singularity`` is ``binary`` (spython runs that name)."""
    with tempfile.TemporaryDirectory(prefix="hopperlab-runtime-") as shim:
        os.symlink(binary, os.path.join(shim, "singularity"))
        old = os.environ.get("PATH")
        os.environ["PATH"] = shim + (os.pathsep + old if old else "")
        try:
            yield
        finally:
            if old is None:
                os.environ.pop("PATH", None)
            else:
                os.environ["PATH"] = old


@contextlib.contextmanager
def _working_dir(path: Path) -> Iterator[None]:
    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def partial_path(sif_path: Path) -> Path:
    """A fresh temporary name beside ``sif_path`` (same filesystem, so the final move is atomic;
    new each time, so the runtime never finds an existing target and stops to ask)."""
    return sif_path.with_name(f".{sif_path.stem}.{os.getpid()}.{uuid.uuid4().hex[:8]}.partial"
                              f"{SIF_SUFFIX}")


def build(def_path: Path | str, sif_path: Path | str, runtime: str, fakeroot: bool, *,
          context: Path | str | None = None) -> Path:
    """Build ``sif_path`` from ``def_path`` through spython with ``runtime``; return its path.

    ``context`` is the folder the build runs in: relative ``%files`` sources in the definition
    file are taken from there. Default: the folder above the definition file's (the project root
    for containers/<name>.def). The image appears at ``sif_path`` only when the build succeeded;
    a failed build leaves any previous image there untouched. Raises ContainerError.

    It changes the process's PATH and working folder while the build runs (spython offers no
    other way): call it from one thread, as ``hopperlab containers build`` does.
    """
    def_file = Path(def_path).resolve()
    target = Path(sif_path).resolve()
    if runtime not in RUNTIMES:
        raise ContainerError(f"unknown container runtime {runtime!r}; "
                             f"expected {' or '.join(RUNTIMES)}")
    if not def_file.is_file():
        raise ContainerError(f"{def_file}: no such definition file")
    binary = shutil.which(runtime)
    if binary is None:
        raise ContainerError(f"cannot build {target.name}: `{runtime}` is not on PATH")
    workdir = Path(context).resolve() if context is not None else def_file.parent.parent
    client = _spython_client()
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = partial_path(target)
    results: list[object] = []
    run_command = client._run_command  # spython's build drops the exit status: keep it

    def recording_run_command(cmd, *args, **kwargs):  # noqa: ANN001, ANN202
        out = run_command(cmd, *args, **kwargs)
        results.append(out)
        return out

    client._run_command = recording_run_command
    print(f"hopperlab: building {target} in {workdir}:\n  "
          f"{shlex.join(build_command(def_file, partial, runtime, fakeroot))}", file=sys.stderr)
    try:
        with _as_singularity(binary), _working_dir(workdir):
            client.build(recipe=str(def_file), image=str(partial), sudo=False,
                         options=["--fakeroot"] if fakeroot else [], return_result=True,
                         quiet=True)
        result = results[-1] if results else None
        code = result.get("return_code") if isinstance(result, dict) else None
        if isinstance(result, dict) and result.get("message"):
            message = result["message"]
            text = message if isinstance(message, str) else "".join(message)
            sys.stderr.write(text if text.endswith("\n") else text + "\n")
        if code != 0:
            raise ContainerError(f"{runtime} build of {def_file} failed (exit status {code})")
        if not partial.is_file():
            raise ContainerError(f"{runtime} build of {def_file} exited 0 but wrote no image")
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return target
