"""Charliecloud: build a directory image from a ``.def`` on a Debian base, run jobs with ``ch-run``.

Why Charliecloud here: it is an HPC runtime that needs no daemon, no setuid helper and no
``/etc/subuid`` (an unprivileged user namespace is enough), ``ch-run`` simply execs the job's
command (submitit and Slurm signal the job's own process, as with ``apptainer exec``), and its
directory images live in a plain folder beside the ``.sif`` files.

No registry is reachable from these machines, so the NGC base cannot be pulled. The image is built
instead from:

1. a Debian root file system made by ``mmdebstrap`` from Debian's packages (the host's apt
   sources), with the packages and the torch stack that ``containers/debian-base.yaml`` names
   (the stand-in for what the NGC base carries);
2. the ``.def`` file's ``%files``, ``%post``, ``%environment`` and ``%test``, run unchanged
   (``node.deffile``): the ``.def`` stays the one list of what goes in.

Python packages come from a wheel folder made on the building machine by its own pip (its index,
its local wheels), then installed inside the image with ``--no-index``: the build needs no
network inside the image. ``ch/hopperlab-image.json`` in the image holds its digest (a hash of the
whole tree), the base and the definition file; jobs and records read it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

from hopperlab.core.errors import NodeError
from hopperlab.core.schema import load_yaml
from hopperlab.node.deffile import DefFile, read_def

RUNTIME = "charliecloud"
#: the binary that runs a job; building needs mmdebstrap too
RUN_BINARY = "ch-run"
#: a Charliecloud image here is a directory ``containers/<name>.ch``
IMAGE_SUFFIX = ".ch"
#: inside the image: what this module wrote about it (excluded from the digest)
META_FILE = "ch/hopperlab-image.json"
#: inside the image: the variables ``ch-run --set-env`` applies (%environment, PATH)
ENV_FILE = "ch/environment"
#: where the build binds the wheel folder inside the image
WHEELS_IN_IMAGE = "/opt/hopperlab-wheels"
BASE_FILE = "debian-base.yaml"
#: PATH inside the image (Debian's default for root); ch-run otherwise keeps the host's
IMAGE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: host variables a job must not take into the image: they point at the host's python
HOST_PYTHON_VARS = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "CONDA_PREFIX")
#: what ``ch-fromhost --nvidia`` leaves in an image: the driver's NVML library
GPU_LIBRARY_GLOB = "libnvidia-ml.so*"
GPU_LIBRARY_DIRS = ("usr/lib/x86_64-linux-gnu", "usr/lib/aarch64-linux-gnu", "usr/lib64",
                    "usr/lib", "usr/local/lib")


class CharliecloudError(NodeError):
    """An image could not be built or run with Charliecloud."""


@dataclass(frozen=True)
class DebianBase:
    """The base a Charliecloud image starts from here (containers/debian-base.yaml)."""

    suite: str
    packages: tuple[str, ...]
    python: tuple[str, ...]
    variant: str = "minbase"
    mirror: str | None = None

    @classmethod
    def load(cls, path: Path | str) -> "DebianBase":
        data = load_yaml(Path(path), "Debian base") or {}
        try:
            return cls(suite=str(data["suite"]), packages=tuple(data.get("packages") or ()),
                       python=tuple(data.get("python") or ()),
                       variant=str(data.get("variant", "minbase")), mirror=data.get("mirror"))
        except KeyError as exc:
            raise CharliecloudError(f"{path}: missing key {exc}") from None

    def key(self) -> str:
        """A short hash of the description: names the cached base tar."""
        text = json.dumps([self.suite, self.variant, self.mirror, sorted(self.packages)])
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    def describe(self) -> str:
        return f"debian:{self.suite} ({self.variant}) + {', '.join(self.python) or 'no wheels'}"


# --------------------------------------------------------------------------- run
def image_dir(name: str, images_dir: Path | str, arch: str | None = None) -> Path:
    suffix = f".{arch}" if arch else ""
    return Path(images_dir) / f"{name}{suffix}{IMAGE_SUFFIX}"


def exec_prefix(image: Path | str, binds: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """``ch-run --set-env [--set-env=K=V...] --unset-env=PYTHONPATH... -b SRC[:DST]... IMAGE --``.

    The image's own variables first (``ch/environment``: PATH, what ``%environment`` sets), then
    the site's ``env`` over them; the host's python variables are dropped (a ``PYTHONPATH`` to
    the checkout would run the host's hopperlab inside the image). Each bind is ``SRC[:DST]``
    (``container_binds`` may say ``src:dst``; a third ``:opts`` field is refused: ch-run has
    none). GPUs need no flag: ``ch-fromhost --nvidia`` puts the driver's libraries into the
    image on the GPU node (containers/README.md).
    """
    cmd = [RUN_BINARY, "--set-env"]
    for name, value in env.items():
        cmd.append(f"--set-env={name}={value}")
    for name in HOST_PYTHON_VARS:
        if name not in env:
            cmd.append(f"--unset-env={name}")
    for spec in binds:
        if spec.count(":") > 1:
            raise CharliecloudError(f"bind {spec!r}: ch-run takes SRC[:DST], no options")
        cmd += ["-b", spec]
    return cmd + [str(image), "--"]


def mount_points(image: Path | str, binds: Iterable[str]) -> list[Path]:
    """Make each bind's destination inside a directory image (ch-run mounts a read-only image
    only on folders that exist in it); return the ones made. NodeError when the image cannot
    take them (someone else's image): say which folder to make."""
    made: list[Path] = []
    root = Path(image)
    if not is_image_dir(root):
        return made  # no image there (yet): ch-run will say so; never make one up
    for spec in binds:
        dest = spec.split(":")[1] if ":" in spec else spec
        target = root / dest.lstrip("/")
        if target.is_dir():
            continue
        try:
            target.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CharliecloudError(f"cannot make the mount point {dest} in {root} ({exc}): make "
                                    f"it once there (mkdir -p {root}{dest})") from None
        made.append(target)
    return made


def is_image_dir(path: Path | str) -> bool:
    """Whether ``path`` looks like a root file system ch-run can start (``ch/`` of Charliecloud's
    tools, or at least a ``usr/``)."""
    root = Path(path)
    return (root / "ch").is_dir() or (root / "usr").is_dir()


def has_gpu_libraries(image: Path | str) -> bool:
    """Whether ``ch-fromhost --nvidia`` (or an NGC base) put the NVIDIA driver libraries in."""
    root = Path(image)
    return any(any((root / d).glob(GPU_LIBRARY_GLOB)) for d in GPU_LIBRARY_DIRS)


def image_meta(image: Path | str) -> dict[str, object] | None:
    """What the build wrote about ``image`` (digest, base, definition), None if nothing."""
    path = Path(image) / META_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


# --------------------------------------------------------------------------- digest
#: files left out of the digest: its own record, and the stamp Snakemake leaves in a directory
#: output (the workflow's rule builds the image as one)
DIGEST_SKIP = (META_FILE, ".snakemake_timestamp")


def tree_digest(root: Path | str, skip: Iterable[str] = DIGEST_SKIP) -> str:
    """``sha256:<hex>`` of a directory tree: every file's and link's relative path, type, mode
    bits and content (a link's target), in sorted order. Owners and times are left out, so the
    same files give the same digest wherever they were unpacked; directories count only through
    what they hold, so the empty mount points a job adds (``mount_points``) change nothing."""
    root = Path(root)
    if not root.is_dir():
        raise CharliecloudError(f"{root}: no image directory to digest")
    skipped = set(skip)
    outer = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        rel_dir = os.path.relpath(dirpath, root)
        for name in sorted(dirnames + filenames):
            full = os.path.join(dirpath, name)
            rel = os.path.normpath(os.path.join(rel_dir, name))
            if rel in skipped:
                continue
            st = os.lstat(full)
            if stat.S_ISDIR(st.st_mode):
                continue
            kind = stat.S_IFMT(st.st_mode)
            outer.update(f"{rel}\0{kind:o}\0{stat.S_IMODE(st.st_mode):o}\0".encode())
            if stat.S_ISLNK(st.st_mode):
                outer.update(os.readlink(full).encode())
            elif stat.S_ISREG(st.st_mode):
                h = hashlib.sha256()
                with open(full, "rb") as fh:
                    for block in iter(lambda: fh.read(1 << 20), b""):
                        h.update(block)
                outer.update(h.digest())
            outer.update(b"\n")
    return "sha256:" + outer.hexdigest()


# --------------------------------------------------------------------------- build
def base_command(base: DebianBase, target: Path) -> list[str]:
    """mmdebstrap making ``target`` (a tar file) from Debian's packages; without a mirror it
    takes the host's apt sources. Root uses a chroot, anyone else an unshared namespace."""
    cmd = ["mmdebstrap", f"--variant={base.variant}", "--format=tar"]
    if base.packages:
        cmd.append(f"--include={','.join(base.packages)}")
    cmd += [base.suite, str(target)]
    if base.mirror:
        cmd.append(base.mirror)
    return cmd


def wheels_command(python: Sequence[str], project: Path, wheel_dir: Path) -> list[str]:
    """This machine's pip building wheels of the base's torch stack and the project with all
    its dependencies (plus setuptools, which the in-image install builds hopperlab with)."""
    return [sys.executable, "-m", "pip", "wheel", "--quiet", "--wheel-dir", str(wheel_dir),
            "--find-links", str(wheel_dir),
            *python, "setuptools>=68", "wheel", str(project)]


def ch_run_build(image: Path, script_in_image: str, wheel_dir: Path | None,
                 env: Mapping[str, str], path: str = IMAGE_PATH) -> list[str]:
    """``ch-run -w`` running a script inside the image being built, as root there, with a clean
    environment (the host's PIP_*, PYTHON* must not steer the image's pip)."""
    cmd = [RUN_BINARY, "-w", "--uid=0", "--gid=0", "--unset-env=*",
           f"--set-env=PATH={path}", "--set-env=HOME=/root"]
    for name, value in env.items():
        cmd.append(f"--set-env={name}={value}")
    if wheel_dir is not None:
        cmd += ["-b", f"{wheel_dir}:{WHEELS_IN_IMAGE}"]
    return cmd + ["-c", "/", str(image), "--", "/bin/sh", script_in_image]


#: pip inside the image during the build: offline, from the wheel folder, into Debian's python
BUILD_PIP_ENV = {
    "PIP_NO_INDEX": "1",
    "PIP_FIND_LINKS": WHEELS_IN_IMAGE,
    "PIP_BREAK_SYSTEM_PACKAGES": "1",
    "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    "PIP_ROOT_USER_ACTION": "ignore",
}


def _run(cmd: list[str], what: str, log: Callable[[str], None],
         env: Mapping[str, str] | None = None) -> None:
    log(f"hopperlab: {what}:\n  {shlex.join(cmd)}")
    full = {**os.environ, **(env or {})}
    full.setdefault("USER", _user())
    done = subprocess.run(cmd, env=full, check=False)
    if done.returncode != 0:
        raise CharliecloudError(f"{what} failed (exit status {done.returncode}): "
                                f"{shlex.join(cmd)}")


def _user() -> str:
    """ch-run refuses to start without $USER; a root shell in a container often has none."""
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


def user_env() -> dict[str, str]:
    """What ch-run needs in the environment of whoever starts it."""
    return {} if os.environ.get("USER") else {"USER": _user()}


def _extract(tar_path: Path, dest: Path) -> None:
    """Unpack the base as the building user (no device nodes: ch-run binds the host's /dev)."""
    dest.mkdir(parents=True)
    with tarfile.open(tar_path) as tar:
        members = [m for m in tar.getmembers()
                   if not (m.ischr() or m.isblk() or m.isfifo())]
        tar.extractall(dest, members=members, numeric_owner=True,
                       filter=_keep_links if hasattr(tarfile, "data_filter") else None)


def _keep_links(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo:
    """A root file system holds absolute links (/etc/alternatives): keep them as they are."""
    return member


def check_python(image: Path) -> None:
    """The wheels are made by this machine's python for itself: the image's python must be the
    same minor version (Debian 12: 3.11), or pip inside finds no wheel for its compiled parts."""
    want = f"python{sys.version_info.major}.{sys.version_info.minor}"
    if not (image / "usr" / "bin" / want).exists():
        found = sorted(p.name for p in (image / "usr" / "bin").glob("python3.*")) or ["none"]
        raise CharliecloudError(f"the Debian base has {', '.join(found)}, but this machine's "
                                f"python is {want}: the wheels would not fit; build with a "
                                f"{want} (or a suite that ships {want})")


def _copy_files(defn: DefFile, context: Path, image: Path) -> None:
    for src, dst in defn.files:
        source = (context / src) if not Path(src).is_absolute() else Path(src)
        target = image / dst.lstrip("/")
        if not source.exists():
            raise CharliecloudError(f"{defn.path}: %files: {src}: no such file in {context}")
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, symlinks=True, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(source, target)


def read_env_file(path: Path) -> dict[str, str]:
    """``NAME=VALUE`` lines of an image's ``ch/environment`` (ch-image writes one for an image
    it pulled: NGC's PATH, CUDA variables); {} when there is none."""
    env: dict[str, str] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            name, sep, value = line.partition("=")
            if sep and name.strip() and not name.startswith("#"):
                env[name.strip()] = value
    return env


def image_env(defn: DefFile, base_env: Mapping[str, str]) -> dict[str, str]:
    """The image's variables: its base's (PATH first, Debian's when the base says none), then
    the ``.def``'s ``%environment`` over them."""
    return {"PATH": base_env.get("PATH", IMAGE_PATH), **base_env, **defn.environment}


def _write_env(defn: DefFile, image: Path, base_env: Mapping[str, str]) -> dict[str, str]:
    env = image_env(defn, base_env)
    path = image / ENV_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{k}={v}\n" for k, v in env.items()))
    return env


def _install_base_python(base: DebianBase, image: Path, wheel_dir: Path,
                         log: Callable[[str], None]) -> None:
    if not base.python:
        return
    script = image / "ch" / "hopperlab-base.sh"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text("set -eu\npython3 -m pip install --no-cache-dir "
                      + " ".join(shlex.quote(p) for p in base.python) + "\n")
    _run(ch_run_build(image, "/ch/hopperlab-base.sh", wheel_dir, BUILD_PIP_ENV),
         "the base's torch stack (stands in for the NGC base's)", log)
    script.unlink()


#: host variables a build from a root file system (``base_root``) passes to the image's pip
NETWORK_VARS = ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY",
                "NO_PROXY", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_TRUSTED_HOST")


def rootfs_pip_env(environ: Mapping[str, str]) -> dict[str, str]:
    """pip's environment inside an image built on a given root file system (an NGC base on the
    cluster): the base's own pip and constraints, the network as the host reaches it."""
    env = {"PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_ROOT_USER_ACTION": "ignore",
           # Ubuntu 24.04's python (NGC 25.x) is "externally managed", as Debian 12's is
           "PIP_BREAK_SYSTEM_PACKAGES": "1"}
    env.update({k: environ[k] for k in NETWORK_VARS if environ.get(k)})
    return env


#: where the host's CA bundle sits in the image while %post runs (removed after)
HOST_CA_IN_IMAGE = "/ch/hopperlab-host-ca.pem"
HOST_CA_VARS = ("PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE")
HOST_CA_DEFAULT = "/etc/ssl/certs/ca-certificates.crt"


def host_ca_bundle(environ: Mapping[str, str]) -> Path | None:
    """The CA bundle this machine's pip trusts (a site's proxy CA is often only there)."""
    for name in HOST_CA_VARS:
        if environ.get(name) and Path(environ[name]).is_file():
            return Path(environ[name])
    return Path(HOST_CA_DEFAULT) if Path(HOST_CA_DEFAULT).is_file() else None


def _unpack_root(base_root: Path, dest: Path) -> None:
    """A root file system given as a directory (ch-convert's ``dir``) or a tar (``tar``)."""
    if base_root.is_dir():
        shutil.copytree(base_root, dest, symlinks=True)
    else:
        _extract(base_root, dest)


def build(def_path: Path | str, target: Path | str, *, base_file: Path | str,
          context: Path | str, cache: Path | str | None = None,
          base_root: Path | str | None = None,
          log: Callable[[str], None] = lambda s: print(s, file=sys.stderr)) -> dict[str, object]:
    """Build the directory image ``target`` from ``def_path``; return what ``META_FILE`` says.

    ``context`` is where relative ``%files`` sources are (the project root). ``cache`` keeps the
    Debian base (one tar per base description) and the wheel folder between builds (default:
    nothing kept). ``base_root`` starts from that root file system instead of the Debian base
    (a directory or tar, e.g. an NGC image converted by ``ch-convert`` on the cluster): no
    mmdebstrap, no wheel folder; the ``%post``'s pip uses the network. The image appears at
    ``target`` only when every step, ``%test`` included, succeeded; an old image there stays
    until then.
    """
    t0 = time.monotonic()
    defn = read_def(def_path)
    base = DebianBase.load(base_file)
    target = Path(target).resolve()
    root = Path(base_root).resolve() if base_root else None
    if root is not None and not root.exists():
        raise CharliecloudError(f"cannot build {target.name}: no root file system at {root}")
    for binary in (RUN_BINARY,) + (() if root else ("mmdebstrap",)):
        if shutil.which(binary) is None:
            raise CharliecloudError(f"cannot build {target.name}: `{binary}` is not on PATH "
                                    f"(Debian: apt-get install charliecloud-runtime mmdebstrap)")
    context = Path(context).resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.partial")
    with tempfile.TemporaryDirectory(prefix="hopperlab-ch-", dir=target.parent) as tmp:
        work = Path(tmp)
        kept = Path(cache).resolve() if cache else work
        kept.mkdir(parents=True, exist_ok=True)
        wheels: Path | None = kept / "wheels"
        base_tar = kept / f"debian-{base.key()}.tar"
        try:
            if root is not None:
                _unpack_root(root, partial)
                wheels = None
            else:
                if not base_tar.is_file():
                    partial_tar = work / "base.tar"
                    _run(base_command(base, partial_tar), "the Debian base (mmdebstrap)", log)
                    shutil.move(str(partial_tar), str(base_tar))
                _extract(base_tar, partial)
                check_python(partial)
                wheels.mkdir(parents=True, exist_ok=True)
                _run(wheels_command(base.python, context, wheels),
                     "the wheels (this machine's pip)", log)
                _install_base_python(base, partial, wheels, log)
            base_env = read_env_file(partial / ENV_FILE)
            _copy_files(defn, context, partial)
            env = _write_env(defn, partial, base_env)
            post_env = BUILD_PIP_ENV if wheels is not None else rootfs_pip_env(os.environ)
            ca = host_ca_bundle(os.environ) if wheels is None else None
            if ca is not None:  # pip inside reaches the network as this machine's pip does
                shutil.copy(ca, partial / HOST_CA_IN_IMAGE.lstrip("/"))
                post_env = {**post_env, "PIP_CERT": HOST_CA_IN_IMAGE}
            for section in ("post", "test"):
                script = defn.script(section)
                if not script.strip():
                    continue
                name = f"/ch/hopperlab-{section}.sh"
                (partial / name.lstrip("/")).write_text(script)
                run_env = dict({**base_env, **post_env} if section == "post" else env)
                run_env.pop("PATH", None)
                _run(ch_run_build(partial, name, wheels if section == "post" else None,
                                  run_env, path=env["PATH"]),
                     f"%{section} of {defn.path.name}", log)
                (partial / name.lstrip("/")).unlink()
            (partial / HOST_CA_IN_IMAGE.lstrip("/")).unlink(missing_ok=True)
            meta: dict[str, object] = {
                "runtime": RUNTIME, "image": defn.path.stem,
                "definition": str(defn.path), "definition_sha256": hashlib.sha256(
                    defn.path.read_bytes()).hexdigest(),
                "base": f"rootfs:{root}" if root else base.describe(),
                "built_s": None, "digest": None,
            }
            meta["digest"] = tree_digest(partial)
            meta["built_s"] = round(time.monotonic() - t0, 1)
            (partial / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
            _replace_dir(partial, target)
        finally:
            if partial.exists():
                shutil.rmtree(partial, ignore_errors=True)
    log(f"hopperlab: built {target} in {meta['built_s']} s, digest {meta['digest']}")
    return meta


def _replace_dir(new: Path, target: Path) -> None:
    """Put ``new`` at ``target``; an old image there moves aside first and is removed after."""
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}.old")
        os.rename(target, old)
    os.rename(new, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
