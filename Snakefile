# hopperlab workflow: every (family, experiment, variant) of experiments/*.yaml is one job.
#   snakemake --cores 2                       the default matrix on this machine (scale smoke)
#   snakemake --profile profiles/slurm        the matrix on a Slurm cluster (configs/sites/)
#   snakemake results/membench/copy/h2d-pinned/metrics.json --forcerun   rerun one run
# The rules are thin: each calls the `hopperlab` command; the logic lives in src/hopperlab.
from snakemake.utils import min_version, validate

from hopperlab.core.errors import SpecError
from hopperlab.cli.workflow import check_config, check_config_file, exit_on_config_error

min_version("9.0")

# hopperlab reads the config before Snakemake does: Snakemake's loader expands YAML aliases
# without bound, and its `validate` prints the whole schema for one unknown key
try:
    check_config_file("configs/config.yaml")
except SpecError as exc:
    exit_on_config_error(exc)


configfile: "configs/config.yaml"


try:
    check_config(config, "workflow/schemas/config.schema.yaml")
except SpecError as exc:
    exit_on_config_error(exc)
validate(config, "workflow/schemas/config.schema.yaml")


include: "workflow/rules/common.smk"
include: "workflow/rules/containers.smk"
include: "workflow/rules/assets.smk"
include: "workflow/rules/experiments.smk"
include: "workflow/rules/report.smk"


rule all:
    input:
        REPORT_FILES,
        # every run: a failed or newly selected run is scheduled even when the report (which
        # onerror refreshes after a failure) is newer than every record
        RUN_OUTPUTS,
        # every asset the matrix uses: a deleted one is rebuilt and its runs rerun
        ASSET_TARGETS,
    default_target: True
