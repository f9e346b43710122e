# summary.csv and report.html, made from the run directories (not from MLflow).
REPORT_FILES = [f"{RESULTS}/summary.csv", f"{RESULTS}/report.html"]


rule report:
    input:
        RUN_OUTPUTS,
    output:
        REPORT_FILES,
    shell:
        "{HOPPERLAB} report --config {CONFIG_ARGS}"


# Once there are jobs to run: one workflow at a time writes into a results folder, and the jobs
# learn which runs the user forced (`hopperlab submit` adopts the other finished runs of the same
# spec that Snakemake reruns after an interrupt, rather than redoing them).
onstart:
    from hopperlab.core.errors import HopperlabError
    from hopperlab.cli.workflow import (export_forced_runs, hold_results, jobs_to_run,
                                        preflight_or_exit, start_warm_starter)
    from hopperlab.core.bytecode import compile_package

    # one preflight for the whole workflow: scheduler and partition, nsys, the Hub; a problem
    # is one line and exit status 2, before any job (a refused job's output would be deleted)
    RUNS_TO_DO, ASSETS_TO_DO = jobs_to_run(workflow.dag)
    preflight_or_exit(MATRIX, RUNS_TO_DO, ASSETS_TO_DO, ASSET_SPECS)
    try:
        hold_results(MATRIX)
    except HopperlabError as exc:
        raise WorkflowError(f"hopperlab: {exc}") from None
    export_forced_runs(MATRIX, workflow.dag_settings)
    # hopperlab's bytecode once, not in each of every run's three processes (core/bytecode.py)
    compile_package()
    # the local jobs forked from one process that imported torch and transformers once
    # (run/warm.py; HOPPERLAB_WARM_START=0: each a fresh python)
    start_warm_starter(MATRIX, RUNS_TO_DO)


# A rerun of one target, or a run that failed under --keep-going, still refreshes the report.
# (The report made here does not hide failed runs: every run's metrics.json is a target of
# `rule all`, so a missing one is scheduled again whatever the report's age.)
onsuccess:
    from hopperlab.cli.workflow import finish_workflow

    finish_workflow(MATRIX)


onerror:
    from hopperlab.cli.workflow import finish_workflow

    finish_workflow(MATRIX)
