"""The scheduler backends. Each sub-package declares ``BACKEND: BackendInfo`` in its ``__init__``.

Backends are found by looking at the sub-packages of this package, as the families are: a new
backend is a new folder ``hopperlab/backends/<name>/`` (``__init__`` with ``BACKEND``, cheap;
``jobenv``; ``executor`` with ``LAUNCHER``, loaded only to submit). A backend can also come from
outside the package, as submitit's executor plugins do: a distribution that declares an entry
point ``<name> = <its package>`` in the group ``hopperlab.backends`` (``pyproject.toml``:
``[project.entry-points."hopperlab.backends"]``); a folder of this package keeps its name.
A site names one in its ``executor:`` key; config validates the name and the backend's
settings block from here.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import pkgutil
from typing import Mapping

from hopperlab.backends.base import BackendInfo, JobEnvironment, Launcher


#: the entry-point group a backend from outside the package declares itself in
ENTRY_POINT_GROUP = "hopperlab.backends"


@functools.cache
def _modules() -> dict[str, str]:
    """Backend name -> its package: every sub-package of this one (on every path of it), then
    every entry point of ``ENTRY_POINT_GROUP`` whose name no folder has."""
    found = {}
    for module in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if module.ispkg and not module.name.startswith("_"):
            found[module.name] = f"{__name__}.{module.name}"
    for entry in sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP),
                        key=lambda e: e.name):
        found.setdefault(entry.name, entry.value)
    return found


def forget() -> None:
    """Look at the folders again (a test that adds one)."""
    _modules.cache_clear()
    backend.cache_clear()


def names() -> list[str]:
    return sorted(_modules())


@functools.cache
def backend(name: str) -> BackendInfo:
    """The declaration of backend ``name``; KeyError naming the known ones."""
    try:
        module = _modules()[name]
    except KeyError:
        raise KeyError(f"unknown executor {name!r}; expected one of: {', '.join(names())}") \
            from None
    info = importlib.import_module(module).BACKEND
    if info.name != name:
        raise KeyError(f"{module}: BACKEND.name is {info.name!r}, expected {name!r} (the folder)")
    return info


def all_backends() -> list[BackendInfo]:
    return [backend(n) for n in names()]


def launcher(name: str) -> Launcher:
    """What the submitting side does through backend ``name`` (its executor module, loaded
    now)."""
    return importlib.import_module(backend(name).executor).LAUNCHER


def where_am_i(environ: Mapping[str, str]) -> JobEnvironment:
    """This process's place, as the backend that started it says (the first in
    ``detect_order`` that recognizes the environment), with the CPUs and the job record of
    the first that has them: a local job on a node held through Slurm is placed by submitit
    and given its CPUs by Slurm."""
    readings = [env for info in sorted(all_backends(), key=lambda b: (b.detect_order, b.name))
                if (env := info.read_environment(environ)) is not None]
    here = readings[0] if readings else JobEnvironment()
    given = next((env for env in readings if env.cpus is not None), None)
    record = next((env.record for env in readings if env.record is not None), None)
    fields = dict(here.__dict__)
    if given is not None:
        fields.update(cpus=given.cpus, cpus_source=given.cpus_source)
    fields["record"] = record
    return JobEnvironment(**fields)
