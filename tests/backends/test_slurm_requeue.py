"""A Slurm job of hopperlab is submitted with ``--no-requeue``: after a node failure Slurm would
otherwise run the whole job again once the submitter had recorded the run failed, and rewrite
its record (seen on the test cluster: tests/backends/test_distributed_slurm.py)."""

from __future__ import annotations

from dataclasses import replace

from hopperlab.backends.slurm.executor import make_executor
from hopperlab.config.matrix import load_matrix
from hopperlab.run.launch import job_request
from tests.helpers import REPO

KEY = "membench/alloc/host"


def _sbatch_extra(tmp_path, extra_sbatch=None) -> dict:
    spec = load_matrix(REPO, {"site": "slurm", "only": [KEY]}).runs[KEY]
    req = job_request(spec, tmp_path / KEY)
    if extra_sbatch is not None:
        req = replace(req, settings=replace(req.settings, extra_sbatch=extra_sbatch))
    return make_executor(req, print).parameters.get("additional_parameters") or {}


def test_a_slurm_job_is_never_requeued_behind_the_submitters_back(tmp_path):
    assert _sbatch_extra(tmp_path) == {"no_requeue": True}
    # the site's own sbatch options stay, beside it
    assert _sbatch_extra(tmp_path, {"comment": "x"}) == {"comment": "x", "no_requeue": True}


def test_a_site_that_wants_slurms_requeue_says_so_in_extra_sbatch(tmp_path):
    assert _sbatch_extra(tmp_path, {"requeue": True}) == {"requeue": True}
