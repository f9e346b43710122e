"""What every experiment family declares about itself, cheap to import (no torch).

The spec layer reads these declarations to refuse a knob a family does not support and to
type-check its parameters before anything is submitted; the runner imports ``entry`` lazily,
inside the job, so heavy imports stay on the compute node.
"""

from __future__ import annotations

import importlib
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence, TypeVar, runtime_checkable

from hopperlab.core.errors import AssetMissing, SpecError
from hopperlab.workloads.prediction import PredictModel

P = TypeVar("P")
#: a run's params type, as its engine declares it (``RunView[TorchParams]``)
P_co = TypeVar("P_co", covariant=True)

#: every value of the ``profiler`` knob the platform can run (``hopperlab.profiling``): a family
#: whose runs open ``measured_region()`` supports them all
PROFILERS = frozenset({"none", "nsys", "torch"})


@dataclass(frozen=True)
class Knobs:
    """The variant knobs of ARCHITECTURE.md, the same names in every family; each family
    declares the values it implements (``FamilyInfo.supported_knobs``)."""

    num_workers: int = 0
    offload: str = "none"
    memory: str = "device"
    precision: str = "bf16"
    profiler: str = "none"


#: each knob's value when a variant leaves it unset
KNOB_DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(Knobs)}


class Contradiction(SpecError):
    """A variant's knob contradicts its params (``FamilyInfo.check``): ``knob`` names the knob,
    set on the variant, so the matrix can say which key of which file to change (a SpecError,
    so that whatever catches the project's config mistakes catches it too)."""

    def __init__(self, knob: str, why: str) -> None:
        super().__init__(f"{knob}: {why}")
        self.knob = knob
        self.why = why


#: which way a metric is better, declared once with the metric (``FamilyInfo.directions``)
HIGHER, LOWER = "higher", "lower"


@dataclass(frozen=True)
class WorkUnit:
    """A unit of work a run's cost is divided by, read from the run's own final metrics.

    ``kind`` says how the metrics give units per second: ``per_s`` (``metric`` is units/s,
    times the spec parameter ``scale_param`` when set: qps x top_n), ``ms_each`` (``metric`` is
    milliseconds per unit), ``sum_per_ms`` (the metrics ending in ``metric`` summed, over the
    metrics ending in ``time_suffix`` summed, in ms), ``count_per_ms`` (how many metrics end in
    ``time_suffix``, over their sum in ms). ``size`` units make one priced amount.

    Energy (``hopperlab.config.energy``): ``energy_per_...`` is the joules of the run's
    ``window`` (``""``: the measured window) over the work done inside it (``done``), else its
    mean power over the units per second, and ``work_per_j`` names the units per joule, in
    ``work_scale`` base units (GB scanned: 1e9 bytes). A unit with a
    ``window`` of its own (the database's DuckDB peer) is not priced: the run's resources did
    not do that work.
    """

    name: str            # the cost metric's name, e.g. cost_per_1m_train_tokens
    label: str           # e.g. "per 1M training tokens"
    size: float
    kind: str
    metric: str = ""
    time_suffix: str = ""
    scale_param: str | None = None
    work_per_j: str = ""     # e.g. train_tokens_per_j
    work_label: str = ""     # e.g. "training tokens per joule"
    work_scale: float = 1.0
    window: str = ""
    #: metrics whose product (times ``scale_param``) is the units of work completed inside the
    #: unit's window(s) (``window``; ``""``: the measured one), e.g. finetune's
    #: ``measured_tokens``, the DuckDB peer's ``duckdb_measured_queries``: what the window's
    #: joules are divided by (issue 36: a stall inside the window is paid for). Empty: energy
    #: per unit divides the window's mean power by the rate (tag ``energy.basis`` says which)
    done: tuple[str, ...] = ()

    @property
    def energy_name(self) -> str:
        """``cost_per_1m_train_tokens`` -> ``energy_per_1m_train_tokens_j``."""
        return "energy" + self.name[len("cost"):] + "_j"


