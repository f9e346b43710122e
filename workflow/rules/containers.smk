# Container images: containers/<name>.sif from containers/<name>.def, built through spython with the
# site's runtime (apptainer or singularity, `--fakeroot` when the site says so). Thin: the logic
# is in hopperlab.containers. The image is rebuilt when its .def changes (Snakemake reruns on a
# newer .def whose content differs).
#   snakemake containers/pytorch.sif            build one image
# Needs MATRIX (common.smk) whose site carries `container.runtime` (auto | apptainer | singularity)
# and `container.fakeroot` (see containers/README.md); read only when an image is asked for.
import shlex as _shlex
import sys as _sys

CONTAINERS_CLI = f"{_shlex.quote(_sys.executable)} -m hopperlab.containers"


rule container_image:
    input:
        "containers/{name}.def",
    output:
        "containers/{name}.sif",
    params:
        runtime=lambda wc: (
            MATRIX.site.container.runtime
            if getattr(MATRIX.site.container, "runtime", None) in ("apptainer", "singularity")
            else "auto"
        ),
        fakeroot=lambda wc: (
            "--fakeroot" if getattr(MATRIX.site.container, "fakeroot", False) else ""
        ),
    wildcard_constraints:
        name="[A-Za-z0-9][A-Za-z0-9._-]*",
    shell:
        "{CONTAINERS_CLI} build {wildcards.name} --runtime {params.runtime} {params.fakeroot}"
        " --containers-dir containers --output {output}"
