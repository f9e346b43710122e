"""Typed run specs: what one run is (``RunSpec``: family, experiment, variant, knobs, params,
resources, site) and the whole matrix of them (``Matrix``). The job rebuilds its RunSpec from
``spec.json``; nothing here touches the machine."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from hopperlab import backends
from hopperlab.backends.base import BackendInfo
from hopperlab.config.cost import CostSpec, cost_from_mapping
from hopperlab.core.errors import AssetMissing, SpecError, clip, shown
from hopperlab.core.schema import typed_from_mapping
from hopperlab.core.secrets import redact_uri
from hopperlab.profiling.command import ProfilingSettings
from hopperlab.workloads import family_info
from hopperlab.workloads.base import KNOB_DEFAULTS, Contradiction, FamilyInfo, Knobs

DEFAULT_RESOURCES = {"gpus": 0, "cpus": 1, "mem_gb": 4.0, "time_min": 10}


@dataclass(frozen=True)
class Resources:
    """What one run asks the scheduler for. ``gpus`` is the GPUs of each node the run holds
    (the matrix sets it from ``gpus_per_node`` when that is given); ``cpus`` and ``mem_gb`` are
    per task. A run spans ``nodes`` x ``tasks_per_node`` tasks (one per GPU when the
    experiment names ``gpus_per_node``, else one)."""

    gpus: int = 0
    cpus: int = 1
    mem_gb: float = 4.0
    time_min: int = 10
    #: pool -> count, overriding the sizes taken from the job's CPUs (node.threads.POOLS)
    threads: dict[str, int] = field(default_factory=dict)
    nodes: int = 1
    gpus_per_node: int | None = None
    tasks_per_node: int | None = None
    #: seconds a collective may wait for a peer before the run is ended (a dead rank)
    collective_timeout_s: int = 300

    @property
    def tasks_on_node(self) -> int:
        if self.tasks_per_node:
            return self.tasks_per_node
        return self.gpus_per_node if self.gpus_per_node else 1

    @property
    def world_size(self) -> int:
        return self.nodes * self.tasks_on_node

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


@dataclass(frozen=True)
class ContainerSettings:
    """The site's container: ``image`` names containers/<image>.def (None: no container)."""

    image: str | None = None
    #: the site's setting: auto, apptainer, singularity, charliecloud or pyxis (None without an
    #: image); the binary is found on PATH on the submitting side (``container_runtime``)
    runtime: str | None = None
    fakeroot: bool = False
    binds: tuple[str, ...] = ()
    #: absolute path of the image the jobs run in (.sif, .ch directory, .sqsh), or a registry
    #: reference pyxis pulls
    image_file: str | None = None
    #: True when the site names an existing image (``container_image``): the workflow builds none
    existing: bool = False


@dataclass(frozen=True)
class SiteSpec:
    name: str
    #: the scheduler backend (``hopperlab.backends``: a folder of it)
    executor: str
    poll_interval_s: float
    container: ContainerSettings
    tracking_uri: str
    #: when runs reach MLflow: "each" (every run's job uploads it as it settles) or "at-end"
    #: (the workflow uploads them all in one `sync` when it ends, success or not: on one
    #: machine that saves the per-run start of MLflow, about 1.5 s of CPU a run)
    tracking_upload: str = "each"
    nsys_path: str | None = None
    allow_oversubscription: bool = False
    max_time_min: int | None = None
    #: the most nodes, and GPUs per node, one run may ask for (None: no cap)
    max_nodes: int | None = None
    max_gpus_per_node: int | None = None
    env: dict[str, str] = field(default_factory=dict)
    source: str = ""
    #: absolute folder of models and data sets
    assets_dir: str = ""
    #: the machine name every run records (None: derived from the node's fingerprint)
    machine: str | None = None
    #: the site's price (None: runs are not priced)
    cost: CostSpec | None = None
    #: the GPU nodes' CPU architecture when it differs from the login node's (x86_64 |
    #: aarch64; None: the same): names the container image <name>.<arch>.sif
    gpu_arch: str | None = None
    #: the site's ``profiling:`` block (nsys settings); spec.json keeps it only when the site
    #: has one, so runs of sites without one keep their spec.json
    profiling: ProfilingSettings = field(default_factory=ProfilingSettings)
    #: the site's ``resources`` by scale and its ``repeats`` (a number, or one per scale; None:
    #: the site says nothing), read with the rest of the file: each run records them resolved
    #: (its own resources and repeats), so spec.json leaves these out (and equality ignores them)
    scale_resources: dict[str, dict[str, Any]] = field(default_factory=dict, compare=False)
    scale_repeats: int | dict[str, int] | None = field(default=None, compare=False)
    #: the settings block of the site's own backend (its site key -> its settings dataclass;
    #: empty when that backend has none). Only its own: spec.json and the fingerprint of a run
    #: never change because some other backend exists or gains a setting
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def backend(self) -> BackendInfo:
        return backends.backend(self.executor)

    def settings_of(self, info: BackendInfo) -> Any:
        """The site's settings of backend ``info`` (its defaults when the site has none)."""
        key = info.site_key
        return self.settings.get(key, info.default_settings()) if key else None

    @property
    def own_settings(self) -> Any:
        """The settings of the site's own backend (None: it has none)."""
        return self.settings_of(self.backend)

    @property
    def node_setup(self) -> tuple[str, ...]:
        """The shell lines the backend runs on the node before the job."""
        return tuple(self.backend.node_setup(self.own_settings))

    def with_settings(self, value: Any) -> "SiteSpec":
        """This site with its own backend's settings replaced by ``value``."""
        return replace(self, settings={**self.settings, str(self.backend.site_key): value})


