"""enroot + pyxis (the Slurm backend's): Slurm starts the job's task inside the image (NVIDIA's DGX clusters' way).

pyxis is a SPANK plugin that gives ``srun`` the options ``--container-image``,
``--container-mounts`` and ``--container-workdir``; enroot unpacks the image and its NVIDIA hook
passes the job's GPUs in. So there is no exec prefix: the job's ``srun`` line carries these
options (submitit's ``srun_args``) and ``python`` is the image's. The site's ``env`` reaches the
container through the job script (``export`` lines before ``srun``; enroot keeps the task's
environment). How to make the image on the cluster: containers/README.md.
"""

from __future__ import annotations

import functools
import shlex
import subprocess
from typing import Mapping, Sequence

from hopperlab.core.errors import SpecError
from hopperlab.node.containers import PYXIS as RUNTIME  # noqa: F401 - the runtime's name

#: the option ``srun --help`` lists when the pyxis plugin is loaded
IMAGE_OPTION = "--container-image"


def srun_args(image: str, binds: Sequence[str], workdir: str | None = None) -> list[str]:
    """``--container-image=IMAGE --container-mounts=SRC:DST[,...] --container-workdir=DIR``.

    ``image`` is an enroot image file (``.sqsh``) or a registry reference pyxis pulls
    (``nvcr.io#nvidia/pytorch:25.12-py3``). Each bind ``SRC[:DST[:FLAGS]]`` is mounted at
    ``DST`` (``SRC`` when no ``DST``): pyxis needs both, joined by commas.
    """
    if not image or "," in image:
        raise SpecError(f"container image {image!r}: empty, or holds a ','")
    mounts = []
    for spec in binds:
        if not spec or "," in spec:
            raise SpecError(f"bind {spec!r}: empty, or holds a ',' (which separates mounts)")
        mounts.append(spec if ":" in spec else f"{spec}:{spec}")
    args = [f"{IMAGE_OPTION}={image}"]
    if mounts:
        args.append(f"--container-mounts={','.join(dict.fromkeys(mounts))}")
    if workdir:
        args.append(f"--container-workdir={workdir}")
    return args


def env_setup(env: Mapping[str, str]) -> list[str]:
    """The job script's lines that put the site's ``env`` into the task (and so the container)."""
    return [f"export {name}={shlex.quote(str(value))}" for name, value in env.items()]


def has_plugin(srun_help: str) -> bool:
    """Whether ``srun --help`` output shows the pyxis options (the plugin is loaded)."""
    return IMAGE_OPTION in srun_help


@functools.cache
def srun_help() -> str:
    """``srun --help`` of this machine (the pyxis plugin adds its options there); once."""
    try:
        done = subprocess.run(["srun", "--help"], capture_output=True, text=True, timeout=60,
                              check=False)
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout + done.stderr
