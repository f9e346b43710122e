"""The correctness verdict (issue 47) from run directories written by hand: what each family
declares, what a run against its reference reads, where the verdict is shown, and that a
DIFFERENT run's figures give no ratio and fail ``check`` and ``compare``."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest

from hopperlab.cli.main import main
from hopperlab.results import correctness
from hopperlab.results.report.html import render_html
from hopperlab.results.report.summary import summary_rows
from hopperlab.results.report.verdicts import experiment_line
from hopperlab.results.rows import read_runs
from hopperlab.workloads.finetune.sameness import FP8, REORDER_FLOAT32
from hopperlab.workloads.finetune.sameness import rule as finetune_rule
from hopperlab.workloads.inference.sameness import (
    REORDER_SHARE_BF16,
    REORDER_SHARE_FLOAT32,
)
from hopperlab.workloads.inference.sameness import rule as inference_rule
from hopperlab.workloads.recommender.sameness import rule as recommender_rule
from hopperlab.workloads.sameness import BOUNDED, EXACT, NOT_COMPARABLE

from tests.results.run_dirs import write_run

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "machines"
LOSSES = [6.25, 6.11, 6.04, 5.98]
GRADS = [1.5, 1.4, 1.3, 1.2]


def _spec(params: dict | None = None, knobs: dict | None = None, **extra) -> dict:
    return {"params": {"dtype": "float32", "backend": "torch", **(params or {})},
            "knobs": {"offload": "none", **(knobs or {})}, **extra}


def _finetune(results: Path, variant: str, losses=LOSSES, grads=GRADS, params=None,
              knobs=None, tokens_per_s: float = 100.0, **spec) -> Path:
    run_dir = write_run(results, f"finetune/lora-llama2-7b/{variant}", samples=(tokens_per_s,),
                        record={"metrics": {"tokens_per_s": tokens_per_s}},
                        spec={"baseline": "baseline", "headline_metrics": ["tokens_per_s"],
                              **_spec(params, knobs), **spec})
    with open(run_dir / "steps.jsonl", "w") as fh:
        for i, loss in enumerate(losses):
            m = {"loss": loss, **({"grad_norm": grads[i]} if grads else {})}
            fh.write(json.dumps({"step": i, "time": 0.0, "metrics": m}) + "\n")
    return run_dir


def _verdicts(results: Path) -> dict[str, correctness.Verdict | None]:
    runs, _ = read_runs(results)
    return {r.variant: r.correctness for r in runs}


# -- the declarations --------------------------------------------------------------------------

def test_finetune_declares_exact_bounded_and_not_comparable():
    base = _spec()
    assert finetune_rule(_spec(knobs={"offload": "activations"}), base).kind == EXACT
    assert finetune_rule(_spec({"checkpointing": True}), base).kind == EXACT  # float32
    # save_on_cpu's contiguous copies: another backward kernel on a GPU in float32
    assert finetune_rule(_spec({"activation_offload": "save_on_cpu"},
                               {"offload": "activations"}), base).kind == BOUNDED
    recompute = finetune_rule(_spec({"recompute_elementwise": True}), base)
    assert (recompute.kind, recompute.bound) == (BOUNDED, REORDER_FLOAT32)
    assert finetune_rule(_spec({"checkpointing": True, "dtype": "bfloat16"}),
                         _spec({"dtype": "bfloat16"})).kind == BOUNDED
    fp8 = finetune_rule(_spec(knobs={"precision": "fp8"}), base)
    assert (fp8.kind, fp8.bound) == (BOUNDED, FP8) and fp8.reason
    nemo = finetune_rule(_spec({"backend": "nemo"}), base)
    assert nemo.kind == NOT_COMPARABLE and "engine" in nemo.reason
    other = finetune_rule(_spec({"num_layers": 4}), base)
    assert other.kind == NOT_COMPARABLE and "num_layers" in other.reason


def test_inference_and_recommender_declarations():
    kv = _spec({"policy": "resident"})
    assert inference_rule(_spec({"policy": "offload"}), kv).kind == EXACT
    assert inference_rule(_spec({"policy": "recompute"}), kv).bound == REORDER_SHARE_FLOAT32
    bf16 = {"policy": "recompute", "dtype": "bfloat16"}
    assert inference_rule(_spec(bf16), _spec({"policy": "resident", "dtype": "bfloat16"})) \
        .bound == REORDER_SHARE_BF16 > REORDER_SHARE_FLOAT32
    assert inference_rule(_spec({"prompt_tokens": 16}), _spec({"prompt_tokens": 48})).kind \
        == NOT_COMPARABLE
    tp = inference_rule({**_spec(), "resources": {"tasks_per_node": 1}},
                        {**_spec(), "resources": {"tasks_per_node": 2}})
    assert tp.kind == BOUNDED
    cpu = _spec({"pipeline": "cpu"})
    assert recommender_rule(_spec({"pipeline": "gpu"}), cpu).kind == BOUNDED
    assert recommender_rule(_spec({"pipeline": "cpu"}, {"num_workers": 4}), cpu).kind == EXACT


# -- the verdicts ------------------------------------------------------------------------------

def test_exact_same_bounded_within_and_a_changed_step_is_different(tmp_path):
    _finetune(tmp_path, "baseline")
    _finetune(tmp_path, "offload", knobs={"offload": "activations"})
    _finetune(tmp_path, "recompute", [x * (1 + 3e-7) for x in LOSSES],
              params={"recompute_elementwise": True})
    _finetune(tmp_path, "wrong", [6.25, 6.20, 6.18, 6.17], knobs={"offload": "activations"})
    found = _verdicts(tmp_path)
    assert found["baseline"] is None
    assert found["offload"].state == correctness.SAME
    assert found["recompute"].state == correctness.WITHIN
    assert 0 < found["recompute"].deviation <= REORDER_FLOAT32
    wrong = found["wrong"]
    assert wrong.state == correctness.DIFFERENT and wrong.against == "baseline"
    assert wrong.detail.startswith("step 1: loss 6.2 against 6.11"), wrong.detail


def test_a_skipped_backward_is_different_at_its_first_step_even_when_bounded(tmp_path):
    _finetune(tmp_path, "baseline")
    # the losses within the bound, but no gradient reached the trainable weights
    _finetune(tmp_path, "recompute", LOSSES, [0.0] * 4, params={"recompute_elementwise": True})
    v = _verdicts(tmp_path)["recompute"]
    assert v.state == correctness.DIFFERENT and v.detail.startswith("step 0: gradient norm 0")


def test_beyond_the_bound_is_different(tmp_path):
    _finetune(tmp_path, "baseline")
    _finetune(tmp_path, "fp8", [x * 1.08 for x in LOSSES], knobs={"precision": "fp8"})
    v = _verdicts(tmp_path)["fp8"]
    assert v.state == correctness.DIFFERENT and v.deviation == pytest.approx(0.08)


def test_records_without_the_figures_and_a_missing_baseline_say_not_compared(tmp_path):
    _finetune(tmp_path, "offload", knobs={"offload": "activations"})
    assert _verdicts(tmp_path)["offload"].detail == "baseline has no run"
    shutil.rmtree(tmp_path / "finetune")
    _finetune(tmp_path, "baseline")
    old = _finetune(tmp_path, "offload", knobs={"offload": "activations"})
    (old / "steps.jsonl").unlink()
    v = _verdicts(tmp_path)["offload"]
    assert v.state == correctness.NOT_COMPARED and "no per-step losses" in v.detail


@pytest.mark.parametrize("machine", sorted(p.name for p in FIXTURES.glob("results-*")))
def test_gpu_fixtures_read_not_compared_never_an_error(machine):
    runs, refused = read_runs(FIXTURES / machine)
    assert runs and not refused
    states = {r.correctness.state for r in runs if r.correctness is not None}
    assert correctness.DIFFERENT not in states
    assert all(r.correctness.state == correctness.NOT_COMPARED for r in runs
               if r.correctness is not None and r.family != "database")


def test_tokens_and_topn_name_the_first_reply_that_differs(tmp_path):
    def write(variant: str, tokens, params) -> None:
        run_dir = write_run(tmp_path, f"inference/kv-cache/{variant}",
                            spec={"baseline": "resident", **_spec(params)})
        (run_dir / "artifacts").mkdir()
        (run_dir / "artifacts" / "evidence.json").write_text(json.dumps({"tokens": tokens}))

    write("resident", {"0": [[1, 2, 3], [4, 5]], "1": [[6, 7]]}, {"policy": "resident"})
    write("offload", {"0": [[1, 2, 3], [4, 5]], "1": [[6, 7]]}, {"policy": "offload"})
    write("managed", {"0": [[1, 2, 3], [4, 9]], "1": [[6, 7]]}, {"policy": "offload"})
    found = _verdicts(tmp_path)
    assert found["offload"].state == correctness.SAME
    v = found["managed"]
    assert v.state == correctness.DIFFERENT
    assert v.detail == "1 of 2 replies differ; first reply 0: at [1][1]: 9 against 5"


def test_first_token_logits_decide_an_exact_reply_whose_later_tokens_differ(tmp_path):
    """On a GPU two runs of one cache can decode other later tokens (a kernel that is not
    repeatable); the first token's logits, bit for bit, say whether the cache came back."""
    def write(variant: str, policy: str, tokens, firsts) -> None:
        run_dir = write_run(tmp_path, f"inference/kv-cache/{variant}",
                            spec={"baseline": "resident", **_spec({"policy": policy})})
        (run_dir / "artifacts").mkdir()
        (run_dir / "artifacts" / "evidence.json").write_text(json.dumps(
            {"tokens": tokens, "first_logits": firsts}))

    write("resident", "resident", {"0/0": [1, 2, 3], "0/1": [4, 5, 6]}, {"0/0": "a", "0/1": "b"})
    write("offload", "offload", {"0/0": [1, 2, 3], "0/1": [4, 5, 7]}, {"0/0": "a", "0/1": "b"})
    write("managed", "offload", {"0/0": [1, 2, 3], "0/1": [4, 5, 6]}, {"0/0": "a", "0/1": "c"})
    found = _verdicts(tmp_path)
    assert found["offload"].state == correctness.SAME
    assert "the later tokens of 1 differ" in found["offload"].detail
    assert found["managed"].state == correctness.DIFFERENT
    assert found["managed"].detail == ("the first token's logits of reply 0/1 differ (digest c "
                                       "against b)")


