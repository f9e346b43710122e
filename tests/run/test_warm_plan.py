"""Warm or cold is decided in one place (issue 55): ``warm_plan(spec)`` gives the starter's
socket or None and why; the job's command follows it, and a job planned cold while a starter
runs carries the reason to its record."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from hopperlab.config.matrix import load_matrix
from hopperlab.run.launch import job_python, job_request
from hopperlab.run.warm_client import COLD_ENV, SOCKET_ENV
from hopperlab.run.warm_plan import WARM, could_be_warm, warm_plan
from hopperlab.workloads.base import Knobs

ROOT = Path(__file__).resolve().parents[2]
SOCK = {SOCKET_ENV: "/run/starter.sock"}


@pytest.fixture(scope="module")
def trivial():
    return load_matrix(ROOT, {"families": "selftest"}).get("selftest/trivial/ok")


def test_a_cpu_job_of_this_host_is_forked_where_a_starter_runs(trivial):
    assert warm_plan(trivial, SOCK) == ("/run/starter.sock", WARM)
    assert could_be_warm(trivial)
    socket, why = warm_plan(trivial, {})
    assert socket is None and why.startswith("no warm starter runs")


@pytest.mark.parametrize("change, reason", [
    (lambda s: replace(s, resources=replace(s.resources, gpus=1)), "the run holds 1 GPU(s)"),
    (lambda s: replace(s, knobs=Knobs(profiler="torch")), "under the profiler (torch)"),
    (lambda s: replace(s, site=replace(s.site, container=replace(s.site.container,
                                                                 image="pytorch"))),
     "the site's container image 'pytorch'"),
])
def test_each_reason_to_start_cold_is_said(trivial, change, reason):
    spec = change(trivial)
    socket, why = warm_plan(spec, SOCK)
    assert socket is None and reason in why
    assert not could_be_warm(spec)


def test_a_scheduler_job_is_never_forked():
    spec = load_matrix(ROOT, {"families": "selftest", "site": "slurm"}).get(
        "selftest/trivial/ok")
    socket, why = warm_plan(spec, SOCK)
    assert socket is None and "slurm executor does not start the job as a process" in why


def test_the_command_and_the_record_follow_the_plan(trivial, tmp_path, monkeypatch):
    monkeypatch.setenv(SOCKET_ENV, "/run/starter.sock")
    assert job_python(trivial, tmp_path).endswith("-m hopperlab.run.warm_client /run/starter.sock")
    assert COLD_ENV not in job_request(trivial, tmp_path).env
    gpu = replace(trivial, resources=replace(trivial.resources, gpus=1))
    assert "warm_client" not in job_python(gpu, tmp_path)
    assert job_request(gpu, tmp_path).env[COLD_ENV].startswith("the run holds 1 GPU(s)")
    monkeypatch.delenv(SOCKET_ENV)
    assert COLD_ENV not in job_request(gpu, tmp_path).env  # no starter: nothing was asked