#: SiteSpec fields of the site file that spec.json leaves out (each run records them resolved)
SITE_FILE_ONLY = ("scale_resources", "scale_repeats")


def backend_settings(values: Mapping[str, Any], where: str, own: BackendInfo,
                     check_others: bool = True) -> dict[str, Any]:
    """The settings block of the site's backend ``own`` from ``values`` (a site file's data, or
    spec.json's site), typed and checked (unknown keys and wrong types named at ``where:
    key``); its defaults when the block is absent. The blocks of other backends in a site file
    are checked alike (``check_others``: a mistake in them is still a mistake) and left out;
    in a spec.json written before issue 38 (every backend's block) they are dropped."""
    found = {}
    for info in backends.all_backends():
        key, settings = info.site_key, info.settings
        if key is None or settings is None or (info.name != own.name and not check_others):
            continue  # a backend with no settings has no site key
        block = values.get(key)
        typed = typed_from_mapping(settings, block or {}, f"{where}: {key}",
                                   f"key of a site's {key} block") \
            if block else info.default_settings()
        if info.name == own.name:
            found[key] = typed
    return found


def other_backend_keys(own: BackendInfo) -> set[str]:
    """The site keys of the other backends' settings blocks (what an old spec.json may hold)."""
    return {str(info.site_key) for info in backends.all_backends()
            if info.site_key and info.name != own.name}


