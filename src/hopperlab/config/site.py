"""A site file (configs/sites/<name>.yaml) as a ``SiteSpec``: executor, resources, container,
tracking, cost. Validated against workflow/schemas/site.schema.yaml; nothing here looks at the
machine (the container runtime is found on the submitting side)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Mapping

from hopperlab import backends
from hopperlab.backends.base import BackendInfo
from hopperlab.config.cost import CostSpec
from hopperlab.config.spec import ContainerSettings, SiteSpec, backend_settings
from hopperlab.core.errors import SpecError, clip, shown
from hopperlab.core.schema import (
    load_yaml,
    project_schema,
    typed_from_mapping,
    validate_against_schema,
)
from hopperlab.node.containers import SITE_EXISTING_KEY, check_site_image, image_path
from hopperlab.profiling.command import ProfilingSettings


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
    validate_against_schema(data, site_schema(root), str(path))
    info = site_backend(data["executor"], str(path))
    image = data.get("container")
    # the files only: the runtime on PATH is found on the submitting side (run.launch)
    runtime = check_site_image(str(path), data.get("container_runtime", "auto"), image,
                               containers_dir=root / "containers")
    uri = (data.get("tracking") or {}).get("uri") or \
        f"sqlite:///{(root / results_dir / 'mlflow.db').resolve()}"
    return SiteSpec(
        name=path.stem, executor=info.name,
        poll_interval_s=float(data.get("poll_interval_s", info.poll_interval_s)),
        settings=backend_settings(data, str(path), info),
        container=ContainerSettings(
            image=image, runtime=runtime, fakeroot=bool(data.get("container_fakeroot", False)),
            binds=tuple(data.get("container_binds", ())),
            image_file=_image_file(root, data, runtime) if image else None,
            existing=bool(image and data.get(SITE_EXISTING_KEY))),
        tracking_uri=uri, tracking_upload=(data.get("tracking") or {}).get("upload", "each"),
        nsys_path=data.get("nsys_path"),
        allow_oversubscription=bool(data.get("allow_oversubscription", False)),
        max_time_min=data.get("max_time_min"),
        max_nodes=data.get("max_nodes"), max_gpus_per_node=data.get("max_gpus_per_node"),
        env=_env(data.get("env") or {}, str(path)),
        source=str(path),
        assets_dir=str((root / data.get("assets_dir", "assets")).resolve()),
        machine=data.get("machine"),
        gpu_arch=data.get("gpu_arch"),
        cost=typed_from_mapping(CostSpec, data["cost"], f"{path}: cost", "key of a site's cost")
        if data.get("cost") else None,
        profiling=ProfilingSettings.from_mapping(data.get("profiling"), str(path)),
        scale_resources={scale: dict(block or {})
                         for scale, block in (data.get("resources") or {}).items()},
        scale_repeats=data.get("repeats"),
    )


def site_schema(root: Path) -> dict[str, Any]:
    """workflow/schemas/site.schema.yaml with each backend's settings block in it: the blocks'
    own keys and types are the backends' (``backend_settings`` checks them)."""
    schema = project_schema(root, "site.schema.yaml")
    blocks = {info.site_key: {"type": "object", "description": info.summary}
              for info in backends.all_backends() if info.site_key}
    return {**schema, "properties": {**schema.get("properties", {}), **blocks}}


def site_backend(name: Any, source: str) -> BackendInfo:
    """The backend a site's ``executor:`` names; unknown: one line naming the file and key and
    the backends there are (each a folder of hopperlab/backends/)."""
    why = backends.broken().get(name) if isinstance(name, str) else None
    if why:
        raise SpecError(f"{source}: executor: the backend {name!r} could not be loaded: {why}")
    if not isinstance(name, str) or name not in backends.names():
        raise SpecError(f"{source}: executor: unknown executor {shown(name)}; expected one of: "
                        f"{', '.join(backends.names())}")
    return backends.backend(name)


def _image_file(root: Path, data: dict[str, Any], runtime: str | None) -> str:
    """The image the jobs run: the site's ``container_image`` (a path from the project, or a
    registry reference for pyxis, kept as written), else containers/<name>.<suffix>."""
    existing = data.get(SITE_EXISTING_KEY)
    if existing:
        if "#" in existing or "://" in existing:
            return str(existing)
        return str((root / existing).resolve())
    return str(image_path(data["container"], root / "containers", data.get("gpu_arch"), runtime))


#: what a job's environment variable may be called (POSIX names; no shell ever reads them)
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _env(env: Any, source: str) -> dict[str, str]:
    """The site's ``env:``, each name checked: a mistake names the key, before any job."""
    if not isinstance(env, dict):
        raise SpecError(f"{source}: env: expected a mapping of NAME: value")
    for name, value in env.items():
        if not isinstance(name, str) or not ENV_NAME.fullmatch(name):
            raise SpecError(f"{source}: env.{clip(str(name))}: not an environment variable "
                            f"name (letters, digits and _, not starting with a digit)")
        if isinstance(value, bool) or not isinstance(value, (str, int, float)) or \
                "\0" in str(value):
            raise SpecError(f"{source}: env.{name}: expected a string or a number, got "
                            f"{shown(value)}")
    return {k: str(v) for k, v in env.items()}


def site_scale(site: SiteSpec, scale: str) -> tuple[dict[str, Any], int | None]:
    """The site's ``resources`` at ``scale`` and its ``repeats`` there (None: the site says
    nothing), as ``load_site`` read them with the rest of the file."""
    repeats = site.scale_repeats
    if isinstance(repeats, Mapping):
        repeats = repeats.get(scale)
    return dict(site.scale_resources.get(scale) or {}), repeats
