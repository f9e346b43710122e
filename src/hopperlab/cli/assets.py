"""``hopperlab assets``: fetch, verify and list assets; count a model's parameters.

    hopperlab assets fetch dolly-smoke-prepared [--assets-dir DIR] [--config site=NAME]
    hopperlab assets fetch --scale smoke          # every asset of a scale
    hopperlab assets verify llama-2-7b
    hopperlab assets list
    hopperlab assets params models/llama-2-7b/config.json

(The workflow's rule calls ``hopperlab fetch NAME --config ...``, which finds the site's
assets folder from the matrix.)
No command takes a token: the Hugging Face token comes from ``HF_TOKEN`` in the environment.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from hopperlab.assets.manifest import verify
from hopperlab.assets.random_weights import build_random_model, format_count
from hopperlab.assets.registry import ASSETS_FILE, kinds, load_assets, load_scales
from hopperlab.assets.store import asset_dir, materialize, read_info
from hopperlab.config.matrix import load_config, parse_overrides
from hopperlab.config.site import load_site
from hopperlab.core.errors import SpecError


def find_root(start: Path | None = None) -> Path:
    """The repository root: the nearest folder upwards that has configs/assets.yaml."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / ASSETS_FILE).is_file():
            return folder
    return here


def site_assets_dir(root: Path, overrides: list[str]) -> str:
    """The assets folder of the configured site (``--config site=NAME``): where the workflow
    and ``hopperlab fetch`` build assets, so that ``list`` and ``verify`` look there too."""
    config = load_config(root, parse_overrides(overrides))
    return load_site(root, config["site"], config["results_dir"]).assets_dir


def add_commands(sub: argparse._SubParsersAction) -> None:
    """``hopperlab assets fetch|verify|list|params`` under the main parser's ``sub``."""
    p = sub.add_parser("assets", help="fetch, verify and list assets; count a model's parameters",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.set_defaults(func=run)
    actions = p.add_subparsers(dest="action", required=True)

    def common(q: argparse.ArgumentParser) -> None:
        q.add_argument("--root", default=argparse.SUPPRESS,
                       help="repository root (default: the folder holding configs/assets.yaml)")
        q.add_argument("--assets-dir", default=None,
                       help="where assets live, relative to the root (default: the site's "
                            "assets_dir, where the workflow and `hopperlab fetch` put them)")
        q.add_argument("--config", nargs="*", default=[], metavar="KEY=VALUE",
                       help="configs/config.yaml overrides; site=NAME picks the site")

    f = actions.add_parser("fetch", help="fetch or build assets (verify and repair existing ones)")
    f.add_argument("names", nargs="*", help="asset names (default with --scale: all of it)")
    f.add_argument("--scale", help="fetch every asset of this scale (smoke, full), or refuse "
                                    "named assets it does not list")
    f.add_argument("--weights", choices=("pretrained", "random"),
                   help="override a model's weights (random: architecture only, no download)")
    common(f)
    v = actions.add_parser("verify", help="check assets against their MANIFEST.sha256")
    v.add_argument("names", nargs="*", help="asset names (default: every asset present)")
    v.add_argument("--quick", action="store_true", help="presence and sizes only, no hashing")
    common(v)
    ls = actions.add_parser("list", help="every asset: kind, state, weights")
    common(ls)
    c = actions.add_parser("params", help="count the parameters of a config.json (meta device)")
    c.add_argument("config", type=Path)


def run(args: argparse.Namespace) -> int:
    """Run one ``hopperlab assets`` action; errors propagate to the main command line."""
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    return _run(args)


def _run(args: argparse.Namespace) -> int:
    if args.action == "params":
        _, n = build_random_model(args.config, "meta")
        print(f"{args.config}: {n} parameters ({format_count(n)})")
        return 0
    root = Path(getattr(args, "root", None) or find_root()).resolve()
    if args.assets_dir is None:
        args.assets_dir = site_assets_dir(root, args.config)
    if args.action == "fetch":
        names = list(args.names)
        if not names:
            if not args.scale:
                raise SpecError("fetch: name at least one asset, or --scale to fetch all of one")
            names = load_scales(root).get(args.scale, [])
        specs = load_assets(root)
        for name in names:
            path = materialize(name, root, args.assets_dir, scale=args.scale,
                               weights=args.weights, specs=specs)
            print(path)
        return 0
    specs = load_assets(root)
    if args.action == "verify":
        names = args.names or [n for n in specs if asset_dir(root, args.assets_dir, n).is_dir()]
        unknown = [n for n in names if n not in specs]
        if unknown:
            raise SpecError(f"assets verify: unknown asset {', '.join(map(repr, unknown))}; "
                            f"{ASSETS_FILE} and configs/assets.d/ define: "
                            f"{', '.join(sorted(specs))}")
        bad = 0
        for name in names:
            folder = asset_dir(root, args.assets_dir, name)
            if not folder.is_dir():
                print(f"{name}: absent (no folder {folder}; build it: hopperlab fetch {name})")
                bad += 1
                continue
            problems = verify(folder, deep=not args.quick)
            print(f"{name}: {'ok' if not problems else 'DAMAGED'}")
            for line in problems:
                print(f"  {line}")
            bad += bool(problems)
        return 1 if bad else 0
    registry = kinds()
    for name, spec in specs.items():
        folder = asset_dir(root, args.assets_dir, name)
        info = read_info(folder) or {}
        state = "absent" if not folder.is_dir() else (
            "complete" if not verify(folder, deep=False) else "incomplete")
        weights = info.get("weights") or getattr(spec, "weights", "") or ""
        print(f"{name:28} {spec.kind:16} {state:10} {weights:10} "
              f"{spec.description or registry[spec.kind].summary}")
    return 0
