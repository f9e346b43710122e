"""enroot + pyxis as a Slurm site option, against the real one-node test cluster (tests/infra).

This cluster has no pyxis plugin (Debian packages none), so what is tested is the command line:
the job script submitit writes carries ``srun ... --container-image --container-mounts
--container-workdir`` and the site's env as ``export`` lines, and the real ``sbatch`` accepts it
(``--test-only`` and a real submission). The job then fails on this cluster's srun, which does not
know ``--container-image``: its record says so in one line naming the site file and key. Without
the plugin on the submitting machine the run is refused before anything is submitted.
"""

from __future__ import annotations

import json
import shlex

import pytest
import yaml

from hopperlab.config.matrix import load_matrix
from hopperlab.core.errors import SpecError
from hopperlab.backends.slurm import pyxis
from hopperlab.run import submit
from tests.helpers import copy_project

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(900)]

KEY = "membench/alloc/host"
IMAGE = "nvcr.io#nvidia/pytorch:25.12-py3"


@pytest.fixture
def pyxis_site(tmp_path, slurm_cluster, monkeypatch):
    for name, value in slurm_cluster.env.items():
        monkeypatch.setenv(name, value)
    project = copy_project(tmp_path / "project")
    site = {"executor": "slurm", "poll_interval_s": 1,
            "slurm": {"partition": slurm_cluster.partition},
            "resources": {"smoke": {"gpus": 0, "cpus": 1, "mem_gb": 1, "time_min": 5},
                          "full": {"gpus": 0, "cpus": 1, "mem_gb": 1, "time_min": 5}},
            "container": "pytorch", "container_runtime": "pyxis", "container_image": IMAGE,
            "env": {"HOPPERLAB_SITE": "dgx like"}}
    path = project / "configs/sites/dgx-pyxis.yaml"
    path.write_text(yaml.safe_dump(site))
    matrix = load_matrix(project, {"site": "dgx-pyxis", "only": [KEY]})
    return project, path, matrix


@pytest.mark.integration
def test_without_the_plugin_here_the_run_is_refused_before_sbatch(pyxis_site):
    project, path, matrix = pyxis_site
    assert not pyxis.has_plugin(pyxis.srun_help())  # the real srun of this cluster
    with pytest.raises(SpecError) as err:
        submit.submit(matrix, KEY)
    assert str(err.value).startswith(f"{path}: container_runtime: pyxis, but `srun --help` here "
                                     f"lists no --container-image")
    assert not (project / matrix.get(KEY).run_dir / "submitit").exists()


@pytest.mark.integration
def test_the_job_srun_line_carries_the_container_and_sbatch_takes_it(pyxis_site, slurm_cluster,
                                                                     monkeypatch):
    project, path, matrix = pyxis_site
    # the login node's srun has the plugin; this cluster's compute node (the same srun) has not
    monkeypatch.setattr(pyxis, "srun_help", lambda: "  --container-image=[USER@]IMAGE")
    code = submit.submit(matrix, KEY, log=lambda s: None)
    assert code == 1
    run_dir = project / matrix.get(KEY).run_dir
    scripts = sorted((run_dir / "submitit").glob("*_submission.sh"))
    assert len(scripts) == 1
    script = scripts[0].read_text()
    results, assets = project / "results", project / "assets"
    srun = next(line for line in script.splitlines() if line.startswith("srun "))
    words = shlex.split(srun)
    at = words.index(f"--container-image={IMAGE}")
    assert words[at:at + 6] == [f"--container-image={IMAGE}",
                                f"--container-mounts={results}:{results},{assets}:{assets}",
                                f"--container-workdir={results}", "python", "-u", "-m"], srun
    assert "export HOPPERLAB_SITE='dgx like'" in script
    assert script.index("export HOPPERLAB_SITE") < script.index(srun)
    # the real sbatch accepts the script as it is (it also queued it: the record has its id)
    check = slurm_cluster.run(["sbatch", "--test-only", str(scripts[0])])
    assert check.returncode == 0 and "to start at" in check.stderr, check.stderr
    rec = json.loads((run_dir / "record.json").read_text())
    assert rec["slurm"]["job_id"] and rec["status"] == "failed"
    assert "\n" not in rec["reason"]
    assert rec["reason"].startswith(f"{path}: container_image: the job could not start its "
                                    f"container (pyxis, {IMAGE}): srun: unrecognized option "
                                    f"'--container-image={IMAGE}'"), rec["reason"]
    assert rec["container"] == {"runtime": "pyxis", "image": "pytorch", "image_file": IMAGE,
                                "digest": None}