# -- where the verdict is shown ----------------------------------------------------------------

def _three(tmp_path: Path) -> Path:
    _finetune(tmp_path, "baseline", tokens_per_s=100.0)
    _finetune(tmp_path, "offload", knobs={"offload": "activations"}, tokens_per_s=90.0)
    _finetune(tmp_path, "skipped", LOSSES[:1] * 4, [0.0] * 4,
              knobs={"offload": "activations"}, tokens_per_s=200.0)
    return tmp_path


def test_a_different_run_gives_no_ratio_in_summary_report_and_verdicts(tmp_path):
    runs, _ = read_runs(_three(tmp_path))
    header, rows = summary_rows(runs)
    by = {row[header.index("variant")]: dict(zip(header, row)) for row in rows}
    assert by["skipped"]["correctness"] == "DIFFERENT"
    assert by["skipped"]["tokens_per_s"] == "200.0"
    assert by["skipped"]["tokens_per_s_vs_baseline"] == ""  # no ratio offered
    assert by["offload"]["correctness"] == "same"
    assert by["offload"]["tokens_per_s_vs_baseline"] == "0.9"
    page = render_html(runs)
    assert "<th>correctness</th>" in page and 'class="corr-bad"' in page
    assert "<s>200</s>" in page
    line = experiment_line(runs)
    assert "skipped DIFFERENT" in line and "skipped 2" not in line, line
    from hopperlab.results.machines.tradeoffs import experiment_tradeoffs
    weighed = {t.variant for t in experiment_tradeoffs(runs)}  # the verdicts that lead
    assert "offload" in weighed and "skipped" not in weighed, weighed