@dataclass(frozen=True)
class RunSpec:
    """Everything one job needs: identity, knobs, typed family params, resources, site."""

    family: str
    experiment: str
    variant: str
    scale: str
    knobs: Knobs
    params: Any  # the family's params dataclass instance
    resources: Resources
    site: SiteSpec
    run_dir: str
    baseline: str
    description: str = ""
    headline_metrics: tuple[str, ...] = ()
    source: str = ""
    git_commit: str | None = None
    #: role -> asset name (e.g. model -> tiny-llama); built by the workflow before the run
    assets: dict[str, str] = field(default_factory=dict)
    #: the variant this run's ratios are taken against (``compare_to``); None: the baseline
    compare_to: str | None = None
    #: how many times the run measures (``repeats``; the family's ``repeat_unit`` says whether
    #: as windows after one warm-up or as reruns): each sample recorded, the median reported
    repeats: int = 1
    #: how many independent jobs measure the run (``processes``; each its own process, on
    #: Slurm possibly its own node), each with ``repeats`` windows: run/processes.py
    processes: int = 1
    #: why the run is host-bound (judged on a host figure: the workflow runs it alone on its
    #: node, config/isolation.py), or None
    host_bound: str | None = None

    def __post_init__(self) -> None:
        for name in ("repeats", "processes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise SpecError(f"{self.source}: {self.key}: {name} must be an integer >= 1, "
                                f"got {value!r}")

    @property
    def key(self) -> str:
        return f"{self.family}/{self.experiment}/{self.variant}"

    def asset_path(self, role: str) -> Path:
        """The folder of the asset this run names for ``role``, checked to be complete.

        Raises ``AssetMissing`` (naming the asset and how to build it) when the run names no
        asset for ``role`` or the asset has not been built.
        """
        if role not in self.assets:
            named = ", ".join(f"{r}={n}" for r, n in self.assets.items()) or "none"
            raise AssetMissing(f"{self.source}: experiments.{self.experiment}: {self.key} names "
                               f"no asset for the role {role!r} (assets: {named})")
        name = self.assets[role]
        folder = Path(self.site.assets_dir) / name
        if not (folder / "MANIFEST.sha256").is_file():
            raise AssetMissing(
                f"asset {name!r} ({role} of {self.key}) is not built in {folder}: run "
                f"`snakemake --cores 2 {folder}/MANIFEST.sha256` or "
                f"`hopperlab assets fetch {name} --assets-dir {self.site.assets_dir}`")
        return folder

    def to_dict(self) -> dict[str, Any]:
        """The spec as written to spec.json (and so to MLflow): the tracking URI without its
        ``user:password@``, which the submitting side keeps in memory only."""
        data = asdict(self)
        data["site"].update(data["site"].pop("settings"))  # each block under its site key
        for key in SITE_FILE_ONLY:
            del data["site"][key]
        if self.site.profiling == ProfilingSettings():
            del data["site"]["profiling"]
        data["site"]["tracking_uri"] = redact_uri(self.site.tracking_uri)
        data["key"] = self.key
        for name in ("compare_to", "host_bound"):  # absent: specs of runs that name none stay
            if data[name] is None:
                del data[name]
        for name in ("repeats", "processes"):  # absent likewise at 1: the fingerprint stays
            if data[name] == 1:
                del data[name]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "RunSpec":
        info = family_info(data["family"])
        site = dict(data["site"])
        own = backends.backend(site["executor"])
        site["settings"] = backend_settings(site, "spec.json: site", own, check_others=False)
        for key in {*site["settings"], *other_backend_keys(own)}:
            site.pop(key, None)  # another backend's block: a spec.json of before issue 38
        site["container"] = ContainerSettings(
            **{**site["container"], "binds": tuple(site["container"]["binds"])})
        site["cost"] = cost_from_mapping(site.get("cost"))
        site["profiling"] = ProfilingSettings.from_mapping(site.get("profiling"),
                                                           "spec.json: site")
        params = build_params(info, data["params"], "spec.json", "params")
        set_knobs = {k: v for k, v in data["knobs"].items() if v != KNOB_DEFAULTS.get(k)}
        knobs = check_knobs(info, set_knobs, "spec.json", "knobs", params)
        check_variant(info, knobs, params, "spec.json", "knobs")  # a hand-edited spec too
        return cls(
            family=data["family"], experiment=data["experiment"], variant=data["variant"],
            scale=data["scale"], knobs=knobs, params=params,
            resources=Resources(**data["resources"]), site=SiteSpec(**site),
            run_dir=data["run_dir"], baseline=data["baseline"],
            description=data.get("description", ""),
            headline_metrics=tuple(data.get("headline_metrics", ())),
            source=data.get("source", ""), git_commit=data.get("git_commit"),
            assets=dict(data.get("assets", {})), compare_to=data.get("compare_to"),
            repeats=int(data.get("repeats", 1)), processes=int(data.get("processes", 1)),
            host_bound=data.get("host_bound"),
        )


@dataclass
class Matrix:
    """The resolved experiment matrix: run key -> RunSpec, in file order."""

    runs: dict[str, RunSpec]
    config: dict[str, Any]
    site: SiteSpec
    root: Path

    @property
    def results_dir(self) -> Path:
        return self.root / self.config["results_dir"]

    def get(self, key: str) -> RunSpec:
        try:
            return self.runs[key]
        except KeyError:
            raise SpecError(unknown_target_message(key, self.runs)) from None

    def experiments(self) -> list[tuple[str, str]]:
        seen: dict[tuple[str, str], None] = {}
        for spec in self.runs.values():
            seen[(spec.family, spec.experiment)] = None
        return list(seen)


def unknown_target_message(key: str, runs: Mapping[str, RunSpec]) -> str:
    parts = key.split("/")
    families = sorted({s.family for s in runs.values()})
    if len(parts) != 3:
        return f"{shown(key)}: a run is named family/experiment/variant"
    fam, exp, var = parts
    key = clip(key)
    if fam not in families:
        return f"{key}: unknown family {shown(fam)}; in the matrix: {', '.join(families)}"
    exps = sorted({s.experiment for s in runs.values() if s.family == fam})
    if exp not in exps:
        return (f"{key}: experiments/{fam}.yaml has no experiment {shown(exp)}; "
                f"it has: {', '.join(exps)}")
    vars_ = [s.variant for s in runs.values() if s.family == fam and s.experiment == exp]
    return (f"{key}: experiments/{fam}.yaml: experiments.{exp} has no variant {shown(var)}; "
            f"it has: {', '.join(vars_)}")


#: what of a spec's data changes a run's result, and so its fingerprint: the run itself and,
#: of its site, how and where it runs. Never how it is tracked, priced or polled, nor any
#: absolute path (a moved checkout, another tracking server or price reruns nothing).
RESULT_KEYS = ("family", "experiment", "variant", "scale", "knobs", "params", "resources",
               "assets")
