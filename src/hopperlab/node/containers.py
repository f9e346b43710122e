"""Container images for the jobs: build ``containers/<name>.sif`` from ``containers/<name>.def``
(spython), and the one exec prefix that runs a job's python inside such an image.

Runtimes: ``apptainer`` or ``singularity`` (``auto``: whichever is on PATH) run ``.sif`` images;
``charliecloud`` runs a directory image ``<name>.ch`` with ``ch-run`` (``node.charliecloud``, the
runtime these Debian machines have); ``pyxis`` hands the image to Slurm's srun (enroot + pyxis,
``backends/slurm/pyxis.py``: no prefix, srun options instead). The prefix is an argument list, never a shell
string: ``[runtime, "exec", ("--nv",) "--bind", "<paths>", "<image>.sif"]``. spython is imported
only when an image is built. How the build and the binds work: containers/README.md.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shlex
import shutil
import socket
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Iterable, Iterator, Mapping, Sequence

from hopperlab.core.errors import NodeError, SpecError
from hopperlab.node import charliecloud

#: the runtimes of .sif images, in the order ``auto`` tries them
RUNTIMES = ("apptainer", "singularity")
CHARLIECLOUD = charliecloud.RUNTIME
#: enroot + pyxis: Slurm's srun starts the task inside the image (backends/slurm/pyxis.py);
#: what must be on PATH where jobs are submitted is srun, the image an enroot file
PYXIS, PYXIS_BINARY, PYXIS_IMAGE_SUFFIX = "pyxis", "srun", ".sqsh"
#: every value of a site's ``container_runtime`` besides ``auto``
ALL_RUNTIMES = RUNTIMES + (CHARLIECLOUD, PYXIS)
#: the binary each runtime needs on PATH where the workflow runs
BINARIES = {"apptainer": "apptainer", "singularity": "singularity",
            CHARLIECLOUD: charliecloud.RUN_BINARY, PYXIS: PYXIS_BINARY}
SITE_BINDS_KEY = "container_binds"
#: the site key that points at an existing image instead of building containers/<name>.*
SITE_EXISTING_KEY = "container_image"
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


def image_suffix(runtime: str | None) -> str:
    """The image a runtime runs: ``.sif``; a Charliecloud directory ``.ch``; enroot's ``.sqsh``."""
    return {CHARLIECLOUD: charliecloud.IMAGE_SUFFIX, PYXIS: PYXIS_IMAGE_SUFFIX}.get(
        runtime or "", SIF_SUFFIX)


def image_path(name: str, images_dir: Path | str, arch: str | None = None,
               runtime: str | None = None) -> Path:
    """Where the image ``name`` lives: ``<images_dir>/<name>.sif`` (``.ch``, ``.sqsh`` for
    charliecloud, pyxis), or ``<name>.<arch>.sif`` for a site whose GPU nodes say their
    architecture (``gpu_arch``): an image runs only on the architecture it was built on, and x86
    and aarch64 images may share one folder."""
    suffix = f".{arch}" if arch else ""
    return Path(images_dir) / f"{check_image_name(name)}{suffix}{image_suffix(runtime)}"


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

    ``preferred`` None or ``"auto"``: apptainer, else singularity. Any other runtime: that one
    only (no silent fallback), found by its binary (``ch-run`` for charliecloud, ``srun`` for
    pyxis).
    """
    if preferred in (None, "auto"):
        candidates: Sequence[str] = RUNTIMES
    elif preferred in ALL_RUNTIMES:
        candidates = (preferred,)
    else:
        raise SpecError(f"unknown container runtime {preferred!r}; "
                         f"expected auto, {', '.join(ALL_RUNTIMES)}")
    for name in candidates:
        if shutil.which(BINARIES[name]):
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
    if containers_dir is not None and setting not in (CHARLIECLOUD, PYXIS):
        cdir = Path(containers_dir)
        if not def_path(image_name, cdir).exists() and not image_path(image_name, cdir).exists():
            known = ", ".join(known_images(cdir)) or "none"
            raise SpecError(f"{site_source}: {image_key}: no image {image_name!r}: neither "
                            f"{def_path(image_name, cdir)} nor {image_path(image_name, cdir)} "
                            f"exists (definition files there: {known})")
    if setting == "none":
        raise SpecError(f"{site_source}: {runtime_key}: is 'none', but {image_key}: "
                        f"{image_name!r} asks to run every job in a container; set {runtime_key} "
                        f"to auto or one of {', '.join(ALL_RUNTIMES)}, or {image_key}: null")
    if setting not in ("auto",) + ALL_RUNTIMES:
        raise SpecError(f"{site_source}: {runtime_key}: unknown container runtime {setting!r}; "
                        f"expected auto, {', '.join(ALL_RUNTIMES)}")
    if containers_dir is not None and setting == CHARLIECLOUD:
        cdir = Path(containers_dir)
        if not def_path(image_name, cdir).exists() and \
                not image_path(image_name, cdir, runtime=setting).exists():
            known = ", ".join(known_images(cdir)) or "none"
            raise SpecError(f"{site_source}: {image_key}: no image {image_name!r}: neither "
                            f"{def_path(image_name, cdir)} nor "
                            f"{image_path(image_name, cdir, runtime=setting)} exists "
                            f"(definition files there: {known})")
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
    binary = BINARIES[setting]
    raise SpecError(
        f"{site_source}: {runtime_key}: {setting!r}, but `{binary}` is not on PATH on {host} "
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


#: what a runtime prints when it cannot start a job's container (the job's python never ran)
START_FAILURES = (
    re.compile(r"^ch-run\[\d+\]: error: .*"),  # charliecloud
    re.compile(r"^FATAL: .*"),  # apptainer, singularity
    re.compile(r"^srun: (error: )?unrecognized option '--container-.*"),  # srun without pyxis
    re.compile(r"^(slurmstepd: error: )?pyxis: .*"),
    re.compile(r"^\[ERROR\] .*"),  # enroot
)


def start_failure(text: str) -> str | None:
    """The line of a job's output that says its container could not start, else None."""
    for line in text.splitlines():
        line = line.strip()
        if any(p.match(line) for p in START_FAILURES):
            return line
    return None


