"""Issue 50: every prediction carries its model class's measured error, and the models hold
within 10 % where the fixtures let us check them (H200 <-> H100 both ways, 1 -> 2 and 4 GPUs).

Each expected figure is recomputed here from the fixtures' metrics.json (tests/fixtures/machines/
README.md: real runs on lent GPUs), never typed in.
"""

from __future__ import annotations

import json
import re
import statistics

import pytest

from hopperlab.cli.main import main
from hopperlab.core.errors import SpecError
from hopperlab.results.machines import (compare, descriptions, gpu_count, predict,
                                        prediction_error, prediction_pairs, runs)
from tests.helpers import REPO

FIX = REPO / "tests" / "fixtures" / "machines"
MACHINES = REPO / "configs" / "machines"
H200, H100 = "h200-141g-pcie5-x86_64", "h100-80g-pcie5-x86_64"
FOLDER = {H200: FIX / "results-h200", H100: FIX / "results-h100"}

#: the rows bound by the host's kernel dispatch (the GPU recommender's pipeline, the resident
#: first token): no record or description measures a host's dispatch rate, and the H100's host
#: ran theirs ~20 % quicker than the H200's, so across machines they say "not predicted"
HOST_DISPATCH = {("recommender/latency/gpu", "lat_e2e_p50_ms"),
                 ("inference/kv-cache/resident", "ttft_ms_p50")}
OUTSIDE_TEN: set = set()


def _metric(folder, key, metric):
    return json.loads((folder / key / "metrics.json").read_text())["metrics"][metric]


def _predictions(source: str, target: str) -> list[predict.Prediction]:
    descs = descriptions.load_descriptions(MACHINES)
    src = runs.load_folder(FOLDER[source])[0]
    return predict.predict(src, descs[source], descs[target], runs.load_folder(FOLDER[target])[0])


@pytest.mark.parametrize("source, target", [(H200, H100), (H100, H200)])
def test_every_h200_h100_row_is_within_ten_percent_or_says_why(source, target):
    outside = set()
    for p in _predictions(source, target):
        if not (FOLDER[target] / p.key / "metrics.json").exists():
            assert p.measured is None  # a run the target did not make (full-1b: the H200's)
            continue
        if p.unpredictable:
            assert len(p.unpredictable) > 20, (p.key, p.metric)  # a reason, not a shrug
            continue
        measured = _metric(FOLDER[target], p.key, p.metric)
        error = (p.predicted - measured) / measured
        assert p.error == pytest.approx(error)
        if abs(error) > prediction_error.DECISION_ERROR:
            outside.add((p.key, p.metric))
            lo, hi = p.interval  # outside 10 %, but inside what its class says it may miss by
            assert lo <= measured <= hi, (p.key, p.metric, p.interval, measured)
    assert outside == OUTSIDE_TEN


@pytest.mark.parametrize("source, target", [(H200, H100), (H100, H200)])
def test_device_plans_are_an_hbm_and_a_launch_term_and_unfused_ones_a_bracket(source, target):
    preds = {(p.key, p.metric): p for p in _predictions(source, target)}
    src, tgt = descriptions.load_descriptions(MACHINES)[source], \
        descriptions.load_descriptions(MACHINES)[target]
    for q in ("q1", "q6"):
        p = preds[("database/tpch/device", f"{q}_time_ms")]
        t = _metric(FOLDER[source], "database/tpch/device", f"{q}_time_ms")
        b = _metric(FOLDER[source], "database/tpch/device", f"{q}_bytes_read")
        hbm_s, hbm_t = src.hbm_tbps.value * 1e9, tgt.hbm_tbps.value * 1e9  # bytes per ms
        k = src.bf16_tflops.value / tgt.bf16_tflops.value
        assert p.model == "hbm + launch"
        assert p.predicted == pytest.approx(b / hbm_t + (t - b / hbm_s) * k)
        assert abs(p.error) < prediction_error.DECISION_ERROR
    for q in ("q3", "q5", "q12", "q14"):  # unfused: between its stored bytes and all at HBM
        p = preds[("database/tpch/device", f"{q}_time_ms")]
        t = _metric(FOLDER[source], "database/tpch/device", f"{q}_time_ms")
        b = _metric(FOLDER[source], "database/tpch/device", f"{q}_bytes_read")
        hbm_s, hbm_t = src.hbm_tbps.value * 1e9, tgt.hbm_tbps.value * 1e9
        lo, hi = sorted((b / hbm_t + (t - b / hbm_s), t * hbm_s / hbm_t))
        assert p.model == "hbm bracket" and "intermediates" in p.formula
        assert p.predicted == pytest.approx((lo + hi) / 2)
        assert p.spread == pytest.approx((hi - lo) / (hi + lo))
        assert p.interval[0] <= lo * (1 + 1e-9) and p.interval[1] >= hi * (1 - 1e-9)  # bracket
        assert abs(p.error) < prediction_error.DECISION_ERROR


