"""The caching allocator's run-time settings (memory/caching_allocator.py): expandable segments
for a run, the default after it, and the sharded backend applying them (CPU: said, not set)."""

from __future__ import annotations

import pytest
import torch

from hopperlab.memory import caching_allocator


@pytest.fixture
def applied(monkeypatch) -> list[str]:
    seen: list[str] = []
    monkeypatch.setattr(caching_allocator, "apply", seen.append)
    return seen


def test_expandable_segments_for_the_block_and_the_default_after_it(applied):
    with caching_allocator.expandable_segments(True) as grown:
        assert grown and applied == ["expandable_segments:True"]
    assert applied == ["expandable_segments:True", "expandable_segments:False"]
    with pytest.raises(RuntimeError, match="out of memory"):
        with caching_allocator.expandable_segments(True):
            raise RuntimeError("out of memory")
    assert applied[-1] == "expandable_segments:False"   # reset after a failure too
    applied.clear()
    with caching_allocator.expandable_segments(False) as grown:
        assert not grown
    assert applied == []


@pytest.mark.integration  # a whole (tiny) sharded run in this process: seconds
def test_the_sharded_backend_says_it_could_not_apply_them_without_cuda(applied, tmp_path):
    from hopperlab.core.rundir import Recorder
    from hopperlab.workloads.finetune.sharded import llama, engine as sharded
    from dataclasses import fields

    from hopperlab.workloads.finetune import McoreParams, ShardedParams

    assert ShardedParams(expandable_segments=True).expandable_segments
    assert "expandable_segments" not in {f.name for f in fields(McoreParams)}
    plan = sharded.Plan(mode="fsdp2", shape=llama.Shape(hidden=32, heads=4, ffn=64, vocab=64,
                                                        layers=2),
                        seq_len=8, micro_batch=2, global_batch=2, steps=1, warmup=1,
                        dtype=torch.float32, lr=1e-3, weight_decay=0.0, seed=5,
                        checkpointing=False, expandable_segments=True)
    rec = Recorder(tmp_path / "run")
    sharded.run(plan, rec, False, None)
    assert rec.tags["finetune.expandable_segments"] == "not applied: no CUDA device"
    assert applied == []