# --------------------------------------------------------------------------- identity
def image_digest(image: Path | str, runtime: str | None) -> str | None:
    """``sha256:<hex>`` of the image the jobs run: a Charliecloud image's tree digest (written
    by its build), else the image file's hash, kept beside it (``.<name>.sha256``, redone when
    the file's size or time changes); None for a registry reference or a missing image."""
    path = Path(image)
    if runtime == CHARLIECLOUD or path.is_dir():
        meta = charliecloud.image_meta(path) or {}
        digest = meta.get("digest")
        return str(digest) if digest else None
    if not path.is_file():
        return None
    st = path.stat()
    stamp = f"{st.st_size} {st.st_mtime_ns}"
    sidecar = path.with_name(f".{path.name}.sha256")
    with contextlib.suppress(OSError):
        kept = sidecar.read_text().split("\n")
        if len(kept) >= 2 and kept[0] == stamp:
            return kept[1]
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    digest = "sha256:" + h.hexdigest()
    with contextlib.suppress(OSError):
        sidecar.write_text(f"{stamp}\n{digest}\n")
    return digest


def inside_container(environ: Mapping[str, str] | None = None,
                     root: Path | str = "/") -> dict[str, object] | None:
    """What the job itself sees of its container (None: it runs on the host): the runtime
    from the variables each one sets, and for Charliecloud the image's own record of its digest
    (``/ch/hopperlab-image.json``), read from inside."""
    env = os.environ if environ is None else environ
    seen: dict[str, object] | None = None
    if env.get("CH_RUNNING"):
        seen = {"runtime": CHARLIECLOUD}
        meta = charliecloud.image_meta(root) or {}
        for key in ("image", "digest", "base"):
            if meta.get(key):
                seen[key] = meta[key]
    elif env.get("APPTAINER_CONTAINER") or env.get("SINGULARITY_CONTAINER"):
        seen = {"runtime": "apptainer" if env.get("APPTAINER_CONTAINER") else "singularity",
                "image_file": env.get("APPTAINER_CONTAINER") or env.get("SINGULARITY_CONTAINER")}
    elif env.get("PYXIS_VERSION") or env.get("ENROOT_ROOTFS"):
        seen = {"runtime": PYXIS}
    if seen is not None and env.get("HOPPERLAB_IMAGE"):
        seen.setdefault("image", env["HOPPERLAB_IMAGE"])
    return seen


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
                    extra_binds: Iterable[str] = (), *, gpus: bool,
                    env: Mapping[str, str] | None = None) -> list[str]:
    """The exec prefix of a job that reads and writes ``folders`` (results, assets...) inside
    ``image``: the one place that turns a job's folders into binds (``job_binds``). A
    Charliecloud image gets its mount points made (ch-run needs them); pyxis takes no prefix
    (the Slurm backend's ``pyxis.srun_args`` carries the same binds)."""
    binds = job_binds(folders, extra_binds)
    if runtime == PYXIS:
        return []
    if runtime == CHARLIECLOUD:
        charliecloud.mount_points(image, binds)
    return exec_prefix(runtime, image, binds, gpus=gpus, env=env)


def exec_prefix(runtime: str, image: Path | str, binds: Sequence[str], gpus: bool,
                env: Mapping[str, str] | None = None) -> list[str]:
    """``[runtime, "exec", ("--nv",) ("--env", "K=V",)... ("--bind", "a,b",) image]``: what goes
    before ``python``; Charliecloud's is ``node.charliecloud.exec_prefix``.

    One ``--bind`` whose value is the comma-joined ``binds`` (left out when there are none);
    ``--nv`` only when ``gpus``; one ``--env`` per site variable. An argument list for
    subprocess/submitit, never a shell string.
    """
    if runtime == CHARLIECLOUD:
        return charliecloud.exec_prefix(image, list(dict.fromkeys(binds)), env or {})
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
    for name, value in (env or {}).items():
        cmd += ["--env", f"{name}={value}"]
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
    tests/node/test_containers.py checks it against the command spython really starts.
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
