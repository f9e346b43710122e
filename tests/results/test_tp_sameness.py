"""Tensor-parallel inference (``inference/tp-long-context``) against its one-GPU and TP1 rows
(issue 47): at full scale the rows name their GPUs (``gpus_per_node``), not their tasks, and
are still another number of ranks (bounded, never exact); a row that served another number of
layers (``num_layers: 0``: as many as its GPUs hold) is another model, not compared, where the
same number of layers compares on the greedy tokens. Finetune counts its ranks alike."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hopperlab.config.matrix import load_matrix
from hopperlab.results import correctness
from hopperlab.results.rows import read_runs
from hopperlab.workloads.inference.sameness import rule
from hopperlab.workloads.sameness import BOUNDED

from tests.results.run_dirs import write_run

REPO = Path(__file__).resolve().parents[2]
EXP = "inference/tp-long-context"


@pytest.mark.parametrize("scale", ["smoke", "full"])
def test_another_number_of_gpus_is_bounded_at_both_scales(scale):
    overrides = {"scale": scale, **({"site": "slurm"} if scale == "full" else {})}
    runs = load_matrix(REPO, overrides).runs
    base = runs[f"{EXP}/prompt-31k-c1"].to_dict()
    for variant in ("prompt-31k-c1-1gpu", "prompt-31k-c1-2gpu"):
        declared = rule(runs[f"{EXP}/{variant}"].to_dict(), base)
        assert declared.kind == BOUNDED and "tensor parallel" in declared.reason, \
            (scale, variant, declared)


def _tp(results: Path, variant: str, layers: int, gpus: int, tokens: list) -> None:
    run_dir = write_run(results, f"{EXP}/{variant}", record={"metrics": {"tokens_per_s": 9.0}},
                        spec={"baseline": "prompt-31k-c1", "headline_metrics": ["tokens_per_s"],
                              "params": {"study": "tensor-parallel", "dtype": "bfloat16",
                                         "num_layers": 0},
                              "resources": {"gpus": gpus, "gpus_per_node": gpus, "nodes": 1}})
    evidence = run_dir / "ranks" / "0" / "artifacts" / "evidence.json"
    evidence.parent.mkdir(parents=True)
    evidence.write_text(json.dumps({"tokens": tokens, "served": {"layers": layers}}))


def test_a_row_that_served_other_layers_is_not_compared_the_same_layers_are(tmp_path):
    replies = [[5, 9, 2], [7, 7, 1], [3, 4, 4]]
    _tp(tmp_path, "prompt-31k-c1", 80, 4, replies)
    _tp(tmp_path, "prompt-31k-c1-2gpu", 80, 2, replies)
    _tp(tmp_path, "prompt-31k-c1-1gpu", 62, 1, [[1, 1, 1]] * 3)  # fewer layers: other tokens
    runs, _ = read_runs(tmp_path)
    found = {r.variant: r.correctness for r in runs}
    assert found["prompt-31k-c1-2gpu"].state == correctness.WITHIN
    one = found["prompt-31k-c1-1gpu"]
    assert one.state == correctness.NOT_COMPARED, one     # never DIFFERENT: another model
    assert "layers 62 against 80" in one.detail, one.detail


def test_finetune_counts_ranks_by_gpus_at_full_scale_too():
    from hopperlab.workloads.finetune.sameness import rule as finetune_rule

    def spec(gpus: int) -> dict:
        return {"params": {"dtype": "float32", "backend": "torch", "sharding": "fsdp2"},
                "knobs": {"offload": "none"},
                "resources": {"gpus": gpus, "gpus_per_node": gpus, "tasks_per_node": None,
                              "nodes": 1}}

    # the same training split over 2 GPUs against 1: another order of sums, never bit for bit
    assert finetune_rule(spec(2), spec(1)).kind == BOUNDED
    # one task named or not is one rank
    one = {**spec(1), "resources": {"gpus": 0, "tasks_per_node": 1, "nodes": 1}}
    assert finetune_rule(one, {**spec(1), "resources": {"gpus": 0, "nodes": 1}}).kind != BOUNDED
