"""Typed run specs: experiments/*.yaml + configs/config.yaml + a site file -> one RunSpec per run.

Every config mistake is caught here, before anything is submitted, and reported with the file,
the key path and what was expected (``SpecError``). The same code serves the Snakefile, the
``hopperlab`` CLI and the job itself (which rebuilds its RunSpec from ``spec.json``).
"""

from __future__ import annotations

import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import urlsplit, urlunsplit


from hopperlab.config.cost import CostSpec, cost_from_mapping
from hopperlab.node.containers import image_path, resolve_site_runtime
from hopperlab.core.errors import AssetMissing, SpecError, clip, shown
from hopperlab.core.schema import (
    check_expansion,
    check_name_length,
    check_path_length,
    check_path_name,
    key_path,
    load_yaml,
    safe_load_yaml,
    typed_from_mapping,
    validate_against_schema,
    value_children,
)
from hopperlab.workloads import FAMILY_MODULES, family_info
from hopperlab.workloads.base import KNOB_DEFAULTS, FamilyInfo, Knobs

SCALES = ("smoke", "full")
DEFAULT_RESOURCES = {"gpus": 0, "cpus": 1, "mem_gb": 4.0, "time_min": 10}


def redact_uri(uri: str) -> str:
    """``uri`` without ``user:password@`` (and without a trailing slash): what may be written."""
    uri = str(uri).strip()
    try:
        parts = urlsplit(uri)
    except ValueError:
        return uri
    if parts.scheme in ("http", "https") and ("@" in parts.netloc):
        netloc = parts.netloc.rsplit("@", 1)[1]
        parts = parts._replace(netloc=netloc)
        uri = urlunsplit(parts)
    return uri.rstrip("/") if parts.scheme in ("http", "https") else uri


# --------------------------------------------------------------------------- typed specs
@dataclass(frozen=True)
class Resources:
    gpus: int = 0
    cpus: int = 1
    mem_gb: float = 4.0
    time_min: int = 10


@dataclass(frozen=True)
class SlurmSettings:
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    extra_sbatch: dict[str, Any] = field(default_factory=dict)
    setup: tuple[str, ...] = ()


@dataclass(frozen=True)
class ContainerSettings:
    """The site's container: ``image`` names containers/<image>.def (None: no container)."""

    image: str | None = None
    #: resolved on the submitting machine: apptainer or singularity (None without an image)
    runtime: str | None = None
    fakeroot: bool = False
    binds: tuple[str, ...] = ()
    #: absolute path of the .sif the jobs run in
    image_file: str | None = None


