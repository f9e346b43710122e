"""Where an in-process job is: where its caller is. It starts no task and sets no variable, so
it recognizes nothing of its own (None): the job is one task, placed by whatever started the
calling process (nothing: ``JobEnvironment()``; ``srun`` inside an allocation: Slurm)."""

from __future__ import annotations

from typing import Mapping

from hopperlab.backends.base import JobEnvironment


def read(environ: Mapping[str, str]) -> JobEnvironment | None:
    return None
