"""The profiler part of a job's command line, its settings, and the check that nsys exists.

The job's command is ``[container exec] + profiler_prefix(...) + [python]`` (``hopperlab.run.launch``):

* ``profiler: none``  -> nothing;
* ``profiler: torch`` -> ``python -m hopperlab.cli profile job --run-dir D --profiler torch --``;
* ``profiler: nsys``  -> the same wrapper, then ``nsys profile ...``.

The wrapper (``hopperlab.profiling.finish``) starts the rest of the line as its child and, once
the child has exited, turns the profile into CSVs and ``prof_`` metrics. Where nsys options come
from: the site file's ``profiling:`` block (``ProfilingSettings``), because what can be traced,
and for how long, is a property of the machine and its nsys, not of an experiment; a site file
is also the one place a user already edits per cluster (and a different capture for one study is
a second site file: ``--config site=configs/sites/mycluster-delay.yaml``).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Mapping, Protocol, Sequence

from hopperlab.core.errors import SpecError
from hopperlab.cuda.nvtx import TORCH_TRACE  # noqa: F401 - re-exported: part of this module's API

NSYS_TRACES = "cuda,nvtx,cublas,cudnn"
CAPTURES = ("cudaProfilerApi", "delay", "whole")
PROFILE_DIR = Path("artifacts") / "profile"
REPORT_STEM = "report"


class _Container(Protocol):
    @property
    def image(self) -> str | None: ...


class _Backend(Protocol):
    """What this module asks of the site's scheduler backend (``backends.base.BackendInfo``)."""

    @property
    def profiler_reach(self) -> str: ...


class ProfiledSite(Protocol):
    """What this module reads of a run's site (``config.spec.SiteSpec`` has it)."""

    @property
    def source(self) -> str | None: ...
    @property
    def executor(self) -> str: ...
    @property
    def nsys_path(self) -> str | None: ...
    @property
    def container(self) -> _Container: ...
    @property
    def backend(self) -> _Backend: ...
    @property
    def node_setup(self) -> Sequence[str]: ...
    @property
    def profiling(self) -> "ProfilingSettings": ...


class ProfiledKnobs(Protocol):
    @property
    def profiler(self) -> str: ...
    @property
    def memory(self) -> str: ...


class ProfiledRun(Protocol):
    """What this module reads of a run (``config.spec.RunSpec`` has it): profiling sits below
    the config layer and sees a run only through these attributes."""

    @property
    def key(self) -> str: ...
    @property
    def knobs(self) -> ProfiledKnobs: ...
    @property
    def site(self) -> ProfiledSite: ...


@dataclass(frozen=True)
class ProfilingSettings:
    """The site's ``profiling:`` block (workflow/schemas/site.schema.yaml documents each key)."""

    traces: str = NSYS_TRACES
    #: CPU sampling and context-switch tracing (``-s cpu --cpuctxsw=process-tree``); off: a
    #: sampled 20-step run made a 2 GB ``.qdstrm`` on the lent GPU machine
    cpu_sampling: bool = False
    #: cudaProfilerApi: only the measured steps (``measured_region()``); delay: ``-y delay_s``
    #: ``-d duration_s`` (the source talk's form); whole: the process from start to end
    capture: str = "cudaProfilerApi"
    delay_s: float | None = None
    duration_s: float | None = None
    #: GPU idle stretches longer than this count as gaps (``prof_gpu_idle_gaps``)
    gap_threshold_us: float = 100.0
    #: keep the full SQLite export (tens of MB) beside the trimmed ``profile.sqlite``
    keep_sqlite: bool = False
    #: more ``nsys profile`` options, as given
    extra_args: tuple[str, ...] = ()
    #: ``nsys stats`` reports saved as CSV; empty: ``finish.DEFAULT_REPORTS``
    stats_reports: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.capture not in CAPTURES:
            raise ValueError(f"capture: expected one of {', '.join(CAPTURES)}, got {self.capture!r}")
        if self.capture == "delay" and self.delay_s is None and self.duration_s is None:
            raise ValueError("capture: delay needs delay_s and/or duration_s")
        if self.capture != "delay" and (self.delay_s is not None or self.duration_s is not None):
            raise ValueError(f"delay_s/duration_s belong to capture: delay, not {self.capture}")
        object.__setattr__(self, "extra_args", tuple(str(a) for a in self.extra_args))
        object.__setattr__(self, "stats_reports", tuple(str(a) for a in self.stats_reports))

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | None, source: str = "site") -> "ProfilingSettings":
        known = {f.name for f in fields(cls)}
        data = dict(data or {})
        for key in data:
            if key not in known:
                raise SpecError(f"{source}: profiling.{key}: unknown key; expected one of: "
                                f"{', '.join(sorted(known))}")
        try:
            return cls(**data)
        except (TypeError, ValueError) as exc:
            raise SpecError(f"{source}: profiling: {exc}") from None


def site_settings(spec: ProfiledRun) -> ProfilingSettings:
    """The ``profiling:`` block of the spec's site (defaults when it has none), as the site
    file was read once (``config.site.load_site``) or spec.json keeps it."""
    return spec.site.profiling


