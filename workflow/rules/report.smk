# summary.csv and report.html, made from the run directories (not from MLflow).
REPORT_FILES = [f"{RESULTS}/summary.csv", f"{RESULTS}/report.html"]


rule report:
    input:
        RUN_OUTPUTS,
    output:
        REPORT_FILES,
    shell:
        "{HOPPERLAB} report --config {CONFIG_ARGS}"


# A rerun of one target, or a run that failed under --keep-going, still refreshes the report.
onsuccess:
    from hopperlab.cli.workflow import refresh_report_if_stale

    refresh_report_if_stale(MATRIX)


onerror:
    from hopperlab.cli.workflow import refresh_report_if_stale

    refresh_report_if_stale(MATRIX)
