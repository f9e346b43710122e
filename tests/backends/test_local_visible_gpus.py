"""The local executor takes a job's GPUs from the ones its caller was given: two workflows
pinned to GPU 0 and GPU 1 of one node (benchmarks/references_gpu.sh) run side by side, where
submitit alone would hand both jobs GPU 0."""

from __future__ import annotations

import pytest

from hopperlab.backends.base import JobRequest, JobResources
from hopperlab.backends.local import slots
from hopperlab.backends.local.executor import LAUNCHER, caller_gpus


@pytest.fixture(autouse=True)
def _own_slot_pool(tmp_path, monkeypatch):
    """The slots a job of these tests takes (backends/local/slots.py) are of a pool of its own,
    given back after: no other test's job waits for them."""
    monkeypatch.setenv(slots.DIR_ENV, str(tmp_path / "slots"))
    monkeypatch.delenv(slots.SLOTS_ENV, raising=False)
    yield
    slots.release()


@pytest.mark.parametrize("visible, expected", [
    (None, ()), ("", ()), ("1", (1,)), ("0,1", (0, 1)), (" 3 , 2 ", (3, 2)),
    ("GPU-8a1b2c3d-0000-1111-2222-333344445555", ()), ("-1", ()), ("0,GPU-x", ()),
])
def test_the_callers_visible_gpus_as_indices(visible, expected):
    assert caller_gpus(visible) == expected


def _request(tmp_path, gpus: int) -> JobRequest:
    return JobRequest(key="selftest/x/y", name="x", folder=tmp_path / "submitit", python="python3",
                      resources=JobResources(gpus=gpus, cpus=1, mem_gb=1, time_min=1, nodes=1,
                                             tasks_on_node=1),
                      settings=None, poll_interval_s=1.0)


def test_a_job_gets_its_gpus_from_the_callers(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    ex = LAUNCHER.make_executor(_request(tmp_path, 1), print)
    assert ex.parameters["visible_gpus"] == (1,)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    ex = LAUNCHER.make_executor(_request(tmp_path, 1), print)
    assert ex.parameters["visible_gpus"] == ()     # submitit's numbering: GPU 0


def test_a_job_asking_more_gpus_than_the_caller_has_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    with pytest.raises(ValueError, match="2 gpus requested"):
        LAUNCHER.make_executor(_request(tmp_path, 2), print)