def nsys_executable(spec: ProfiledRun) -> str:
    """The site's ``nsys_path``; else ``nsys`` as found on PATH here for a job that runs here
    (a backend whose profiler reach is "here", no container), else plain ``nsys`` (PATH on the
    node, or in the image)."""
    if spec.site.nsys_path:
        return spec.site.nsys_path
    if spec.site.backend.profiler_reach == "here" and not spec.site.container.image:
        return shutil.which("nsys") or "nsys"
    return "nsys"


def nsys_profile_args(nsys: str, report: Path, *, memory: str,
                      settings: ProfilingSettings) -> list[str]:
    """``nsys profile ...`` for one run (``report`` without the .nsys-rep suffix)."""
    cmd = [nsys, "profile", "--trace", settings.traces]
    if settings.cpu_sampling:
        cmd += ["--sample", "cpu", "--cpuctxsw", "process-tree"]
    else:
        cmd += ["--sample", "none", "--cpuctxsw", "none"]
    if memory == "managed":
        cmd += ["--cuda-um-cpu-page-faults", "true", "--cuda-um-gpu-page-faults", "true"]
    if settings.capture == "cudaProfilerApi":
        cmd += ["--capture-range", "cudaProfilerApi", "--capture-range-end", "stop"]
    elif settings.capture == "delay":
        if settings.delay_s is not None:
            cmd += ["--delay", _seconds(settings.delay_s)]
        if settings.duration_s is not None:
            cmd += ["--duration", _seconds(settings.duration_s)]
    cmd += list(settings.extra_args)
    cmd += ["--force-overwrite", "true", "--output", str(report)]
    return cmd


def _seconds(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def wrapper_args(python: str, run_dir: Path, profiler: str, settings: ProfilingSettings,
                 nsys: str | None = None) -> list[str]:
    """``python -m hopperlab.cli profile job ... --``: runs what follows, then finishes the
    profile."""
    args = [python, "-m", "hopperlab.cli", "profile", "job", "--run-dir", str(run_dir),
            "--profiler", profiler, "--gap-threshold-us", str(settings.gap_threshold_us)]
    if nsys:
        args += ["--nsys", nsys]
    if settings.keep_sqlite:
        args.append("--keep-sqlite")
    for report in settings.stats_reports:
        args += ["--report", report]
    return args + ["--"]


def profiler_prefix(spec: ProfiledRun, run_dir: Path, python: str = "python",
                    settings: ProfilingSettings | None = None) -> list[str]:
    """Arguments put before the job's python (empty unless the ``profiler`` knob asks)."""
    profiler = spec.knobs.profiler
    if profiler not in ("nsys", "torch"):
        return []
    settings = settings or site_settings(spec)
    run_dir = Path(run_dir).resolve()
    if profiler == "torch":
        return wrapper_args(python, run_dir, "torch", settings)
    nsys = nsys_executable(spec)
    report = run_dir / PROFILE_DIR / REPORT_STEM
    return (wrapper_args(python, run_dir, "nsys", settings, nsys)
            + nsys_profile_args(nsys, report, memory=spec.knobs.memory, settings=settings))


def check_profiler(spec: ProfiledRun) -> None:
    """Refuse, before submission, a ``profiler: nsys`` run that cannot get an nsys.

    Checked here, by where the site's backend runs the job (``profiler_reach``): a job that
    runs on this machine ("here": local, no container) needs an executable nsys (``nsys_path``,
    else on PATH); an in-process job ("none": debug) cannot be wrapped by nsys at all; a job on
    another node ("node": Slurm) without a container needs ``nsys_path``, nsys on PATH here, or
    setup lines (``slurm.setup``: a ``module load``) that put it on the node's PATH. Inside a
    container the image is trusted to carry nsys (the NGC images do). The site's
    ``profiling:`` block is read (and so validated) too.
    """
    if spec.knobs.profiler == "none":
        return
    site = spec.site
    site_settings(spec)  # a mistake in the profiling: block fails here too
    if spec.knobs.profiler != "nsys":
        return
    where = f"{site.source or 'site'}: nsys_path"
    reach = site.backend.profiler_reach
    if reach == "none":
        raise SpecError(f"{spec.key} asks for profiler=nsys, but executor {site.executor} runs "
                        f"the job in this process (`hopperlab run`), which nsys cannot wrap: "
                        f"submit it with an executor that starts a process (local, slurm)")
    if site.container.image:
        return
    if site.nsys_path:
        path = Path(site.nsys_path)
        if reach == "here" and not (path.is_file() and os.access(path, os.X_OK)):
            raise SpecError(f"{where}: {site.nsys_path} is not an executable file on this machine "
                            f"({spec.key} asks for profiler=nsys)")
        return
    if reach == "here" and shutil.which("nsys") is None:
        raise SpecError(f"{where}: {spec.key} asks for profiler=nsys, but no nsys is on PATH and "
                        f"the site sets no nsys_path: install Nsight Systems or set nsys_path to "
                        f"its nsys executable")
    if reach == "node" and shutil.which("nsys") is None and not site.node_setup:
        raise SpecError(f"{where}: {spec.key} asks for profiler=nsys, but the site sets no "
                        f"nsys_path, no container and no {site.executor}.setup (e.g. `module "
                        f"load nsight-systems`), and no nsys is on PATH here: say where nsys is "
                        f"on the nodes")
