"""The matrix: configs/config.yaml (with overrides) + experiments/*.yaml + a site -> one RunSpec
per run. Every config mistake is caught here, before anything is submitted, and reported with
the file, the key path and what was expected (``SpecError``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from hopperlab.assets.registry import apply_substitutes, load_assets
from hopperlab.config.isolation import host_bound
from hopperlab.config.processes import resolve_processes
from hopperlab.config.site import load_site, site_scale
from hopperlab.config.sweeps import expand as expand_sweep
from hopperlab.config.spec import (
    DEFAULT_RESOURCES,
    Matrix,
    Resources,
    RunSpec,
    SiteSpec,
    build_params,
    check_knobs,
    check_variant,
)
from hopperlab.core.errors import SpecError, clip, shown
from hopperlab.core.schema import (
    check_expansion,
    check_name_length,
    check_path_length,
    check_path_name,
    key_path,
    load_yaml,
    project_schema,
    validate_against_schema,
    value_children,
)
from hopperlab.workloads import FAMILY_MODULES, family_info
from hopperlab.workloads.base import KNOB_DEFAULTS

SCALES = ("smoke", "full")


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
    validate_against_schema(config, project_schema(root, "config.schema.yaml"), where)
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
                     known_assets: Mapping[str, str] | None = None,
                     asset_specs: Mapping[str, Any] | None = None) -> list[RunSpec]:
    """The selected runs of one family; ``known_assets`` maps each asset name to the asset
    used in its place (``asset_substitutes``, derived assets included); ``asset_specs`` (every
    asset's spec, derived ones too) lets the family check the files its assets name."""
    path = root / "experiments" / f"{family}.yaml"
    source = str(path.relative_to(root))
    if family not in FAMILY_MODULES:
        raise SpecError(f"configs/config.yaml: families: unknown family {shown(family)}; "
                        f"known families: {', '.join(sorted(FAMILY_MODULES))}")
    data = load_yaml(path, "experiments")
    validate_against_schema(data, project_schema(root, "experiments.schema.yaml"), source)
    if data["family"] != family:
        raise SpecError(f"{source}: family: is {shown(data['family'])}, expected {family!r} "
                        f"(the file name)")
    info = family_info(family)
    scale = config["scale"]
    resources_here, site_repeat = site_scale(site, scale)  # the site's, for every run
    base_resources = {**DEFAULT_RESOURCES, **resources_here}
    substitutes = config.get("asset_substitutes") or {}
    runs = []
    for exp_name, exp in data["experiments"].items():
        exp = expand_sweep(family, exp_name, exp, scale, source).experiment  # config/sweeps.py
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
            var_scale = (var.get("scales") or {}).get(scale) or {}
            merged_params = {**exp.get("params", {}), **scale_block.get("params", {}),
                             **var.get("params", {}), **var_scale.get("params", {})}
            assets = {**exp.get("assets", {}), **scale_block.get("assets", {}),
                      **var.get("assets", {}), **var_scale.get("assets", {})}
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
            layers = [base_resources, exp.get("resources", {}), scale_block.get("resources", {}),
                      var.get("resources", {}), var_scale.get("resources", {})]
            resources = resolve_resources(layers)
            check_time(resources, site, where, scale)
            checked = check_knobs(info, knobs, source, var_path, params)
            check_variant(info, checked, params, source, var_path)
            if info.check_assets is not None and asset_specs is not None:
                info.check_assets(params, checked, {role: asset_specs[name] for role, name in
                                                    assets.items() if name in asset_specs},
                                  f"{source}: {var_path}")
            spec = RunSpec(
                family=family, experiment=exp_name, variant=var_name, scale=scale,
                knobs=checked, params=params,
                resources=resources, site=site,
                run_dir=str(Path(config["results_dir"]) / family / exp_name / var_name),
                baseline=exp["baseline"], description=var.get("description", exp.get("description", "")),
                headline_metrics=info.headline_metrics, source=source,
                assets=assets,
                compare_to=_compare_to(var, exp["variants"], var_name, source, var_path),
                repeats=resolve_repeats(config, var, exp, site_repeat),
                processes=resolve_processes(config),
                host_bound=host_bound(exp, var, f"{source}: {var_path}"))
            if _selected(spec.key, list(config.get("only") or [])):
                check_caps(resources, site, where, scale)  # what this site cannot start
                runs.append(spec)
    return runs


def resolve_repeats(config: Mapping[str, Any], var: Mapping[str, Any], exp: Mapping[str, Any],
                    site_default: int | None) -> int:
    """How many times a run measures: ``--config repeats=N`` (this invocation) over the
    variant's ``repeats``, the experiment's, the site's for the scale, else 1."""
    for value, where in ((config.get("repeats"), "configs/config.yaml (with --config "
                          "overrides): repeats"), (var.get("repeats"), "variant repeats"),
                         (exp.get("repeats"), "experiment repeats"), (site_default, "site")):
        if value is None:
            continue
        try:
            n = int(value)
        except (TypeError, ValueError):
            raise SpecError(f"{where}: {shown(value)} is not an integer >= 1") from None
        if n < 1 or str(n) != str(value).strip():
            raise SpecError(f"{where}: {shown(value)} is not an integer >= 1")
        return n
    return 1


def resolve_resources(layers: list[Mapping[str, Any]]) -> Resources:
    """The run's resources from its layers (site, experiment, scale, variant, variant scale),
    later layers winning; ``gpus`` follows ``gpus_per_node`` when a layer names that."""
    merged: dict[str, Any] = {}
    for layer in layers:
        merged.update(layer)
        if "gpus_per_node" in layer and "gpus" not in layer:
            merged["gpus"] = layer["gpus_per_node"]
        elif "gpus" in layer and "gpus_per_node" not in layer:
            merged.pop("gpus_per_node", None)  # a later plain `gpus` means one task again
    if merged.get("gpus_per_node") is not None:
        merged["gpus"] = merged["gpus_per_node"]
    return Resources(**merged)


def check_time(res: Resources, site: SiteSpec, where: str, scale: str) -> None:
    if site.max_time_min and res.time_min > site.max_time_min:
        raise SpecError(
            f"{where}: asks for {res.time_min} min at scale {scale}, "
            f"over the site's max_time_min {site.max_time_min} ({site.source})")


def check_caps(res: Resources, site: SiteSpec, where: str, scale: str) -> None:
    """Refuse, before anything is submitted, a selected run over the site's caps or beyond
    what its backend can start (``spans_nodes``, ``multi_task``)."""
    if site.max_nodes and res.nodes > site.max_nodes:
        raise SpecError(f"{where}: resources.nodes: asks for {res.nodes} nodes at scale {scale}, "
                        f"over the site's max_nodes {site.max_nodes} ({site.source}: max_nodes)")
    if site.max_gpus_per_node is not None and res.gpus > site.max_gpus_per_node:
        raise SpecError(f"{where}: resources.gpus_per_node: asks for {res.gpus} GPUs per node at "
                        f"scale {scale}, over the site's max_gpus_per_node "
                        f"{site.max_gpus_per_node} ({site.source}: max_gpus_per_node)")
    if res.gpus and res.tasks_on_node > res.gpus and res.gpus_per_node:
        raise SpecError(f"{where}: resources.tasks_per_node: {res.tasks_on_node} tasks on "
                        f"{res.gpus} GPUs per node; at most one task per GPU")
    backend = site.backend
    if not backend.spans_nodes and res.nodes > 1:
        raise SpecError(f"{where}: resources.nodes: asks for {res.nodes} nodes, but the site's "
                        f"executor {site.executor} runs {backend.placement} "
                        f"({site.source}: executor)")
    if not backend.multi_task and res.distributed:
        raise SpecError(f"{where}: resources: {res.world_size} tasks, but the {site.executor} "
                        f"executor runs {backend.placement} ({site.source}: executor)")


def _known_assets(root: Path, substitutes: Mapping[str, str]
                  ) -> tuple[dict[str, str] | None, dict[str, Any] | None]:
    """Every asset's name (validated) -> the asset used in its place (itself when no substitute
    touches it), and every asset's spec (derived ones too); (None, None) in a project without
    configs/assets.yaml."""
    if not (root / "configs" / "assets.yaml").is_file():
        return None, None
    specs = load_assets(root)
    check_substitutes(substitutes, set(specs))
    all_specs, renames = apply_substitutes(specs, substitutes)
    return {name: renamed for name, renamed in renames.items() if name in specs}, all_specs


def load_matrix(root: Path | str, overrides: Mapping[str, Any] | None = None) -> Matrix:
    """Resolve the whole matrix; raise SpecError on the first mistake found."""
    root = Path(root).resolve()
    config = load_config(root, overrides)
    site = load_site(root, config["site"], config["results_dir"])
    runs: dict[str, RunSpec] = {}
    known_assets, asset_specs = _known_assets(root, config.get("asset_substitutes") or {})
    for family in config["families"]:
        for spec in load_family_runs(root, family, config, site, known_assets, asset_specs):
            runs[spec.key] = spec
    for sel in config.get("only") or []:
        if not any(_selected(k, [sel]) for k in runs):
            family = sel.split("/")[0]
            if family not in config["families"]:
                where = ("is not a known family" if family not in FAMILY_MODULES else
                         "is not in families")
                raise SpecError(
                    f"configs/config.yaml: only: {shown(sel)} selects no run: {shown(family)} "
                    f"{where} ({', '.join(config['families'])}); add it, e.g. --config "
                    f"families={','.join([*config['families'], family])} only={sel}"
                    if family in FAMILY_MODULES else
                    f"configs/config.yaml: only: {shown(sel)} selects no run: {shown(family)} "
                    f"{where} (known: {', '.join(sorted(FAMILY_MODULES))})")
            raise SpecError(f"configs/config.yaml: only: {shown(sel)} selects no run")
    return Matrix(runs=runs, config=config, site=site, root=root)


def find_root(start: Path | None = None) -> Path:
    """The project root: the nearest folder upward holding configs/config.yaml and a Snakefile."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "configs" / "config.yaml").exists() and (folder / "Snakefile").exists():
            return folder
    raise SpecError(f"{here}: not inside a hopperlab project (no configs/config.yaml + Snakefile "
                    f"found upward); run it inside the project or pass --root PROJECT "
                    f"(before or after the verb: hopperlab check --root PROJECT)")