def test_the_committed_error_table_is_what_the_pairs_measure():
    """configs/prediction_errors.yaml cannot drift from the models: remeasured here."""
    pairs, committed = prediction_error.load(REPO / prediction_error.ERRORS_FILE)
    by_pair = prediction_pairs.predictions(REPO, pairs)
    assert prediction_error.measure(by_pair) == committed
    launch = [abs(p.error) for _, preds in by_pair for p in prediction_error.measured_rows(preds)
              if p.model == "launch-bound"]
    assert committed["launch-bound"].worst == pytest.approx(max(launch), abs=1e-4)
    assert committed["launch-bound"].median == pytest.approx(statistics.median(launch), abs=1e-4)
    assert {"collective", "compute", "copy", "hbm + launch", "hbm bracket", "host CPU", "kv reload",
            "launch-bound", "overlap"} <= set(committed)


def test_a_target_figure_that_is_its_own_input_measures_nothing():
    """The H100's description took its copy figures from results-h100's very copy runs: their
    0 % error is by construction, so they are marked and left out of every class and summary;
    the same figures against another node's runs (results-h200-fresh) are evidence."""
    copies = [p for p in _predictions(H200, H100) if p.model == "copy" and p.measured]
    assert copies and all(p.circular for p in copies)
    assert not any(p.model == "copy" for p in prediction_error.measured_rows(copies))
    descs = descriptions.load_descriptions(MACHINES)
    fresh = predict.predict(runs.load_folder(FOLDER[H200])[0], descs[H200], descs[H200],
                            runs.load_folder(FIX / "results-h200-fresh")[0])
    other = [p for p in fresh if p.model == "copy" and p.measured is not None]
    assert other and not any(p.circular for p in other)
    _, committed = prediction_error.load(REPO / prediction_error.ERRORS_FILE)
    assert committed["copy"].pairs == ("results-h200 -> results-h200-fresh",)


