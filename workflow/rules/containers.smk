# Container images: containers/<name>.sif from containers/<name>.def, built through spython with the
# site's runtime (apptainer or singularity, `--fakeroot` when the site says so). Thin: the logic
# is in hopperlab.node.containers. The image is rebuilt when its .def changes (Snakemake reruns on a
# newer .def whose content differs).
#   snakemake containers/pytorch.sif            build one image
# Needs MATRIX and HOPPERLAB (common.smk): the site's resolved runtime and `container_fakeroot`
# (see containers/README.md); read only when an image is asked for.

rule container_image:
    input:
        "containers/{name}.def",
    output:
        "containers/{name}.sif",
    params:
        runtime=lambda wc: MATRIX.site.container.runtime or "auto",
        fakeroot=lambda wc: "--fakeroot" if MATRIX.site.container.fakeroot else "",
    wildcard_constraints:
        name="[A-Za-z0-9][A-Za-z0-9._-]*",
    shell:
        "{HOPPERLAB} containers build {wildcards.name} --runtime {params.runtime} {params.fakeroot}"
        " --containers-dir containers --output {output}"


# A site whose GPU nodes have another architecture (gpu_arch): containers/<name>.<arch>.sif,
# built where that architecture runs (the build refuses any other machine).
rule container_image_arch:
    input:
        "containers/{name}.def",
    output:
        "containers/{name}.{arch}.sif",
    params:
        runtime=lambda wc: MATRIX.site.container.runtime or "auto",
        fakeroot=lambda wc: "--fakeroot" if MATRIX.site.container.fakeroot else "",
    wildcard_constraints:
        name="[A-Za-z0-9][A-Za-z0-9_-]*",
        arch="x86_64|aarch64",
    shell:
        "{HOPPERLAB} containers build {wildcards.name} --arch {wildcards.arch}"
        " --runtime {params.runtime} {params.fakeroot} --containers-dir containers --output {output}"


ruleorder: container_image_arch > container_image


# Charliecloud (container_runtime: charliecloud): the directory image containers/<name>.ch, built
# here from a Debian base (containers/debian-base.yaml) and the same .def's %files, %post,
# %environment and %test; no registry needed (src/hopperlab/node/charliecloud.py).
rule container_image_charliecloud:
    input:
        "containers/{name}.def",
        "containers/debian-base.yaml",
    output:
        directory("containers/{name}.ch"),
    wildcard_constraints:
        name="[A-Za-z0-9][A-Za-z0-9_-]*",
    shell:
        "{HOPPERLAB} containers build {wildcards.name} --runtime charliecloud"
        " --containers-dir containers --output {output}"