@dataclass(frozen=True)
class SiteSpec:
    name: str
    executor: str
    poll_interval_s: float
    slurm: SlurmSettings
    container: ContainerSettings
    tracking_uri: str
    nsys_path: str | None = None
    allow_oversubscription: bool = False
    max_time_min: int | None = None
    env: dict[str, str] = field(default_factory=dict)
    source: str = ""
    #: absolute folder of models and data sets
    assets_dir: str = ""
    #: the machine name every run records (None: derived from the node's fingerprint)
    machine: str | None = None
    #: the site's price (None: runs are not priced)
    cost: CostSpec | None = None


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
        data["site"]["tracking_uri"] = redact_uri(self.site.tracking_uri)
        data["key"] = self.key
        if data["compare_to"] is None:  # absent: specs of runs that name none stay as they were
            del data["compare_to"]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "RunSpec":
        info = family_info(data["family"])
        site = dict(data["site"])
        site["slurm"] = SlurmSettings(**{**site["slurm"], "setup": tuple(site["slurm"]["setup"])})
        site["container"] = ContainerSettings(
            **{**site["container"], "binds": tuple(site["container"]["binds"])})
        site["cost"] = cost_from_mapping(site.get("cost"))
        return cls(
            family=data["family"], experiment=data["experiment"], variant=data["variant"],
            scale=data["scale"], knobs=Knobs(**data["knobs"]),
            params=build_params(info, data["params"], "spec.json", "params"),
            resources=Resources(**data["resources"]), site=SiteSpec(**site),
            run_dir=data["run_dir"], baseline=data["baseline"],
            description=data.get("description", ""),
            headline_metrics=tuple(data.get("headline_metrics", ())),
            source=data.get("source", ""), git_commit=data.get("git_commit"),
            assets=dict(data.get("assets", {})), compare_to=data.get("compare_to"),
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


# --------------------------------------------------------------------------- validation
def _schema(root: Path, name: str) -> dict[str, Any]:
    path = root / "workflow" / "schemas" / name
    return safe_load_yaml(path.read_text(), str(path))


def build_params(info: FamilyInfo, values: Mapping[str, Any], source: str, path: str) -> Any:
    """The family's params dataclass from a mapping, refusing unknown names and wrong types."""
    return typed_from_mapping(info.params, values, f"{source}: {path}",
                              f"parameter of the {info.name} family")


def check_knobs(info: FamilyInfo, knobs: Mapping[str, Any], source: str, path: str) -> Knobs:
    """Refuse a knob the family does not implement, or a value it does not support."""
    for name, value in knobs.items():
        supported = info.supported_knobs.get(name)
        if supported is None:
            ok = ", ".join(sorted(info.supported_knobs)) or "none"
            raise SpecError(
                f"{source}: {path}.{clip(name)}: the {info.name} family does not support the knob "
                f"{shown(name)} (its knobs: {ok})")
        if name != "num_workers" and value not in supported:
            raise SpecError(
                f"{source}: {path}.{name}: the {info.name} family does not implement "
                f"{clip(str(name))}={shown(value)}; "
                f"expected one of: {', '.join(map(str, sorted(supported)))}")
    return Knobs(**{**KNOB_DEFAULTS, **knobs})


# --------------------------------------------------------------------------- loading
def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` words (``--config`` of ``hopperlab`` and of Snakemake) as overrides."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SpecError(f"--config {shown(pair)}: expected KEY=VALUE")
        out[key] = value
    return out


def load_config(root: Path, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    path = root / "configs" / "config.yaml"
    config = load_yaml(path, "platform config")
    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    check_expansion(overrides, value_children, "--config")
    config.update(overrides)
    if isinstance(config.get("families"), str):
        config["families"] = [f for f in config["families"].split(",") if f]
    if isinstance(config.get("only"), str):
        config["only"] = [f for f in config["only"].split(",") if f]
    if isinstance(config.get("asset_substitutes"), str):
        config["asset_substitutes"] = parse_substitutes(config["asset_substitutes"])
    where = f"{path.relative_to(root)} (with --config overrides)"
    validate_against_schema(config, _schema(root, "config.schema.yaml"), where)
    for part in Path(config["results_dir"]).parts:
        check_name_length(part, f"{where}: results_dir")
    return config


def parse_substitutes(text: str) -> dict[str, str]:
    """``"a:b,c:d"`` (the ``--config`` form of ``asset_substitutes``) -> ``{"a": "b", "c": "d"}``."""
    out: dict[str, str] = {}
    for pair in (p.strip() for p in text.split(",")):
        if not pair:
            continue
        old, sep, new = pair.partition(":")
        if not sep or not old.strip() or not new.strip():
            raise SpecError(f"configs/config.yaml (with --config overrides): asset_substitutes: "
                            f"{shown(pair)} is not NAME:SUBSTITUTE "
                            f"(e.g. dolly-15k:dolly-synthetic)")
        out[old.strip()] = new.strip()
    return out


def check_substitutes(substitutes: Mapping[str, str], known: set[str] | None) -> None:
    """Both sides of every substitution must be assets of configs/assets.yaml (+ assets.d/)."""
    if known is None:
        return
    for old, new in substitutes.items():
        for name in (old, new):
            if name not in known:
                raise SpecError(f"configs/config.yaml (with --config overrides): "
                                f"asset_substitutes.{clip(old)}: unknown asset {shown(name)}; "
                                f"configs/assets.yaml and configs/assets.d/ define: "
                                f"{', '.join(sorted(known))}")


def site_path(root: Path, site: str) -> Path:
    if site.endswith((".yaml", ".yml")) or "/" in site:
        return (root / site) if not Path(site).is_absolute() else Path(site)
    return root / "configs" / "sites" / f"{site}.yaml"


def load_site(root: Path, site: str, results_dir: str) -> SiteSpec:
    path = site_path(root, site)
    if not path.exists():
        known = sorted(p.stem for p in (root / "configs" / "sites").glob("*.yaml"))
        raise SpecError(f"configs/config.yaml: site: no site file {clip(str(path))} "
                        f"(known sites: {', '.join(known)})")
    data = load_yaml(path, "site")
    validate_against_schema(data, _schema(root, "site.schema.yaml"), str(path))
    slurm = data.get("slurm", {})
    image = data.get("container")
    # refused here, before anything is submitted, when this machine has no runtime for it
    runtime = resolve_site_runtime(str(path), data.get("container_runtime", "auto"), image,
                                   containers_dir=root / "containers")
    uri = (data.get("tracking") or {}).get("uri") or \
        f"sqlite:///{(root / results_dir / 'mlflow.db').resolve()}"
    executor = data["executor"]
    return SiteSpec(
        name=path.stem, executor=executor,
        poll_interval_s=float(data.get("poll_interval_s", 30.0 if executor == "slurm" else 0.5)),
        slurm=SlurmSettings(
            partition=slurm.get("partition"), account=slurm.get("account"),
            qos=slurm.get("qos"), constraint=slurm.get("constraint"),
            extra_sbatch=dict(slurm.get("extra_sbatch", {})),
            setup=tuple(slurm.get("setup", ()))),
        container=ContainerSettings(
            image=image, runtime=runtime, fakeroot=bool(data.get("container_fakeroot", False)),
            binds=tuple(data.get("container_binds", ())),
            image_file=str(image_path(image, root / "containers")) if image else None),
        tracking_uri=uri, nsys_path=data.get("nsys_path"),
        allow_oversubscription=bool(data.get("allow_oversubscription", False)),
        max_time_min=data.get("max_time_min"),
        env={k: str(v) for k, v in data.get("env", {}).items()},
        source=str(path),
        assets_dir=str((root / data.get("assets_dir", "assets")).resolve()),
        machine=data.get("machine"),
        cost=typed_from_mapping(CostSpec, data["cost"], f"{path}: cost", "key of a site's cost")
        if data.get("cost") else None,
    )


def _site_resources(root: Path, site: SiteSpec, scale: str) -> dict[str, Any]:
    data = load_yaml(Path(site.source), "site")
    return dict((data.get("resources") or {}).get(scale) or {})


def git_commit(root: Path) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    commit = out.stdout.strip()
    dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True, timeout=5).stdout.strip()
    return commit + ("-dirty" if dirty else "")


def _selected(key: str, only: list[str]) -> bool:
    return not only or any(key == sel or key.startswith(sel.rstrip("/") + "/") for sel in only)


def _compare_to(var: Mapping[str, Any], variants: Mapping[str, Any], var_name: str,
                source: str, var_path: str) -> str | None:
    """The variant a variant's ratios are taken against (``compare_to``); None: the baseline.
    Checked here, so that a typo never turns into ratios against the wrong run."""
    name = var.get("compare_to")
    if name is not None and (name == var_name or name not in variants):
        others = ", ".join(v for v in variants if v != var_name)
        raise SpecError(f"{source}: {var_path}.compare_to: {name!r} is not another variant of "
                        f"this experiment (its other variants: {others})")
    return name


def load_family_runs(root: Path, family: str, config: Mapping[str, Any], site: SiteSpec,
                     commit: str | None,
                     known_assets: Mapping[str, str] | None = None) -> list[RunSpec]:
    """The selected runs of one family; ``known_assets`` maps each asset name to the asset
    used in its place (``asset_substitutes``, derived assets included)."""
    path = root / "experiments" / f"{family}.yaml"
    source = str(path.relative_to(root))
    if family not in FAMILY_MODULES:
        raise SpecError(f"configs/config.yaml: families: unknown family {shown(family)}; "
                        f"known families: {', '.join(sorted(FAMILY_MODULES))}")
    data = load_yaml(path, "experiments")
    validate_against_schema(data, _schema(root, "experiments.schema.yaml"), source)
    if data["family"] != family:
        raise SpecError(f"{source}: family: is {shown(data['family'])}, expected {family!r} "
                        f"(the file name)")
    info = family_info(family)
    scale = config["scale"]
    base_resources = {**DEFAULT_RESOURCES, **_site_resources(root, site, scale)}
    substitutes = config.get("asset_substitutes") or {}
    runs = []
    for exp_name, exp in data["experiments"].items():
        exp_path = f"experiments.{exp_name}"
        if exp["baseline"] not in exp["variants"]:
            raise SpecError(f"{source}: {exp_path}.baseline: {shown(exp['baseline'])} "
                            f"is not one of "
                            f"its variants ({', '.join(exp['variants'])})")
        check_path_name(exp_name, f"{source}: {key_path(['experiments', exp_name])}")
        scale_block = exp["scales"][scale]
        for var_name, var in exp["variants"].items():
            var_path = f"{exp_path}.variants.{var_name}"
            where = f"{source}: {key_path(['experiments', exp_name, 'variants', var_name])}"
            check_path_name(var_name, where)
            check_path_length(root / config["results_dir"] / family / exp_name / var_name, where)
            knobs = {k: var[k] for k in KNOB_DEFAULTS if k in var}
            if config.get("profiler"):   # one profiler for every run of this invocation
                knobs["profiler"] = config["profiler"]
            merged_params = {**exp.get("params", {}), **scale_block.get("params", {}),
                             **var.get("params", {})}
            assets = {**exp.get("assets", {}), **scale_block.get("assets", {}),
                      **var.get("assets", {})}
            if known_assets is not None:
                for role, asset in assets.items():
                    if asset not in known_assets:
                        raise SpecError(
                            f"{source}: {var_path}: assets.{role}: unknown asset {shown(asset)}; "
                            f"configs/assets.yaml and configs/assets.d/ define: "
                            f"{', '.join(sorted(known_assets))}")
            renames = known_assets if known_assets is not None else substitutes
            assets = {role: renames.get(name, name) for role, name in assets.items()}
            params = build_params(info, merged_params, source, f"{var_path}.params")
            resources = Resources(**{**base_resources, **exp.get("resources", {}),
                                     **scale_block.get("resources", {}),
                                     **var.get("resources", {})})
            if site.max_time_min and resources.time_min > site.max_time_min:
                raise SpecError(
                    f"{source}: {var_path}: asks for {resources.time_min} min at scale {scale}, "
                    f"over the site's max_time_min {site.max_time_min} ({site.source})")
            spec = RunSpec(
                family=family, experiment=exp_name, variant=var_name, scale=scale,
                knobs=check_knobs(info, knobs, source, var_path), params=params,
                resources=resources, site=site,
                run_dir=str(Path(config["results_dir"]) / family / exp_name / var_name),
                baseline=exp["baseline"], description=var.get("description", exp.get("description", "")),
                headline_metrics=info.headline_metrics, source=source, git_commit=commit,
                assets=assets,
                compare_to=_compare_to(var, exp["variants"], var_name, source, var_path))
            if _selected(spec.key, list(config.get("only") or [])):
                runs.append(spec)
    return runs


def _known_assets(root: Path, substitutes: Mapping[str, str]) -> dict[str, str] | None:
    """Every asset's name (validated) -> the asset used in its place (itself when no substitute
    touches it); None in a project without configs/assets.yaml."""
    if not (root / "configs" / "assets.yaml").is_file():
        return None
    from hopperlab.assets.registry import apply_substitutes, load_assets  # noqa: PLC0415

    specs = load_assets(root)
    check_substitutes(substitutes, set(specs))
    return {name: renamed for name, renamed in apply_substitutes(specs, substitutes)[1].items()
            if name in specs}


def load_matrix(root: Path | str, overrides: Mapping[str, Any] | None = None) -> Matrix:
    """Resolve the whole matrix; raise SpecError on the first mistake found."""
    root = Path(root).resolve()
    config = load_config(root, overrides)
    site = load_site(root, config["site"], config["results_dir"])
    commit = git_commit(root)
    runs: dict[str, RunSpec] = {}
    known_assets = _known_assets(root, config.get("asset_substitutes") or {})
    for family in config["families"]:
        for spec in load_family_runs(root, family, config, site, commit, known_assets):
            runs[spec.key] = spec
    for sel in config.get("only") or []:
        if not any(_selected(k, [sel]) for k in runs):
            raise SpecError(f"configs/config.yaml: only: {shown(sel)} selects no run")
    return Matrix(runs=runs, config=config, site=site, root=root)


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


def find_root(start: Path | None = None) -> Path:
    """The project root: the nearest folder upward holding configs/config.yaml and a Snakefile."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "configs" / "config.yaml").exists() and (folder / "Snakefile").exists():
            return folder
    raise SpecError(f"{here}: not inside a hopperlab project (no configs/config.yaml + Snakefile "
                    f"found upward); pass --root")


#: keys of a spec's data that say when and from which commit a run ran, not what it runs
VOLATILE_SPEC_KEYS = ("git_commit", "attempt")


def spec_data_fingerprint(data: Mapping[str, Any]) -> str:
    """A hash of a run's spec data (``RunSpec.to_dict()`` or its ``spec.json``) without its
    volatile keys: equal exactly when the run would run the same thing. Snakemake reruns a run
    whose fingerprint changed; ``hopperlab submit`` adopts a finished run whose did not."""
    import hashlib
    import json

    kept = {k: v for k, v in data.items() if k not in VOLATILE_SPEC_KEYS}
    text = json.dumps(kept, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
