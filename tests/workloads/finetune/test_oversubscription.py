"""The oversubscription variants (issue 21, part 2): refused before any allocation unless the
node is a Grace Hopper or the site allows it; the matrix declares them."""

from __future__ import annotations

from pathlib import Path

import pytest

from hopperlab.config.matrix import load_matrix
from hopperlab.core.rundir import Recorder, SkipRun
from hopperlab.cuda.managed_policy import oversubscription_refusal
from hopperlab.workloads.base import Contradiction, FakeSite, Knobs, fake_run
from hopperlab.workloads.finetune import FinetuneParams, check
from hopperlab.workloads.finetune.torch import workload as ft_workload
from hopperlab.workloads.finetune.oversubscription import check_oversubscription

ROOT = Path(__file__).resolve().parents[3]
H200 = {"gpu_model": "NVIDIA H200", "cpu_arch": "x86_64", "is_grace_hopper": False}
GH200 = {"gpu_model": "NVIDIA GH200 480GB", "cpu_arch": "aarch64", "is_grace_hopper": True}


def _spec(memory="managed", allow=False):
    return fake_run(FinetuneParams(oversubscribe=True), memory=memory,
                    site=FakeSite(name="gpu-node", allow_oversubscription=allow))


def _rec(tmp_path, hw):
    rec = Recorder(tmp_path / "run", identity={"family": "finetune"})
    rec.hardware = dict(hw)
    return rec


def test_policy():
    assert oversubscription_refusal(True, False, node="n", site="s") is None
    assert oversubscription_refusal(False, True, node="n", site="s") is None
    reason = oversubscription_refusal(False, False, node="NVIDIA H200 on x86_64", site="gpu-node")
    assert "allow_oversubscription: true" in reason and "before any allocation" in reason


def test_refused_on_an_x86_node(tmp_path):
    rec = _rec(tmp_path, H200)
    with pytest.raises(SkipRun, match="oversubscription refused.*NVIDIA H200"):
        check_oversubscription(_spec(), True, rec)
    assert rec.tags["finetune.oversubscription"] == "refused"


@pytest.mark.parametrize("hw,allow,tag", [(GH200, False, "allowed: Grace Hopper"),
                                          (H200, True, "allowed: site allow_oversubscription")])
def test_allowed_on_grace_hopper_or_by_the_site(tmp_path, hw, allow, tag):
    rec = _rec(tmp_path, hw)
    check_oversubscription(_spec(allow=allow), True, rec)
    assert rec.tags["finetune.oversubscription"] == tag


def test_needs_managed_memory():
    with pytest.raises(Contradiction, match="memory: managed"):
        check(Knobs(memory="device"), FinetuneParams(oversubscribe=True))
    check(Knobs(memory="managed"), FinetuneParams(oversubscribe=True))


def test_refused_before_the_model_or_allocator(tmp_path, monkeypatch):
    """The gate runs first: nothing of the training path is reached on a refused node."""
    def boom(*_a, **_k):
        raise AssertionError("the run went past the gate")

    monkeypatch.setattr(ft_workload, "run_torch", boom)
    with pytest.raises(SkipRun):
        ft_workload.run(_spec(), _rec(tmp_path, H200))


def test_matrix_declares_the_gh200_variants():
    keys = load_matrix(ROOT).runs
    for key in ("finetune/full-llama2-7b/managed-oversubscribed",
                "finetune/lora-llama2-7b/managed-oversubscribed"):
        assert keys[key].knobs.memory == "managed" and keys[key].params.oversubscribe
    for key in ("membench/alloc/system", "database/tpch/system"):
        assert keys[key].knobs.memory == "system"
