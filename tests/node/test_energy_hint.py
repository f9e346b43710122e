"""A GPU node without nvidia-ml-py is told how to measure energy, once (issue 49); a CPU node
gets the plain reason."""

from __future__ import annotations

import logging

from hopperlab.node.energy import nvml


def test_a_gpu_node_gets_the_install_line_once(tmp_path, monkeypatch, caplog):
    gpus = tmp_path / "gpus"
    (gpus / "0000:01:00.0").mkdir(parents=True)
    monkeypatch.setattr(nvml, "_hinted", False)
    with caplog.at_level(logging.WARNING, logger=nvml.__name__):
        first = nvml.missing_reason(gpus)
        second = nvml.missing_reason(gpus)
    assert nvml.INSTALL_HINT in first and first == second
    assert "hopperlab[energy]" in first
    assert sum(nvml.INSTALL_HINT in r.getMessage() for r in caplog.records) == 1


def test_a_cpu_node_gets_the_plain_reason(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(nvml, "_hinted", False)
    with caplog.at_level(logging.WARNING, logger=nvml.__name__):
        assert nvml.missing_reason(tmp_path / "no-driver") == nvml.NOT_INSTALLED
    assert not caplog.records
