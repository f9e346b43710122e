# hopperlab workflow: every (family, experiment, variant) of experiments/*.yaml is one job.
#   snakemake --cores 2                       the default matrix on this machine (scale smoke)
#   snakemake --profile profiles/slurm        the matrix on a Slurm cluster (configs/sites/)
#   snakemake results/membench/copy/h2d-pinned/metrics.json --forcerun   rerun one run
# The rules are thin: each calls the `hopperlab` command; the logic lives in src/hopperlab.
from snakemake.utils import min_version, validate

min_version("9.0")


configfile: "configs/config.yaml"


validate(config, "workflow/schemas/config.schema.yaml")


include: "workflow/rules/common.smk"
include: "workflow/rules/containers.smk"
include: "workflow/rules/assets.smk"
include: "workflow/rules/experiments.smk"
include: "workflow/rules/report.smk"


rule all:
    input:
        REPORT_FILES,
        # every asset the matrix uses: a deleted one is rebuilt and its runs rerun
        ASSET_TARGETS,
    default_target: True
