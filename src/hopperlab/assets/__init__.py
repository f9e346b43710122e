"""Inputs of experiments (models, tokenizers, data sets, tables) as assets: each fetched or
built once into ``<assets_dir>/<name>/``, verified (``MANIFEST.sha256``), shared by every run
that needs it, and rebuilt only when its definition in ``configs/assets.yaml`` changes.

Heavy libraries (torch, transformers, huggingface_hub) are imported only where an asset is
built, so that importing this package stays fast for the Snakefile and the CLI.
"""

from hopperlab.assets import builtin_kinds  # noqa: F401 - imported to register them
from hopperlab.core.errors import AssetError, NoNetworkError
from hopperlab.assets.manifest import INFO, MANIFEST, verify
from hopperlab.assets.registry import (
    AssetKind,
    AssetSpec,
    BuildContext,
    RepairContext,
    asset_fingerprint,
    asset_inputs,
    kinds,
    load_assets,
    load_scales,
    register_kind,
)
from hopperlab.assets.random_weights import build_random_model
from hopperlab.assets.store import (
    DEFAULT_ASSETS_DIR,
    asset_dir,
    asset_outputs,
    materialize,
    read_info,
)

__all__ = [
    "AssetError", "AssetKind", "AssetSpec", "BuildContext", "DEFAULT_ASSETS_DIR", "INFO",
    "MANIFEST", "NoNetworkError", "RepairContext", "asset_dir", "asset_fingerprint",
    "asset_inputs", "asset_outputs", "build_random_model", "kinds", "load_assets",
    "load_scales", "materialize", "read_info", "register_kind", "verify",
]
