# Assets: <assets_dir>/<name>/MANIFEST.sha256, fetched or built once by `hopperlab fetch NAME`
# (configs/assets.yaml and configs/assets.d/*.yaml), verified, shared by every run that names it.
# Thin: the logic is in hopperlab.assets. An asset is rebuilt when its definition (or an input
# asset's) changes: its fingerprint is a param, so Snakemake reruns the rule and the store rebuilds.
#   snakemake assets/tiny-llama/MANIFEST.sha256         build one asset (and what it is built from)
# Needs MATRIX, ASSET_SPECS and ASSETS_DIR (common.smk).


rule asset:
    input:
        lambda wc: asset_input_manifests(ASSET_SPECS, wc.asset, ASSETS_DIR),
    output:
        f"{ASSETS_DIR}/{{asset}}/MANIFEST.sha256",
    params:
        fingerprint=lambda wc: asset_rule_fingerprint(ASSET_SPECS, wc.asset),
    wildcard_constraints:
        asset="[a-z0-9][a-z0-9._-]*",
    shell:
        "{HOPPERLAB} fetch {wildcards.asset} --config {CONFIG_ARGS}"
