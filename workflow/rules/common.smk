# What the rules are made from: the matrix (MATRIX, resolved and validated by the Snakefile) and helpers.
import shlex
import sys

from hopperlab.assets.registry import load_assets as load_asset_specs
from hopperlab.cli.workflow import (
    container_inputs,
    asset_input_manifests,
    asset_rule_fingerprint,
    assets_dir_for_rules,
    bare_forcerun,
    matrix_asset_manifests,
    config_args,
    run_asset_manifests,
    run_key,
    run_output_paths,
    run_threads,
    alone_env,
    spec_fingerprint,
)

RESULTS = MATRIX.config["results_dir"]
# every asset of configs/assets.yaml + configs/assets.d/, and where the site keeps them
# (with the assets derived from substituted ones: asset_substitutes replaces inputs of assets too)
ASSET_SPECS = load_asset_specs(workflow.basedir, MATRIX.config.get("asset_substitutes"))
ASSETS_DIR = assets_dir_for_rules(MATRIX)
ASSET_TARGETS = matrix_asset_manifests(MATRIX, ASSET_SPECS, ASSETS_DIR)
HOPPERLAB = f"{shlex.quote(sys.executable)} -m hopperlab.cli"
CONFIG_ARGS = config_args(MATRIX.config, MATRIX.root)
# a site that uploads at the end (configs/sites/local.yaml): the jobs leave MLflow to the
# workflow's one `sync` (cli/workflow.py: finish_workflow)
UPLOAD_ARGS = "--no-upload" if MATRIX.site.tracking_upload == "at-end" else ""
RUN_OUTPUTS = run_output_paths(MATRIX)
# the image every job runs in, when the site names one (built by containers.smk)
CONTAINER_IMAGE = container_inputs(MATRIX)

# `snakemake <target> --forcerun` (nothing after --forcerun) forces nothing in Snakemake 9.
if bare_forcerun(sys.argv):
    print(
        "hopperlab: `--forcerun` with nothing after it forces nothing in Snakemake 9; "
        "rerun one run with `snakemake --forcerun results/<family>/<experiment>/<variant>/"
        "metrics.json` (or `snakemake <that file> --force`)",
        file=sys.stderr,
    )
