"""Host-bound runs (config/isolation.py, run/isolation.py): declared by an experiment or a
variant with the reason, refused when the value is no reason; the rule gives such a run every
core of a local workflow and says so, Slurm asks for an exclusive allocation, and a run outside
the workflow is recorded as not isolated."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from hopperlab.cli.workflow import alone_env, run_threads
from hopperlab.config.isolation import host_bound
from hopperlab.config.matrix import load_matrix
from hopperlab.core.errors import SpecError
from hopperlab.run.isolation import ALONE_ENV, isolation_of

from tests.helpers import REPO

COPY = "membench/copy/h2d-pinned"


def _wc(key: str) -> SimpleNamespace:
    family, experiment, variant = key.split("/")
    return SimpleNamespace(family=family, experiment=experiment, variant=variant)


def test_the_variant_s_word_wins_and_a_value_that_is_no_reason_is_refused():
    exp = {"host_bound": "the host link"}
    assert host_bound(exp, {}, "x") == "the host link"
    assert host_bound(exp, {"host_bound": False}, "x") is None
    assert host_bound({}, {"host_bound": "its own"}, "x") == "its own"
    with pytest.raises(SpecError, match="experiments/x.yaml: v: host_bound"):
        host_bound({}, {"host_bound": True}, "experiments/x.yaml: v")


def test_a_local_workflow_keeps_a_host_bound_run_alone_and_says_so(monkeypatch):
    matrix = load_matrix(REPO, {"only": [COPY, "membench/alloc/host"]})
    assert matrix.runs[COPY].host_bound and not matrix.runs["membench/alloc/host"].host_bound
    assert run_threads(matrix, _wc(COPY), 8) == 8
    assert run_threads(matrix, _wc("membench/alloc/host"), 8) == 1
    assert alone_env(matrix, _wc(COPY), 8) == f"{ALONE_ENV}=8 "
    assert alone_env(matrix, _wc("membench/alloc/host"), 1) == ""
    spec = matrix.runs[COPY]
    monkeypatch.delenv(ALONE_ENV, raising=False)
    assert isolation_of(spec)["isolated"] is False  # `hopperlab submit` by hand
    monkeypatch.setenv(ALONE_ENV, "8")
    said = isolation_of(spec)
    assert said["isolated"] is True and "all 8" in said["how"]
    debug = replace(spec, site=replace(spec.site, executor="debug"))
    assert isolation_of(debug)["isolated"] is False  # in-process: nothing keeps jobs off


def test_on_slurm_the_job_asks_for_its_node_alone(tmp_path):
    from hopperlab.backends.slurm.executor import make_executor
    from hopperlab.run.launch import job_request

    matrix = load_matrix(REPO, {"site": "slurm", "only": [COPY, "membench/alloc/host"]})
    assert run_threads(matrix, _wc(COPY), 32) == 1  # Slurm isolates: no Snakemake core held
    for key, exclusive in ((COPY, True), ("membench/alloc/host", False)):
        req = job_request(matrix.runs[key], tmp_path / key)
        assert req.exclusive is exclusive
        params = make_executor(req, print).parameters
        assert params.get("exclusive", False) is exclusive, params
    assert "exclusive Slurm allocation" in isolation_of(matrix.runs[COPY])["how"]