def test_check_and_compare_fail_on_a_different_run(tmp_path, capsys):
    results = _three(tmp_path / "b")
    assert main(["--root", str(tmp_path), "check", str(results), "--references",
                 str(tmp_path / "refs")]) == 1
    out = capsys.readouterr().out
    assert "DIFFERENT finetune/lora-llama2-7b/skipped against baseline: step 0: gradient norm 0 against 1.5" in out
    shutil.rmtree(results / "finetune/lora-llama2-7b/skipped")
    assert main(["--root", str(tmp_path), "check", str(results), "--references",
                 str(tmp_path / "refs")]) == 0
    _three(tmp_path / "c")
    assert main(["--root", str(tmp_path), "compare", str(results), str(tmp_path / "c"),
                 "--out", str(tmp_path / "cmp")]) == 1
    assert "B DIFFERENT finetune/lora-llama2-7b/skipped" in capsys.readouterr().out


def test_mlflow_fields_carry_the_verdict_and_its_deviation(tmp_path):
    _finetune(tmp_path, "baseline")
    run_dir = _finetune(tmp_path, "recompute", [x * (1 + 2e-6) for x in LOSSES],
                        params={"recompute_elementwise": True})
    tags, metrics = correctness.mlflow_fields(run_dir)
    assert tags[correctness.MLFLOW_TAG] == correctness.WITHIN
    assert metrics[correctness.MLFLOW_METRIC] == pytest.approx(2e-6, rel=1e-3)
    assert correctness.mlflow_fields(tmp_path / "finetune/lora-llama2-7b/baseline") == ({}, {})


