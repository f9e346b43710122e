"""The environment a job starts with: the submitting process's, with the site's ``env:`` set
and the secrets removed.

A site's ``env:`` (``OMP_NUM_THREADS: 1``...) reaches every task of every job, locally and
through Slurm, without a shell: it is put into this process's environment only while submitit
starts the job (the local controller and ``sbatch --export=ALL`` both copy it then). The
secrets of the submitting side (MLflow credentials, the Hugging Face token) are taken out for
that moment: the job never talks to the network, and Slurm keeps a job's environment on disk.
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from typing import Iterator, Mapping

from hopperlab.core.secrets import SECRET_ENV

#: what the submitting side needs and a job never does (jobs do not use the network)
JOB_SECRETS = SECRET_ENV

_lock = threading.Lock()


@contextmanager
def job_environment(site_env: Mapping[str, str]) -> Iterator[None]:
    """``os.environ`` as the job must see it, for the block; put back as it was after."""
    with _lock:
        saved = {name: os.environ.get(name) for name in (*JOB_SECRETS, *site_env)}
        try:
            for name in JOB_SECRETS:
                os.environ.pop(name, None)
            os.environ.update({k: str(v) for k, v in site_env.items()})
            yield
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


def job_env(environ: Mapping[str, str], site_env: Mapping[str, str]) -> dict[str, str]:
    """``environ`` as a job gets it: the site's ``env:`` set, the secrets out. What the warm
    starter (run/warm.py) is started with: its jobs are forked from its process image, whose
    environment block (``/proc/<pid>/environ``, ``ps eww``) a fork copies and no ``unsetenv``
    clears."""
    env = {**environ, **{k: str(v) for k, v in site_env.items()}}
    for name in JOB_SECRETS:
        env.pop(name, None)
    return env