RESULT_SITE_KEYS = ("executor", "env", "allow_oversubscription", "machine", "gpu_arch")


def result_data(data: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a spec's data (``RunSpec.to_dict()`` or its ``spec.json``) that changes what
    the run produces (``RESULT_KEYS``; of the site: executor, its own backend's ``result_keys``
    such as Slurm's partition and options, environment, the container image by name). Another
    backend's block (an old spec.json has every backend's) changes nothing."""
    site: Mapping[str, Any] = data["site"] if isinstance(data.get("site"), Mapping) else {}
    container: Mapping[str, Any] = (site["container"] if isinstance(site.get("container"),
                                                                     Mapping) else {})
    kept: dict[str, Any] = {k: data.get(k) for k in RESULT_KEYS}
    kept["params"] = _params_with_defaults(data.get("family"), data.get("params"))
    kept["site"] = {k: site.get(k) for k in RESULT_SITE_KEYS}
    info = _site_backend(site.get("executor"))
    if info is not None and info.site_key and info.result_keys:
        block = site.get(info.site_key)
        block = block if isinstance(block, Mapping) else {}
        kept["site"][info.site_key] = {k: block.get(k) for k in info.result_keys}
    kept["site"]["image"] = container.get("image")
    if not kept["site"]["env"]:
        kept["site"]["env"] = {}
    return kept


def _params_with_defaults(family: Any, params: Any) -> Any:
    """A spec's params as far as they change the run (``FamilyInfo.result_params``): a
    spec.json written before the family gained a parameter (its default keeps the old
    behaviour), or before its engines had params of their own, is the same run as one written
    now."""
    if not isinstance(params, Mapping) or not isinstance(family, str):
        return params
    try:
        info = family_info(family)
        return info.result_params(params)
    except (KeyError, SpecError):
        return params


def _site_backend(name: Any) -> BackendInfo | None:
    """The declaration of the backend a spec's site names (None: not one known here)."""
    return backends.backend(name) if isinstance(name, str) and name in backends.names() else None


def spec_data_fingerprint(data: Mapping[str, Any]) -> str:
    """A hash of what in a run's spec data changes its result (``result_data``): equal exactly
    when the run would produce the same thing. Snakemake reruns a run whose fingerprint
    changed; ``hopperlab submit`` adopts a finished run whose did not."""
    import hashlib
    import json

    if not isinstance(data, Mapping):
        return ""
    text = json.dumps(result_data(data), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def build_params(info: FamilyInfo, values: Mapping[str, Any], source: str, path: str) -> Any:
    """The params dataclass of the engine ``values`` name (the family's own where it has no
    engines), refusing unknown names, an engine's foreign keys and wrong types."""
    engine, own = info.own_params(values, f"{source}: {path}")
    what = (f"parameter of the {info.name} family's {engine.name} engine" if info.engines else
            f"parameter of the {info.name} family")
    return typed_from_mapping(engine.params, own, f"{source}: {path}", what)


def check_knobs(info: FamilyInfo, knobs: Mapping[str, Any], source: str, path: str,
                params: Any = None) -> Knobs:
    """Refuse a knob the family (the engine of ``params``) does not implement, or a value it
    does not support."""
    engine = info.engine_of(params)
    who = f"the {info.name} family's {engine.name} engine" if info.engines else \
        f"the {info.name} family"
    for name, value in knobs.items():
        supported = engine.supported_knobs.get(name)
        if supported is None:
            ok = ", ".join(sorted(engine.supported_knobs)) or "none"
            raise SpecError(
                f"{source}: {path}.{clip(name)}: {who} does not support the knob "
                f"{shown(name)} (its knobs: {ok})")
        # a data loader's worker count is any count (its values are samples); an engine with
        # no data loader (one value, 0) refuses any other
        any_count = name == "num_workers" and len(supported) > 1
        if value not in supported and not any_count:
            raise SpecError(
                f"{source}: {path}.{name}: {who} does not implement "
                f"{clip(str(name))}={shown(value)}; "
                f"expected one of: {', '.join(map(str, sorted(supported)))}")
    return Knobs(**{**KNOB_DEFAULTS, **knobs})


def check_variant(info: FamilyInfo, knobs: Knobs, params: Any, source: str, path: str) -> None:
    """Refuse a knob that contradicts the params (the engine's ``check``) before submission,
    naming the knob's key: the queue is no place to learn of a contradiction."""
    check = info.engine_of(params).check
    if check is None:
        return
    try:
        check(knobs, params)
    except Contradiction as exc:
        raise SpecError(f"{source}: {path}.{exc.knob}: {exc.why}") from None