def test_summary_csv_reads_back(tmp_path):
    from hopperlab.results.report.summary import write_summary

    runs, _ = read_runs(_three(tmp_path))
    path = write_summary(runs, tmp_path / "summary.csv")
    rows = list(csv.DictReader(path.open()))
    assert {r["variant"]: r["correctness"] for r in rows} == {
        "baseline": "", "offload": "same", "skipped": "DIFFERENT"}


def test_a_broken_step_line_is_not_compared_with_its_reason_never_a_traceback(tmp_path):
    _finetune(tmp_path, "baseline")
    run_dir = _finetune(tmp_path, "offload", knobs={"offload": "activations"})
    with open(run_dir / "steps.jsonl", "a") as fh:
        fh.write(json.dumps({"step": "two", "metrics": {"loss": 1.0}}) + "\n")
    v = _verdicts(tmp_path)["offload"]
    assert v.state == correctness.NOT_COMPARED and "ValueError" in v.detail, v


def test_another_engine_is_not_compared_unless_its_backward_never_ran(tmp_path):
    """The megatron-core case of issue 47: not comparable with the torch engine's losses, but
    a gradient norm of 0 at every step where the reference's is not is DIFFERENT anyway."""
    _finetune(tmp_path, "baseline")
    _finetune(tmp_path, "nemo-ok", [11.2, 11.1, 11.0, 10.9], [3.0] * 4,
              params={"backend": "nemo"}, compare_to="baseline")
    _finetune(tmp_path, "nemo-dead", [11.24, 11.3, 11.4, 11.46], [0.0] * 4,
              params={"backend": "nemo"}, compare_to="baseline")
    found = _verdicts(tmp_path)
    assert found["nemo-ok"].state == correctness.NOT_COMPARED
    assert "another engine" in found["nemo-ok"].detail
    dead = found["nemo-dead"]
    assert dead.state == correctness.DIFFERENT and "backward did not run" in dead.detail


def test_an_uploaded_run_carries_its_verdict_in_mlflow(tmp_path):
    import mlflow

    from hopperlab.results import tracking

    results = _three(tmp_path / "results")
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    for variant, state in (("skipped", correctness.DIFFERENT), ("offload", correctness.SAME)):
        run = client.get_run(tracking.upload_run(results / "finetune/lora-llama2-7b" / variant,
                                                 uri))
        assert run.data.tags[correctness.MLFLOW_TAG] == state
        assert run.data.tags[f"{correctness.MLFLOW_TAG}.against"] == "baseline"
    assert run.data.metrics[correctness.MLFLOW_METRIC] == 0.0  # offload: identical
