"""The scheduler backends. Each sub-package declares ``BACKEND: BackendInfo`` in its ``__init__``.

Backends are found by looking at the sub-packages of this package, as the families are: a new
backend is a new folder ``hopperlab/backends/<name>/`` (``__init__`` with ``BACKEND``, cheap;
``jobenv``; ``executor`` with ``LAUNCHER``, loaded only to submit). A backend can also come from
outside the package, as submitit's executor plugins do: a distribution that declares an entry
point ``<name> = <its package>`` in the group ``hopperlab.backends``; a folder of this package
keeps its name. A site names one in its ``executor:`` key; config validates the name and the
backend's settings block from here.

A backend that cannot be loaded (its package raises on import, or a stray folder declares no
``BACKEND``) is skipped with one warning naming it (and, for a plugin, the distribution that
installed it: what to reinstall or remove), as submitit skips a broken executor plugin:
every verb goes on with the others; only a site that names it is refused, with the reason.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import logging
import pkgutil
from typing import Mapping

from hopperlab.backends.base import BackendInfo, JobEnvironment, Launcher


#: the entry-point group a backend from outside the package declares itself in
ENTRY_POINT_GROUP = "hopperlab.backends"

log = logging.getLogger(__name__)


@functools.cache
def _found() -> dict[str, tuple[str, str]]:
    """Backend name -> (its package, where it comes from): every sub-package of this one (on
    every path of it), then every entry point of ``ENTRY_POINT_GROUP`` whose name no folder
    has, with the distribution that declares it."""
    found = {}
    for module in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if module.ispkg and not module.name.startswith("_"):
            found[module.name] = (f"{__name__}.{module.name}", "")
    for entry in sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP),
                        key=lambda e: e.name):
        dist = entry.dist
        origin = (f", distribution {dist.name} {dist.version}" if dist is not None else
                  ", an entry point of no distribution")
        found.setdefault(entry.name, (entry.value, origin))
    return found


def forget() -> None:
    """Look at the folders again (a test that adds one)."""
    _found.cache_clear()
    _loaded.cache_clear()


def _declaration(name: str, module: str) -> BackendInfo:
    """The ``BACKEND`` of ``module``; an error saying what is wrong with it."""
    info = getattr(importlib.import_module(module), "BACKEND", None)
    if not isinstance(info, BackendInfo):
        raise TypeError(f"{module} declares no BACKEND (a hopperlab.backends.base.BackendInfo)")
    if info.name != name:
        raise ValueError(f"{module}: BACKEND.name is {info.name!r}, expected {name!r} (the "
                         f"folder)")
    return info


@functools.cache
def _loaded() -> tuple[dict[str, BackendInfo], dict[str, str]]:
    """(name -> declaration of every backend that loads, name -> why of every one that does
    not); each broken one is said once, as a warning."""
    good: dict[str, BackendInfo] = {}
    bad: dict[str, str] = {}
    for name, (module, origin) in _found().items():
        try:
            good[name] = _declaration(name, module)
        except Exception as exc:  # noqa: BLE001 - a broken plugin must not stop the others
            why = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
            bad[name] = why
            log.warning("hopperlab: backend %r (%s%s) skipped: %s", name, module, origin, why)
    return good, bad


def names() -> list[str]:
    """The backends that load."""
    return sorted(_loaded()[0])


def broken() -> dict[str, str]:
    """The backends found that could not be loaded, each with why."""
    return dict(_loaded()[1])


def backend(name: str) -> BackendInfo:
    """The declaration of backend ``name``; KeyError naming the known ones (or why the one
    named could not be loaded)."""
    good, bad = _loaded()
    if name in bad:
        raise KeyError(f"executor {name!r} could not be loaded: {bad[name]}")
    if name not in good:
        raise KeyError(f"unknown executor {name!r}; expected one of: {', '.join(names())}")
    return good[name]


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
