# hopperlab workflow: every (family, experiment, variant) of experiments/*.yaml is one job.
#   snakemake --cores 2                       the default matrix on this machine (scale smoke)
#   snakemake --profile profiles/slurm        the matrix on a Slurm cluster (configs/sites/)
#   snakemake results/membench/copy/h2d-pinned/metrics.json --forcerun   rerun one run
# The rules are thin: each calls the `hopperlab` command; the logic lives in src/hopperlab.
from snakemake.utils import min_version

from hopperlab.cli.workflow import workflow_matrix

min_version("9.0")

# configs/config.yaml with --config's overrides, read and validated once by hopperlab (no
# `configfile:`: Snakemake's loader expands YAML aliases without bound); a mistake stops here,
# before any job, in one line
MATRIX = workflow_matrix(workflow.basedir, config)


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
