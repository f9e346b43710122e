"""``hopperlab containers``: build the container images (containers/<name>.def -> .sif).

    hopperlab containers build pytorch --runtime apptainer --fakeroot
    hopperlab containers build pytorch --runtime charliecloud   # containers/pytorch.ch, here
    hopperlab containers command pytorch     # print the build command, run nothing
    hopperlab containers runtime             # which runtime is on PATH (exit 1: none)

The workflow's ``container_image`` rules call ``build``.
"""

from __future__ import annotations

import argparse
import platform
import shlex
import socket
import sys
from pathlib import Path

from hopperlab.node import charliecloud
from hopperlab.node.deffile import install_script, read_def
from hopperlab.node.containers import (
    ALL_RUNTIMES,
    CHARLIECLOUD,
    PYXIS,
    RUNTIMES,
    ContainerError,
    build,
    build_command,
    def_path,
    find_runtime,
    check_build_arch,
    image_path,
    known_images,
)


def add_commands(sub: argparse._SubParsersAction) -> None:
    """``hopperlab containers build|command|runtime`` under the main parser's ``sub``."""
    p = sub.add_parser("containers", help="build the container images (containers/*.def)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.set_defaults(func=run)
    actions = p.add_subparsers(dest="action", required=True)
    for action, text in (("build", "build containers/<NAME>.sif through spython"),
                         ("command", "print the build command, run nothing")):
        q = actions.add_parser(action, help=text)
        q.add_argument("name", help="the image: containers/<NAME>.def")
        q.add_argument("--runtime", default="auto", choices=("auto",) + ALL_RUNTIMES,
                       help="auto: apptainer, else singularity (default: auto); charliecloud: "
                            "a directory image <NAME>.ch on a Debian base, built here")
        q.add_argument("--fakeroot", action="store_true", help="build with --fakeroot")
        q.add_argument("--containers-dir", default="containers", type=Path,
                       help="where the .def files are (default: containers)")
        q.add_argument("--arch", default=None, choices=("x86_64", "aarch64"),
                       help="the GPU nodes' architecture (a site's gpu_arch): names the image "
                            "<NAME>.<ARCH>.sif; a build refuses another architecture than this "
                            "machine's")
        q.add_argument("--output", type=Path, default=None,
                       help="the image to write (default: <containers-dir>/<NAME>.sif, .ch)")
        q.add_argument("--cache", type=Path, default=None,
                       help="charliecloud: keep the Debian base and the wheels here between "
                            "builds (default: <containers-dir>/.cache)")
        q.add_argument("--base", type=Path, default=None,
                       help="charliecloud: start from this root file system (a directory or "
                            "tar, e.g. an NGC image from ch-convert) instead of the Debian base")
    q = actions.add_parser("script", help="print the .def's %%files copies and %%post as one "
                                          "shell script (to build with enroot)")
    q.add_argument("name", help="the image: containers/<NAME>.def")
    q.add_argument("--containers-dir", default="containers", type=Path)
    q.add_argument("--source", default="/opt/hopperlab-src",
                   help="where the project is mounted inside (default: /opt/hopperlab-src)")
    q = actions.add_parser("runtime", help="print the container runtime found on PATH")
    q.add_argument("--runtime", default="auto", choices=("auto",) + ALL_RUNTIMES)


def _wanted(runtime: str) -> str:
    return " or ".join(RUNTIMES) if runtime == "auto" else runtime


def _charliecloud(args: argparse.Namespace, definition: Path, output: Path) -> int:
    """``command``: the steps of a Charliecloud build; ``build``: run them."""
    cdir = Path(args.containers_dir)
    base_file = cdir / charliecloud.BASE_FILE
    if args.action == "command":
        base = charliecloud.DebianBase.load(base_file)
        print(shlex.join(charliecloud.base_command(base, Path("base.tar"))))
        print(shlex.join(charliecloud.wheels_command(base.python, cdir.resolve().parent,
                                                     Path("wheels"))))
        print(f"# %post of {definition}, inside the image:")
        print(shlex.join(charliecloud.ch_run_build(output, "/ch/hopperlab-post.sh",
                                                   Path("wheels"), charliecloud.BUILD_PIP_ENV)))
        env = charliecloud.image_env(read_def(definition), {})
        path = env.pop("PATH")
        print(f"# %test of {definition}, inside the image:")
        print(shlex.join(charliecloud.ch_run_build(output, "/ch/hopperlab-test.sh", None, env,
                                                   path=path)))
        return 0
    check_build_arch(args.arch, platform.machine())
    if not definition.is_file():
        known = ", ".join(known_images(cdir)) or "none"
        raise ContainerError(f"{definition}: no such definition file (images: {known})")
    charliecloud.build(definition, output, base_file=base_file, context=cdir.resolve().parent,
                       cache=args.cache if args.cache is not None else cdir / ".cache",
                       base_root=args.base)
    return 0


def run(args: argparse.Namespace) -> int:
    """One ``hopperlab containers`` action; a failed build raises ContainerError (exit 2)."""
    if args.action == "runtime":
        # auto: apptainer, singularity (what a site's auto uses), then Charliecloud
        candidates = (*RUNTIMES, CHARLIECLOUD) if args.runtime == "auto" else (args.runtime,)
        found = next(filter(None, map(find_runtime, candidates)), None)
        if found is None:
            print(f"hopperlab: no container runtime: `{' or '.join(candidates)}` is not on PATH"
                  " (Debian 12: apt-get install charliecloud-runtime mmdebstrap; containers/"
                  "README.md)", file=sys.stderr)
            return 1
        print(found)
        return 0
    definition = def_path(args.name, args.containers_dir)
    if args.action == "script":
        print(install_script(read_def(definition), args.source), end="")
        return 0
    output = args.output if args.output is not None else image_path(
        args.name, args.containers_dir, args.arch, runtime=args.runtime)
    if args.runtime == PYXIS:
        raise ContainerError("enroot images are made on the cluster (enroot import + the .def's "
                             "%post, containers/README.md), not by hopperlab")
    if args.runtime == CHARLIECLOUD:
        return _charliecloud(args, definition, output)
    runtime = find_runtime(args.runtime)
    if args.action == "command":
        shown = runtime or (args.runtime if args.runtime != "auto" else RUNTIMES[0])
        print(shlex.join(build_command(definition, output, shown, args.fakeroot)))
        return 0
    check_build_arch(args.arch, platform.machine())
    if runtime is None:
        raise ContainerError(f"cannot build {output}: `{_wanted(args.runtime)}` is not on PATH on "
                             f"{socket.gethostname()}")
    if not definition.is_file():
        known = ", ".join(known_images(args.containers_dir)) or "none"
        raise ContainerError(f"{definition}: no such definition file (images: {known})")
    build(definition, output, runtime, args.fakeroot,
          context=Path(args.containers_dir).resolve().parent)
    return 0