@dataclass(frozen=True)
class EngineInfo:
    """One engine of a family (finetune: transformers + peft, megatron-core, FSDP2): what it
    takes and honours, declared once, so that the matrix refuses at load what it cannot do
    (its own params class, knob values, check) and the job calls its entry as its repeat unit
    says. A family without engines is one engine: ``FamilyInfo.engine_of`` makes it."""

    name: str
    #: frozen dataclass of this engine's params: only the fields this engine reads
    params: type
    #: "package.module:function" called as ``function(spec, recorder)`` inside the job
    entry: str
    #: knob name -> the values this engine implements (a knob not listed is unsupported)
    supported_knobs: dict[str, frozenset[Any]]
    #: ``check(knobs, params)``: raises Contradiction where a knob contradicts the params
    check: Callable[[Knobs, Any], None] | None = None
    #: "reruns" or "windows" (``FamilyInfo.repeat_unit``)
    repeat_unit: str = "reruns"
    #: other names the engine param may give this engine (results of earlier commits)
    aliases: tuple[str, ...] = ()

    def load_entry(self) -> Callable[..., Any]:
        return _load(self.entry)


@dataclass(frozen=True)
class FamilyInfo:
    name: str
    #: "package.module:function" called as ``function(spec: RunView, recorder: Recording)``
    #: inside the job.
    entry: str
    #: knob name -> the values this family implements. A knob not listed is unsupported.
    supported_knobs: dict[str, frozenset[Any]]
    #: frozen dataclass type of the family's parameters.
    params: type
    #: metric names the report charts for every experiment of the family.
    headline_metrics: tuple[str, ...] = field(default_factory=tuple)
    #: "package.module:function" drawing the family's own charts for one experiment:
    #: ``function(runs) -> list[FamilyChart]`` (runs: the report's rows of that experiment).
    #: The module imports matplotlib only (no torch): the report runs on the login node.
    charts: str | None = None
    #: "package.module:function" giving the family's own tables for one experiment as HTML:
    #: ``function(runs) -> str`` ('' when none; e.g. finetune's saved-tensor census). Cheap to
    #: import (no torch): the report runs on the login node.
    tables: str | None = None
    #: metric -> "higher" or "lower" (which is better); machines and references read it
    directions: Mapping[str, str] = field(default_factory=dict)
    #: what a run's cost is divided by (hopperlab.config.cost prices each)
    work_units: tuple[WorkUnit, ...] = ()
    #: figure metric -> the metric of what the host link allows it (same unit): link floors
    floors: Mapping[str, str] = field(default_factory=dict)
    #: ``check(params, knobs, assets, where)``, called when the matrix is loaded for each run
    #: with its asset specs by role (``hopperlab.assets``): the family checks the files an
    #: asset names in the repository (e.g. a model config of its own), and the knobs and params
    #: that model cannot take, and raises SpecError at ``where`` (file and key path of the run).
    #: Cheap: it runs on the login node, before submission.
    check_assets: Callable[[Any, Knobs, Mapping[str, Any], str], None] | None = None
    #: ``check(knobs, params)``: raises Contradiction where a knob contradicts the params (e.g.
    #: ``memory: managed`` with a placement in device memory). Called when the matrix loads and
    #: when the job reads its spec.json, so a family's ``run`` never sees such a variant.
    #: Cheap and pure: no torch, no files.
    check: Callable[[Knobs, Any], None] | None = None
    #: what one of a run's ``repeats`` is (docs/benchmarks/noise.md): ``reruns`` (the runner
    #: calls the entry ``repeats`` times in the job's process, each call with its own set-up and
    #: warm-up) or ``windows`` (the entry sets up and warms up once, then measures
    #: ``spec.repeats`` windows and records each with ``recorder.add_sample``)
    repeat_unit: str = "reruns"
    #: "package.module:NAME" of the family's prediction model (a ``workloads.prediction.
    #: PredictModel``: the figures it predicts on a machine we do not have, and how), loaded
    #: only by ``hopperlab predict`` / ``machines``; None: the family's runs are not predicted
    predict: str | None = None
    #: metrics (shell globs) a host's CPU drives, judged only against references of the same
    #: host CPU (``hopperlab.node.hardware.host_cpu``)
    host_cpu_metrics: tuple[str, ...] = ()
    #: the metrics (shell globs) a reference judges: the family's headline figures, each with a
    #: direction (throughput, step time, request latency, link GB/s, query time). Every other
    #: metric is a diagnostic: recorded and charted, never judged (issue 36: a diagnostic
    #: fraction of 0.005 or a loss figure judged at 5 % made healthy checks fail)
    judged: tuple[str, ...] = ()
    #: the family's engines (``EngineInfo``), the first the default; empty: the family is one
    #: engine, made of ``entry``, ``params``, ``supported_knobs``, ``check`` and ``repeat_unit``
    engines: tuple[EngineInfo, ...] = ()
    #: the param that names the engine (finetune: ``backend``)
    engine_param: str = ""
    #: "package.module:function": ``function(variant_spec, reference_spec) -> Sameness``
    #: (``workloads.sameness``): what "the same result" means for a variant against the run it
    #: is compared with; None: the family's runs are not compared for sameness
    sameness: str | None = None

    def load_entry(self) -> Callable[..., Any]:
        return _load(self.entry)

    def engine_named(self, name: Any, where: str = "params") -> EngineInfo:
        """The engine ``name`` names (an alias included; None: the default); SpecError at
        ``where``.<engine param> for a name no engine has."""
        if not self.engines:
            return EngineInfo(self.name, self.params, self.entry, self.supported_knobs,
                              self.check, self.repeat_unit)
        if name is None:
            return self.engines[0]
        for engine in self.engines:
            if name == engine.name or name in engine.aliases:
                return engine
        known = ", ".join(e.name + "".join(f" (alias {a})" for a in e.aliases)
                          for e in self.engines)
        raise SpecError(f"{where}.{self.engine_param}: {name!r} is no engine of the {self.name} "
                        f"family; its engines: {known}")

    def engine_of(self, params: Any) -> EngineInfo:
        """The engine of a run's params (its dataclass or a mapping; None: the default)."""
        if not self.engines:
            return self.engine_named(None)
        if isinstance(params, Mapping):
            return self.engine_named(params.get(self.engine_param))
        return self.engine_named(getattr(params, self.engine_param, None))

    def own_params(self, values: Mapping[str, Any], where: str = "params"
                   ) -> tuple[EngineInfo, dict[str, Any]]:
        """The engine ``values`` name and the values it takes: its name for an alias, and a
        key set to null that the engine has no field for dropped (``null`` says: not this
        engine's). A key it has no field for with any other value is left for the params
        class to refuse, naming the key."""
        engine = self.engine_named(values.get(self.engine_param) if self.engines else None,
                                   where)
        if not self.engines:
            return engine, dict(values)
        names = {f.name for f in fields(engine.params)}
        out = {k: v for k, v in values.items() if k in names or v is not None}
        if self.engine_param in out:
            out[self.engine_param] = engine.name
        return engine, out

    def result_params(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """A spec's params as far as they change the run: its engine's fields only (an earlier
        spec.json carries every engine's, and dead ones), the engine by its own name, each
        field the spec lacks at its default (it keeps the old behaviour)."""
        engine = self.engine_of(params)
        # a family of one engine keeps every key, as spec.json files of before engines had it
        out: dict[str, Any] = {**params} if not self.engines else {}
        for f in fields(engine.params):
            if f.name in params:
                out[f.name] = params[f.name]
            elif f.default is not MISSING:
                out[f.name] = f.default
            elif f.default_factory is not MISSING:
                out[f.name] = f.default_factory()
        if self.engines:
            out[self.engine_param] = engine.name
        return out

    def load_predict(self) -> PredictModel | None:
        """The family's ``PredictModel`` (None: the family declares none)."""
        return _load(self.predict) if self.predict else None

    def load_sameness(self) -> Callable[..., Any] | None:
        """The family's sameness rule (None: it declares none)."""
        return _load(self.sameness) if self.sameness else None

    def load_charts(self) -> Callable[..., list["FamilyChart"]] | None:
        return _load(self.charts) if self.charts else None

    def load_tables(self) -> Callable[..., str] | None:
        return _load(self.tables) if self.tables else None


@dataclass(frozen=True)
class FamilyChart:
    """One chart of a family's own (a matplotlib ``Figure``, made without pyplot)."""

    title: str
    caption: str
    figure: Any


def frame_variants(fig: Any, ax: Any, variants: Sequence[str], right: float = 0.98) -> None:
    """The frame the families' per-variant charts share: one slot per variant along x (names
    rotated, anchored at their end), no top or right spine, and fixed margins with room for the
    rotated names (``right`` below 1 leaves room for a legend outside the axes)."""
    ax.set_xticks(range(len(variants)), list(variants), rotation=30, ha="right", fontsize=8,
                  rotation_mode="anchor")
    ax.spines[["top", "right"]].set_visible(False)
    fig.subplots_adjust(bottom=0.35, left=0.12, right=right)


# -- the family contract: what a family's ``run(spec, recorder)`` reads and calls ---------------
# config.spec.RunSpec and core.rundir.Recorder provide these (tests/workloads/test_family_contract.py
# checks it); workloads sit below config and see a run only through them (rule 3).

@runtime_checkable
class ResourcesView(Protocol):
    """What the run holds: GPUs of each node (0: none) and CPUs of each task."""

    @property
    def gpus(self) -> int: ...
    @property
    def cpus(self) -> int: ...


@runtime_checkable
class ContainerView(Protocol):
    """The site's container (finetune's NeMo backend runs its own image beside it)."""

    @property
    def runtime(self) -> str | None: ...
    @property
    def binds(self) -> tuple[str, ...]: ...
    @property
    def image_file(self) -> str | None: ...


@runtime_checkable
class SiteView(Protocol):
    """What a family reads of the site it runs on."""

    @property
    def name(self) -> str: ...
    @property
    def allow_oversubscription(self) -> bool: ...
    @property
    def assets_dir(self) -> str: ...
    @property
    def container(self) -> ContainerView: ...


@runtime_checkable
class RunView(Protocol[P_co]):
    """One run as a family sees it: the first argument of ``FamilyInfo.entry``."""

    @property
    def key(self) -> str: ...
    @property
    def experiment(self) -> str: ...
    @property
    def variant(self) -> str: ...
    @property
    def scale(self) -> str: ...
    @property
    def knobs(self) -> Knobs: ...
    @property
    def params(self) -> P_co: ...  # the engine's params dataclass (EngineInfo.params)
    @property
    def resources(self) -> ResourcesView: ...
    @property
    def site(self) -> SiteView: ...
    @property
    def run_dir(self) -> str: ...
    @property
    def repeats(self) -> int: ...
    @property
    def assets(self) -> Mapping[str, str]: ...
    def asset_path(self, role: str) -> Path:
        """The built asset's folder for ``role`` (raises AssetMissing where there is none)."""
        ...


@runtime_checkable
class Recording(Protocol):
    """What a family calls on the run's recorder: the second argument of ``FamilyInfo.entry``."""

    #: the repeat being measured (repeat_unit "windows"), which step lines carry; None: one
    repeat: int | None
    #: the final metrics so far (a window's are recorded as a sample, then cleared)
    metrics: dict[str, float]
    #: the node's fingerprint (``node.hardware``), set by the runner
    hardware: dict[str, Any]

    def set_tag(self, name: str, value: Any) -> None: ...
    def log_metric(self, name: str, value: float) -> None: ...
    def log_metrics(self, metrics: Mapping[str, float] | None = None, **kw: float) -> None: ...
    def log_step(self, step: int, **metrics: float) -> None: ...
    def add_sample(self, metrics: Mapping[str, float]) -> None: ...
    def artifact_path(self, name: str) -> Path: ...
    def mark_setup_done(self) -> None: ...


def _load(ref: str) -> Any:
    module_name, _, func = ref.partition(":")
    return getattr(importlib.import_module(module_name), func)


def package_version(distribution: str) -> str | None:
    """The installed version of ``distribution`` (its metadata, nothing imported), None where
    it is not installed: a family records the version of a library it ran with."""
    import importlib.metadata

    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def spec_params(spec: RunView, params_type: type[P]) -> P:
    """The run's typed params: ``spec.params`` as ``params_type``.

    Workloads are also called by tests and benchmarks with a plain mapping, another dataclass
    or nothing (the defaults) in place of a resolved RunSpec; all of those are accepted here, so
    each workload does not grow its own coercion.
    """
    import dataclasses

    p = spec.params
    if isinstance(p, params_type):
        return p
    if p is None:
        return params_type()
    if isinstance(p, Mapping):
        return params_type(**p)
    if dataclasses.is_dataclass(p) and not isinstance(p, type):
        return params_type(**dataclasses.asdict(p))
    raise TypeError(f"spec.params must be {params_type.__name__}, got {type(p).__name__}")


def no_cuda_reason(torch: Any, gpus: int | None) -> str | None:
    """Why this run measures no GPU (None: it can use CUDA). ``gpus`` is the run's
    ``resources.gpus`` (None: the caller sets no limit). One wording for every family, so that
    records and reports say the same thing for the same cause."""
    if not getattr(torch.version, "cuda", None):
        return f"torch {torch.__version__} is a CPU-only build (no CUDA)"
    if not torch.cuda.is_available():
        return "torch.cuda.is_available() is False (no visible CUDA device)"
    if gpus is not None and gpus < 1:
        return "the run's resources ask for no GPU (resources.gpus = 0)"
    return None


# -- a run without the config layer: tests, benchmarks, membench's sweep -----------------------

@dataclass(frozen=True)
class FakeResources:
    gpus: int = 0
    cpus: int = 1


@dataclass(frozen=True)
class FakeContainer:
    runtime: str | None = None
    binds: tuple[str, ...] = ()
    image_file: str | None = None


@dataclass(frozen=True)
class FakeSite:
    name: str = "fake"
    allow_oversubscription: bool = False
    assets_dir: str = ""
    container: FakeContainer = field(default_factory=FakeContainer)


@dataclass
class FakeRun:
    """A complete RunView built by ``fake_run``: assets map roles straight to folders. Not
    frozen: a test may change what one run asks (``spec.repeats = 3``)."""

    params: Any
    knobs: Knobs
    resources: FakeResources
    site: FakeSite
    run_dir: str
    experiment: str = "fake"
    variant: str = "fake"
    scale: str = "smoke"
    repeats: int = 1
    family: str = "fake"
    assets: Mapping[str, str] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.family}/{self.experiment}/{self.variant}"

    def asset_path(self, role: str) -> Path:
        if role not in self.assets:
            raise AssetMissing(f"{self.key} names no asset for the role {role!r}")
        return Path(self.assets[role])


def fake_run(params: Any = None, *, run_dir: Path | str = ".", gpus: int = 0, cpus: int = 1,
             scale: str = "smoke", repeats: int = 1, assets: Mapping[str, Path | str] | None = None,
             allow_oversubscription: bool = False, site: FakeSite | None = None,
             family: str = "fake", experiment: str = "fake", variant: str = "fake",
             **knobs: Any) -> FakeRun:
    """A RunView for calling a family's ``run`` without a project (no matrix, no site file):
    ``knobs`` are Knobs' fields (unset: their defaults), ``assets`` role -> folder. Unlike the
    matrix it checks nothing: a test may hand a family what the loader would refuse."""
    return FakeRun(
        params=params, knobs=Knobs(**knobs), resources=FakeResources(gpus=gpus, cpus=cpus),
        site=site or FakeSite(allow_oversubscription=allow_oversubscription),
        run_dir=str(run_dir), experiment=experiment, variant=variant, scale=scale,
        repeats=repeats, family=family, assets={k: str(v) for k, v in (assets or {}).items()})
