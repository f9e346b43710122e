# One rule runs every run of the matrix: `hopperlab submit` submits it through submitit to the
# site's executor (Slurm or a local subprocess), waits, settles its record and uploads it.
# The upload creates the MLflow experiment and parent run itself, under a lock: no rule runs
# before it, so that neither the selection nor an unreachable MLflow touches finished runs.


rule run:
    input:
        CONTAINER_IMAGE,
        # the assets the run names (experiments/<family>.yaml: assets), built before it
        lambda wc: run_asset_manifests(MATRIX, wc, ASSETS_DIR),
    output:
        f"{RESULTS}/{{family}}/{{experiment}}/{{variant}}/metrics.json",
    params:
        key=lambda wc: run_key(MATRIX, wc),
        # a change of the resolved spec (params, knobs, resources, site) reruns the run
        spec=lambda wc: spec_fingerprint(MATRIX, wc),
        alone=lambda wc, threads: alone_env(MATRIX, wc, threads),
    # a host-bound run (experiments/<family>.yaml: host_bound) takes every core of a local
    # workflow, so that nothing runs beside it (on Slurm: an exclusive allocation instead)
    threads: lambda wc: run_threads(MATRIX, wc, workflow.cores)
    resources:
        # GPUs the run asks for: `--resources gpus=1` keeps a one-GPU node to one GPU job at a
        # time (local executor); without it (Slurm) the scheduler does the counting
        gpus=lambda wc: MATRIX.runs[run_key(MATRIX, wc)].resources.gpus,
    wildcard_constraints:
        family="[a-z0-9][a-z0-9._-]*",
        experiment="[a-z0-9][a-z0-9._-]*",
        variant="[a-z0-9][a-z0-9._-]*",
    shell:
        "{params.alone}{HOPPERLAB} submit {params.key} {UPLOAD_ARGS} --config {CONFIG_ARGS}"