def test_predict_measured_opens_with_the_summary_line(capsys):
    assert main(["--root", str(REPO), "predict", str(FOLDER[H200]), "--machine", "h100",
                 "--measured", str(FOLDER[H100])]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    rows = prediction_error.measured_rows(_predictions(H200, H100))
    errors = [abs(p.error) for p in rows]
    worst = max(rows, key=lambda p: abs(p.error))
    assert first.startswith("[hopperlab] predicted h100-80g-pcie5-x86_64")
    assert f"{len(rows)} rows measured" in first
    assert f"median |error| {statistics.median(errors):.1%}" in first
    assert f"{sum(e <= 0.10 for e in errors)} within 10%" in first
    assert f"worst {worst.error:+.1%} ({worst.key} {worst.metric}" in first


def test_every_gh200_prediction_on_the_machines_page_carries_an_interval_and_its_class(tmp_path):
    groups = runs.load_folders([FIX / "results-h200", FIX / "results-h100"])
    descs = descriptions.load_descriptions(MACHINES)
    _, html_path = compare.compare(groups, tmp_path, descriptions=descs,
                                   targets=["gh200-96g-c2c-aarch64"])
    text = html_path.read_text()
    rows = [r for r in text.split("<tr>") if "gh200-96g-c2c-aarch64 (prediction)" in r]
    predicted = [r for r in rows if "not predicted" not in r]
    assert predicted and len(predicted) < len(rows)
    for r in predicted:
        m = re.search(r"likely ([\d.]+)-([\d.]+)x \(model class ([^<]+?) error (\d+)% on (\d+) "
                      r"machine pairs?\)", r)
        assert m, r[:300]
        assert float(m.group(1)) <= float(m.group(2))
    assert "rows measured on their target" in text and "<th>model class</th>" in text


def test_launch_bound_rows_are_not_carried_to_a_host_of_another_architecture():
    descs = descriptions.load_descriptions(MACHINES)
    preds = {(p.key, p.metric): p for p in predict.predict(
        runs.load_folder(FOLDER[H200])[0], descs[H200], descs["gh200-96g-c2c-aarch64"])}
    for key in HOST_DISPATCH | {("inference/weight-streaming/resident", "decode_tokens_per_s")}:
        assert "aarch64 host's dispatch speed" in preds[key].unpredictable, key


def test_an_interval_is_the_class_error_or_the_inputs_spread_whichever_is_wider():
    p = predict.Prediction("a/b/c", "a", "b", "c", "m", "S", "T", 2.0, predicted=1.0,
                           model="compute")
    cls = prediction_error.ClassError("compute", 4, 0.03, 0.08, ("x -> y", "y -> x"))
    prediction_error.attach([p], {"compute": cls})
    assert p.interval == pytest.approx((1 / 1.08, 1 / 0.92))  # |P - M| / M <= 8 %
    assert prediction_error.interval_text(p) == ("0.50x the source's, likely 0.46-0.54x "
                                                 "(model class compute error 8% on 2 machine "
                                                 "pairs)")
    p.spread = 0.2
    prediction_error.attach([p], {"compute": cls})
    assert p.interval == pytest.approx((0.8, 1.2)) and "its own spread 20%" in \
        prediction_error.interval_text(p)
    never = predict.Prediction("a/b/c", "a", "b", "c", "m", "S", "T", 2.0, predicted=1.0,
                               model="new")
    prediction_error.attach([never], {"compute": cls})
    assert never.interval is None and "never checked" in prediction_error.interval_text(never)


def test_a_bad_error_table_names_the_file_and_the_key(tmp_path):
    path = tmp_path / "prediction_errors.yaml"
    path.write_text("pairs: []\nclasses:\n  compute: {rows: 3, median: 0.1}\n")
    with pytest.raises(SpecError, match=r"prediction_errors.yaml: classes.compute: needs"):
        prediction_error.load(path)
    path.write_text("pairs:\n- {source: a}\nclasses: {}\n")
    with pytest.raises(SpecError, match=r"prediction_errors.yaml: pairs\[0\]: needs"):
        prediction_error.load(path)


# ------------------------------------------------------------------------ across GPU counts
H200_DESC = MACHINES / "h200-141g-pcie5-x86_64.yaml"


def _counts(source: str, measured: str) -> dict[tuple[str, str, str], predict.Prediction]:
    desc = descriptions.find_description(MACHINES, H200)
    preds = gpu_count.predict_counts(runs.load_folder(FIX / source)[0], desc,
                                     runs.load_folder(FIX / measured),
                                     runs.load_folder(FIX / "results-4xh200"))
    return {(p.target_machine, p.key, p.metric): p for p in preds}


def test_tp_first_tokens_on_two_and_four_gpus_are_predicted_from_one_within_ten_percent():
    preds = _counts("results-4xh200", "results-4xh200")
    ttft = [p for (_, _, m), p in preds.items() if m == "ttft_ms_p50"]
    assert {p.variant for p in ttft} == {"prompt-3k-c8", "prompt-3k-c8-2gpu", "prompt-31k-c1",
                                         "prompt-31k-c1-2gpu"}
    for p in ttft:
        measured = _metric(FIX / "results-4xh200", p.key, "ttft_ms_p50")
        assert p.measured == pytest.approx(measured) and p.model == "collective"
        assert abs(p.predicted - measured) / measured < 0.10, p.key
        assert "busbw_gbps" in " ".join(p.inputs) and p.inputs["one-GPU run"].startswith(
            f"{p.key.rsplit('-', 1)[0] if p.key.endswith('2gpu') else p.key}-1gpu")
    # decode needs the graph-replayed all-reduce, which these folders did not measure: named
    for (_, _, m), p in preds.items():
        if m != "ttft_ms_p50":
            assert "graph-replayed all_reduce" in p.unpredictable, (p.key, m)


def test_the_13b_fsdp2_step_on_two_gpus_is_predicted_from_one_within_ten_percent():
    preds = _counts("results-h200-fresh", "results-2xh200-fresh")
    key = "finetune/full-llama2-13b-sharded/fsdp2-offload"
    (p,) = [p for (_, k, m), p in preds.items() if k == key and m == "tokens_per_s"]
    one = FIX / "results-h200-fresh" / "finetune/full-llama2-13b-sharded/fsdp2-offload-1gpu"
    m = json.loads((one / "metrics.json").read_text())["metrics"]
    gather = _metric(FIX / "results-4xh200", "membench/collective/all-gather",
                     "busbw_gbps_at_largest")
    coll = 3 * m["params_b"] * 2e9 * (2 - 1) / 2 / (gather * 1e9)
    step = max(m["diag_compute_s"] / 2, coll, m["link_floor_s"], m["floor_optimizer_s"]) \
        + m["step_time_p50_s"] - m["diag_compute_s"]
    assert p.predicted == pytest.approx(m["tokens_per_s"] * m["step_time_p50_s"] / step)
    measured = _metric(FIX / "results-2xh200-fresh", key, "tokens_per_s")
    assert abs(p.predicted - measured) / measured < 0.10
    # its one-GPU run repeated the step (3 windows): the interval is at least that spread
    assert p.spread == pytest.approx((m["tokens_per_s_ci_high"] - m["tokens_per_s_ci_low"]) / 2
                                     / m["tokens_per_s"])
    assert p.interval[0] <= p.predicted / (1 + p.spread)
    (no_one,) = [p for (_, k, _), p in preds.items()
                 if k == "finetune/full-llama2-13b-sharded/fsdp2"]
    assert "no ok one-GPU run finetune/full-llama2-13b-sharded/fsdp2-1gpu" in no_one.unpredictable


def test_predict_gpus_prints_the_gpu_count_rows_with_their_summary(capsys):
    tp = str(FIX / "results-4xh200")
    assert main(["--root", str(REPO), "predict", tp, "--machine", "h200", "--measured", tp,
                 "--gpus"]) == 0
    out = capsys.readouterr().out
    first = out.splitlines()[0]
    assert "rows measured on their target" in first and "model collective" in first
    assert "inference/tp-long-context/prompt-3k-c8-2gpu ttft_ms_p50 on " in out
    assert "[PREDICTION from h200-141g-pcie5-x86_64 (1 GPU)]" in out
    assert main(["--root", str(REPO), "predict", tp, "--machine", "h200", "--gpus"]) == 2


@pytest.mark.parametrize("source, target", [(H200, H100), (H100, H200)])
def test_host_dispatch_bound_rows_are_not_carried_to_another_machine(source, target):
    """Their model erred 12-24 % between the H200 and H100 nodes (two x86 hosts of 16 cores):
    across machines they say why they are not predicted; onto the source's own kind (another
    H200 node, another day) they are still predicted."""
    preds = {(p.key, p.metric): p for p in _predictions(source, target)}
    for key in HOST_DISPATCH:
        assert "host's kernel dispatch" in preds[key].unpredictable, key
    descs = descriptions.load_descriptions(MACHINES)
    same = {(p.key, p.metric): p for p in predict.predict(
        runs.load_folder(FOLDER[H200])[0], descs[H200], descs[H200],
        runs.load_folder(FIX / "results-h200-fresh")[0])}
    for key in HOST_DISPATCH & set(same):
        assert not same[key].unpredictable and same[key].predicted, key
