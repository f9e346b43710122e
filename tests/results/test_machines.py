"""Machines side by side (issue 18), on CPU: names, prices, references and check, machine
descriptions, predictions and the comparison, from the two small results folders of
tests/fixtures/machines/ (an H200 and an H100 as lent)."""

from __future__ import annotations

import csv
import json
import math
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from hopperlab.cli.main import main
from hopperlab.config.cost import CostSpec, price
from hopperlab.config.matrix import load_matrix
from hopperlab.core.errors import SpecError
from hopperlab.node.naming import machine_name
from hopperlab.results.machines import compare, descriptions, predict, references, runs
from hopperlab.results.report import build_report
from hopperlab.results.rows import collect_runs
from hopperlab.run.annotate import annotate_record
from hopperlab.workloads import family_info
from tests.helpers import REPO, copy_project, edit_yaml, reference_day

FIX = REPO / "tests" / "fixtures" / "machines"  # real runs: lent H200 and H100, 2026-11-24
H200, H100 = "h200-141g-pcie5-x86_64", "h100-80g-pcie5-x86_64"
MACHINES = REPO / "configs" / "machines"
REFS = REPO / "configs" / "references"


def _metric(folder: Path, key: str, metric: str) -> float:
    """A run's recorded metric, read from the fixture's metrics.json."""
    return json.loads((folder / key / "metrics.json").read_text())["metrics"][metric]


def _drop_metric(folder: Path, key: str, metric: str) -> None:
    """Removes a metric from a run's record (metrics.json and record.json) in a tmp copy."""
    for name in ("metrics.json", "record.json"):
        path = folder / key / name
        data = json.loads(path.read_text())
        data["metrics"].pop(metric)
        path.write_text(json.dumps(data))


@pytest.fixture
def fixtures(tmp_path: Path) -> dict[str, Path]:
    """Copies of the two results folders (tests may edit them)."""
    out = {}
    for m in ("h200", "h100"):
        out[m] = tmp_path / f"results-{m}"
        shutil.copytree(FIX / f"results-{m}", out[m])
    return out


# --------------------------------------------------------------------------- names
@pytest.mark.parametrize("hw, name", [
    ({"gpu_count": 1, "gpu_model": "NVIDIA H200", "gpu_memory_gb": 140.4,
      "host_link": "PCIe Gen5 x16", "cpu_arch": "x86_64"}, "h200-141g-pcie5-x86_64"),
    ({"gpu_count": 1, "gpu_model": "NVIDIA GH200 480GB", "gpu_memory_gb": 95.6,
      "host_link": "NVLink-C2C", "cpu_arch": "aarch64"}, "gh200-96g-c2c-aarch64"),
    ({"gpu_count": 1, "gpu_model": "NVIDIA H100 80GB HBM3", "gpu_memory_gb": 79.6,
      "host_link": "PCIe Gen5 x16", "cpu_arch": "x86_64"}, "h100-80g-pcie5-x86_64"),
    ({"gpu_count": 1, "gpu_model": "NVIDIA H100 PCIe", "gpu_memory_gb": 79.6,
      "host_link": "PCIe Gen4 x8", "cpu_arch": "x86_64"}, "h100pcie-80g-pcie4x8-x86_64"),
    ({"gpu_count": 0, "gpu_model": None, "cpu_arch": "x86_64"}, "cpu-x86_64"),
    # a run that saw 4 GPUs is a machine of its own (issue 27: the 4 x H200 collectives were
    # filed under the one-GPU H200's name)
    ({"gpu_count": 4, "gpu_model": "NVIDIA H200", "gpu_memory_gb": 140.4,
      "host_link": "PCIe Gen5 x16", "cpu_arch": "x86_64"}, "4xh200-141g-pcie5-x86_64"),
])
def test_machine_names_from_the_fingerprint(hw, name):
    assert machine_name(hw) == name
    assert machine_name(hw, "my-node") == "my-node"


# --------------------------------------------------------------------------- cost
def test_price_per_unit_of_each_family():
    cost = CostSpec(per_gpu_hour=3.6)  # 0.001 per GPU second
    ft, _ = price({"tokens_per_s": 10_000.0}, 100.0, cost=cost, gpus=2,
                  units=family_info("finetune").work_units)
    assert ft["cost_run"] == pytest.approx(0.2)
    assert ft["cost_per_1m_train_tokens"] == pytest.approx(0.002 / 10_000 * 1e6)
    db, _ = price({"q1_time_ms": 100.0, "q1_bytes_read": 1e9, "q6_time_ms": 300.0,
                   "q6_bytes_read": 3e9}, 10.0, cost=cost, gpus=1,
                  units=family_info("database").work_units)
    assert db["cost_per_1k_queries"] == pytest.approx(0.001 * 0.2 * 1000)  # 0.2 s per query
    assert db["cost_per_tb_scanned"] == pytest.approx(0.001 / 1e10 * 1e12)  # 10 GB/s
    rec, _ = price({"qps": 100.0}, 1.0, cost=cost, gpus=1, params={"top_n": 10},
                   units=family_info("recommender").work_units)
    assert rec["cost_per_1m_recommendations"] == pytest.approx(0.001 / 1000 * 1e6)
    inf, _ = price({"ttft_ms_p50": 50.0}, 1.0, cost=cost, gpus=1,
                   units=family_info("inference").work_units)
    assert "cost_per_1m_generated_tokens" not in inf  # no throughput: no figure, never a zero
    assert inf["cost_per_1k_first_tokens"] == pytest.approx(0.001 * 0.05 * 1000)


def test_no_gpu_on_a_gpu_hour_price_is_a_note_not_a_zero():
    figures, note = price({"tokens_per_s": 1.0}, 10.0, cost=CostSpec(per_gpu_hour=2.49), gpus=0)
    assert figures == {} and "no gpu" in note


def test_cost_block_is_validated(tmp_path):
    project = copy_project(tmp_path / "project")
    edit_yaml(project / "configs/sites/local.yaml",
              lambda d: d.update(cost={"per_gpu_hour": 2.49, "per_node_hour": 1.0}))
    with pytest.raises(SpecError) as info:
        load_matrix(project, {"only": "membench/copy"})
    assert "configs/sites/local.yaml" in str(info.value) and "cost" in str(info.value)
    edit_yaml(project / "configs/sites/local.yaml",
              lambda d: d.update(cost={"per_gpu_hour": 2.49, "curency": "USD"}))
    with pytest.raises(SpecError) as info:
        load_matrix(project, {"only": "membench/copy"})
    assert "curency" in str(info.value)


def test_example_sites_carry_the_source_rates():
    rates = {name: yaml.safe_load((REPO / "configs/sites" / f"{name}.yaml").read_text())["cost"]
             for name in ("gh200", "gpu-node", "slurm", "local")}
    assert rates["gh200"]["per_gpu_hour"] == 1.49
    assert rates["gpu-node"]["per_gpu_hour"] == 2.49
    assert rates["slurm"]["per_gpu_hour"] == pytest.approx(23.92 / 8, rel=1e-3)
    assert "per_node_hour" in rates["local"]  # smoke runs hold no GPU
    matrix = load_matrix(REPO, {"only": "membench/copy"})
    assert matrix.site.cost is not None


def test_the_record_gets_machine_and_cost():
    spec = SimpleNamespace(
        family="finetune", params={"x": 1}, resources=SimpleNamespace(gpus=1),
        site=SimpleNamespace(machine=None, cost=CostSpec(per_gpu_hour=3.6, currency="EUR")))
    rec = {"metrics": {"tokens_per_s": 1000.0}, "duration_s": 36.0, "tags": {},
           "hardware": {"gpu_count": 1, "gpu_model": "NVIDIA H200", "gpu_memory_gb": 140.4,
                        "host_link": "PCIe Gen5 x16", "cpu_arch": "x86_64"}}
    annotate_record(rec, spec)
    assert rec["machine"] == rec["tags"]["machine"] == H200
    assert rec["metrics"]["cost_run"] == pytest.approx(0.036)
    assert rec["metrics"]["cost_per_1m_train_tokens"] == pytest.approx(1.0)
    assert rec["tags"]["cost.currency"] == "EUR"


# --------------------------------------------------------------------------- references
def _refs(tmp_path: Path, machine: str, body: dict) -> Path:
    folder = tmp_path / "refs"
    folder.mkdir(exist_ok=True)
    (folder / f"{machine}.yaml").write_text(yaml.safe_dump({"machine": machine, **body}))
    return folder


def test_shipped_references_load_and_judge_the_fixtures():
    for path in REFS.glob("*.yaml"):
        references.load_references(path)
    # the fresh runs of the calls that wrote the references (each folder: the runs whose
    # references are its day's) all pass; the H100's one-run folder passes; the H200's of
    # 2026-11-24 predates the references: the check tells its LoRA rows, the torch engine before
    # its fast path (issue 51: 1.25-1.5x slower), and its kv-cache offload, another host
    # (49.09 ms against 43.30), from today's; h2d-pageable, 6.30 GB/s against 3 processes' 6.74
    # (spread 4.7 %, min effect 14 %), is inconclusive (tests/fixtures/machines/README.md)
    old_code = ("baseline", "bf16-compile", "fp8", "recompute-elementwise")
    known = {"h200": {**{f"finetune/lora-llama2-7b/{v}": "regression" for v in old_code},
                      "inference/kv-cache/offload": "regression",
                      "membench/copy/h2d-pageable": "inconclusive"}}
    for m in ("h200", "h100", "h200-fresh", "h200-fresh-2026-12-02"):
        rows = collect_runs(FIX / f"results-{m}")
        if m.startswith("h200-fresh"):
            rows = [r for r in rows if reference_day(REFS / f"{H200}.yaml", r.key)
                    == str(r.started_at)[:10]]
            assert len(rows) >= 4, m
        judged = references.judge_rows(rows, REFS)
        verdicts = {r.key: r.reference_check for r in rows}
        assert verdicts["membench/copy/h2d-pinned" if m != "h200-fresh" else rows[0].key] \
            == "pass", verdicts
        assert {k: v for k, v in verdicts.items() if v != "pass"} == known.get(m, {}), verdicts
        if m not in known:
            assert not references.regressions(judged)


def test_shipped_pinned_references_catch_a_slow_link():
    refs = references.load_references(REFS / f"{H100}.yaml")
    ref = refs.for_run("membench/copy/h2d-pinned")["gbps_at_largest"]
    assert references.judge_value(13.6, ref, "higher") == "regression"  # one lent H100 gave it


def test_a_slow_link_is_a_regression_and_a_fast_one_an_improvement():
    ref = references.Reference(55.0, -0.05, 0.05, "test")
    assert references.judge_value(13.6, ref, "higher") == "regression"
    assert references.judge_value(60.0, ref, "higher") == "improvement"
    assert references.judge_value(54.0, ref, "higher") == "pass"
    assert references.judge_value(60.0, ref, "lower") == "regression"
    assert references.judge_value(40.0, ref, None) == "regression"  # no direction: no guess


@pytest.mark.parametrize("body, words", [
    ({"references": {"membench/copy/h2d-pinned": {"gbps_at_largest": {
        "value": 55.0, "lower": -0.05, "source": "x"}}}}, ["gbps_at_largest", "upper"]),
    ({"references": {"membench/copy/h2d-pinned": {"gbps_at_largest": {
        "value": 55.0, "lower": -0.05, "upper": 0.05, "source": "x", "tolerance": 1}}}},
     ["gbps_at_largest.tolerance", "unknown"]),
    ({"refs": {}}, ["refs", "unknown"]),
])
def test_reference_files_are_strict(tmp_path, body, words):
    folder = _refs(tmp_path, H200, body)
    with pytest.raises(SpecError) as info:
        references.load_references(folder / f"{H200}.yaml")
    msg = str(info.value)
    assert f"{H200}.yaml" in msg and all(w in msg for w in words), msg


def test_check_exit_codes_and_the_named_metric(tmp_path, fixtures, capsys):
    # the fresh runs of the calls that wrote the shipped H200 references (2026-12-02)
    assert main(["--root", str(REPO), "check", str(FIX / "results-h200-fresh-2026-12-02")]) == 0
    moved = _refs(tmp_path, H200, {"references": {"membench/copy/h2d-pinned": {
        "gbps_at_largest": {"value": 70.0, "lower": -0.05, "upper": 0.05, "source": "moved"}},
        "finetune/lora-llama2-7b/*": {"mfu": {"value": 0.4, "lower": -0.1, "upper": 0.1,
                                              "source": "x"}}}})
    capsys.readouterr()
    assert main(["--root", str(REPO), "check", str(fixtures["h200"]),
                 "--references", str(moved)]) == 1
    out = capsys.readouterr().out
    assert "REGRESSION h200-141g-pcie5-x86_64 membench/copy/h2d-pinned gbps_at_largest" in out
    # a referenced metric the run did not record is a regression naming the file
    # (a judged metric: ``mfu`` is a diagnostic, never judged, issue 36)
    _drop_metric(fixtures["h100"], "finetune/lora-llama2-7b/fp8", "tokens_per_s")
    moved100 = _refs(tmp_path, H100, {"references": {"finetune/lora-llama2-7b/fp8": {
        "tokens_per_s": {"value": 20000.0, "lower": -0.1, "upper": 0.1, "source": "x"},
        "mfu": {"value": 0.45, "lower": -0.1, "upper": 0.1, "source": "x"}}}})
    assert main(["--root", str(REPO), "check", str(fixtures["h100"]),
                 "--references", str(moved100)]) == 1
    out = capsys.readouterr().out
    assert "tokens_per_s missing in" in out and "fp8/metrics.json" in out
    assert "mfu" not in out


@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
def test_report_shows_machine_and_check(fixtures):
    csv_path, html_path = build_report(fixtures["h200"], REFS)
    rows = list(csv.DictReader(csv_path.open()))
    row = next(r for r in rows if r["variant"] == "h2d-pinned")
    assert row["machine"] == H200 and row["reference_check"] == "pass"
    assert float(row["cost_run"]) > 0
    text = html_path.read_text()
    assert H200 in text and "reference check" in text and "cost of the run" in text


# --------------------------------------------------------------------------- descriptions
def test_shipped_descriptions_load():
    descs = descriptions.load_descriptions(MACHINES)
    assert {H200, H100, "h100pcie-80g-pcie5-x86_64", "gh200-96g-c2c-aarch64",
            "gh200-144g-c2c-aarch64"} <= set(descs)
    assert descriptions.find_description(MACHINES, "gh200-96gb").name == "gh200-96g-c2c-aarch64"
    for d in descs.values():
        assert d.host_link.pinned.h2d.source


@pytest.mark.parametrize("edit, words", [
    (lambda d: d.pop("hbm_tbps"), ["missing", "hbm_tbps"]),
    (lambda d: d["host_link"]["pinned"].update(h2d_gbps=1), ["host_link.pinned.h2d_gbps",
                                                             "unknown"]),
    (lambda d: d["host_link"]["pinned"]["d2h"].pop("source"), ["host_link.pinned.d2h",
                                                               "source"]),
    (lambda d: d.update(bf16_tflops=989), ["bf16_tflops", "expected"]),
])
def test_description_files_are_strict(tmp_path, edit, words):
    data = yaml.safe_load((MACHINES / f"{H200}.yaml").read_text())
    edit(data)
    path = tmp_path / f"{H200}.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecError) as info:
        descriptions.load_description(path)
    msg = str(info.value)
    assert str(path) in msg and all(w in msg for w in words), msg


# --------------------------------------------------------------------------- folders
def test_bad_folders(tmp_path, fixtures):
    (tmp_path / "empty").mkdir()
    with pytest.raises(SpecError, match="not a results folder"):
        runs.load_folder(tmp_path / "empty")
    with pytest.raises(SpecError, match="no such directory"):
        runs.load_folder(tmp_path / "nowhere")
    twin = tmp_path / "twin"
    shutil.copytree(fixtures["h200"], twin)
    with pytest.raises(SpecError) as info:
        runs.load_folders([fixtures["h200"], twin])
    assert H200 in str(info.value) and str(twin) in str(info.value)


# --------------------------------------------------------------------------- comparison
@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
def test_comparison_csv(tmp_path, fixtures):
    _drop_metric(fixtures["h100"], "recommender/latency/gpu", "qps")
    groups = runs.load_folders([fixtures["h200"], fixtures["h100"]])
    csv_path, html_path = compare.compare(groups, tmp_path / "out",
                                          descriptions=descriptions.load_descriptions(MACHINES))
    rows = list(csv.DictReader(csv_path.open()))

    def cell(key: str, metric: str, machine: str) -> dict:
        fam, exp, var = key.split("/")
        return next(r for r in rows if (r["family"], r["experiment"], r["variant"], r["metric"],
                                        r["machine"]) == (fam, exp, var, metric, machine))

    key = "membench/copy/h2d-pinned"
    h100, h200 = (_metric(fixtures[m], key, "gbps_at_largest") for m in ("h100", "h200"))
    pinned = cell(key, "gbps_at_largest", H100)
    assert float(pinned["ratio_to_reference"]) == pytest.approx(h100 / h200, rel=1e-6)
    # within 2 % is "same": one run per machine cannot tell less (issue 28, item 14)
    assert pinned["better"] == ("same" if abs(h100 / h200 - 1) < compare.SAME_WITHIN else
                                "worse" if h100 < h200 else "better")
    assert pinned["reference_machine"] == H200 and pinned["direction"] == "higher"
    # a metric the H100 did not record (dropped here), and a run it does not have (full-1b ran
    # on the H200 only): visible, never zero
    assert cell("recommender/latency/gpu", "qps", H100)["value"] == "no data"
    missing = cell("finetune/full-1b/bf16-compile", "tokens_per_s", H100)
    assert missing["value"] == "no data" and missing["status"] == "no run"
    # the link floor and the figure over it; the cost per unit and x cheaper
    offload = cell("finetune/lora-llama2-7b/offload-recompute", "step_time_p50_s", H100)
    assert float(offload["over_floor"]) > 1.0
    base = cell("finetune/lora-llama2-7b/baseline", "tokens_per_s", H100)
    assert base["cost_unit"] == "per 1M training tokens"
    h200_unit = float(cell("finetune/lora-llama2-7b/baseline", "tokens_per_s", H200)
                      ["cost_per_unit"])
    assert float(base["cheaper_per_unit_x"]) == pytest.approx(h200_unit / float(
        base["cost_per_unit"]))
    text = html_path.read_text()
    assert "data:image/png;base64," in text and "x cheaper per unit" in text
    assert "PREDICTION" in text and "no data" in text


def test_reference_machine_must_be_compared(tmp_path, fixtures):
    groups = runs.load_folders([fixtures["h200"], fixtures["h100"]])
    with pytest.raises(SpecError, match="--reference"):
        compare.compare(groups, tmp_path, reference="gh200-96g-c2c-aarch64")


# --------------------------------------------------------------------------- predictions
def _predictions(source: str, target: str) -> dict[tuple[str, str], predict.Prediction]:
    descs = descriptions.load_descriptions(MACHINES)
    groups = {g.machine: g for g in runs.load_folders([FIX / "results-h200", FIX / "results-h100"])}
    out = predict.predict(groups[source], descs[source], descs[target], groups.get(target))
    return {(p.key, p.metric): p for p in out}


LINK_BOUND = [("finetune/lora-llama2-7b/offload-recompute", "tokens_per_s"),
              ("inference/kv-cache/offload", "ttft_ms_p50"),
              ("inference/weight-streaming/stream", "decode_tokens_per_s")] + \
    [("database/tpch/host-pinned", f"q{q}_time_ms") for q in (1, 3, 5, 6, 12, 14)]


@pytest.mark.parametrize("source, target", [(H100, H200), (H200, H100)])
def test_link_bound_predictions_are_within_ten_percent_both_ways(source, target):
    """Issue 18's bound, on the real runs: each error is recomputed here from the target's own
    metrics.json. (Both lent hosts have the same PCIe Gen5 x16 link, 54-55 GB/s: this checks
    the model where the link barely changes; the GH200's C2C is where it matters.)"""
    preds = _predictions(source, target)
    folder = FIX / ("results-h200" if target == H200 else "results-h100")
    for key, metric in LINK_BOUND:
        p = preds[(key, metric)]
        assert p.unpredictable is None, (key, p.unpredictable)
        assert p.label == "prediction" and p.formula and p.inputs
        measured = _metric(folder, key, metric)
        assert p.measured == pytest.approx(measured)
        error = (p.predicted - measured) / measured
        assert p.error == pytest.approx(error)
        assert abs(error) < 0.10, (source, key, metric, error)


@pytest.mark.parametrize("source, target", [(H100, H200), (H200, H100)])
def test_compute_bound_predictions_report_their_error(source, target):
    """An error for every run both machines measured, and the copy model reproduces the
    target's description (the 10 % bound and its exceptions: test_prediction_error.py)."""
    preds = _predictions(source, target)
    for key, metric in (("finetune/lora-llama2-7b/baseline", "tokens_per_s"),
                        ("finetune/lora-llama2-7b/fp8", "tokens_per_s"),
                        ("inference/weight-streaming/resident", "decode_tokens_per_s"),
                        ("recommender/latency/cpu-only", "lat_e2e_p50_ms"),
                        ("database/tpch/device", "q1_time_ms")):
        p = preds[(key, metric)]
        assert p.unpredictable is None and p.error is not None and math.isfinite(p.error), key
    # the copy model *is* the target's description, which holds these very runs' figures:
    # its zero error is by construction, not evidence
    copy = preds[("membench/copy/h2d-pinned", "gbps_at_largest")]
    assert copy.model == "copy" and abs(copy.error) < 0.01


def test_prediction_states_formula_and_inputs_and_refuses_what_it_cannot():
    preds = _predictions(H100, H200)
    offload = preds[("finetune/lora-llama2-7b/offload-recompute", "tokens_per_s")]
    assert offload.model == "overlap" and "max(C*k, L_T)" in offload.formula
    # the subset has no offload_staging: device diagnostic: the run without offload of the
    # same params stands for the step with the link taken out
    assert offload.inputs["sibling (the step without offload)"] == \
        "finetune/lora-llama2-7b/recompute-elementwise"
    assert any("host_link.pinned.h2d" in v for v in offload.inputs.values())
    assert "save_on_cpu" in preds[("finetune/lora-llama2-7b/save-on-cpu-recompute",
                                   "tokens_per_s")].unpredictable


def test_gh200_prediction_is_labelled_and_cites_its_inputs():
    preds = _predictions(H200, "gh200-96g-c2c-aarch64")
    p = preds[("finetune/lora-llama2-7b/offload-recompute", "tokens_per_s")]
    assert p.measured is None and p.predicted > p.source_value  # C2C takes the link out
    assert any("arXiv 2407.07850" in v for v in p.inputs.values())
    zero_copy_free = preds[("membench/copy/h2d-pageable", "gbps_at_largest")]
    assert zero_copy_free.unpredictable and "pageable" in zero_copy_free.unpredictable


def test_predict_cli(capsys):
    assert main(["--root", str(REPO), "predict", str(FIX / "results-h100"), "--machine", "h200",
                 "--measured", str(FIX / "results-h200")]) == 0
    out = capsys.readouterr().out
    assert "[PREDICTION from h100-80g-pcie5-x86_64]" in out and "error" in out
    assert "not predicted: save_on_cpu" in out
    assert main(["--root", str(REPO), "predict", str(FIX / "results-h100"), "--machine",
                 "no-such-machine"]) == 2


@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
def test_machines_from_an_mlflow_server_that_is_down_says_so_in_one_line(tmp_path):
    """Issue 28 item 8: `hopperlab machines --mlflow URI` with the server down blocked for
    minutes, then printed a traceback holding the URI's password."""
    from tests.helpers import REPO, hopperlab
    from tests.infra.mlflow_fixture import free_port

    uri = f"http://alice:s3cret-pw@127.0.0.1:{free_port()}"
    out = hopperlab(["--root", str(REPO), "machines", "--mlflow", uri], tmp_path, timeout=240)
    text = out.stdout + out.stderr
    assert out.returncode == 2, text[-3000:]
    assert "Traceback" not in text and "s3cret-pw" not in text, text[-3000:]
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "MLflow unreachable" in lines[0], text[-3000:]


# -- issue 28 item 10: records, names and figures that must never be trusted blindly -------------
def _a_results_folder_with_odd_records(tmp_path):
    import json as _json

    results = tmp_path / "results"
    good = results / "selftest/faults/ok"
    good.mkdir(parents=True)
    (good / "record.json").write_text(_json.dumps({
        "family": "selftest", "experiment": "faults", "variant": "ok", "attempt": 1,
        "status": "ok", "metrics": {"value": 3.0}, "machine": "h200-141g-pcie5-x86_64"}))
    for variant, text in (("as-list", "[1, 2]"), ("as-null", "null"), ("as-number", "7")):
        (results / "selftest/faults" / variant).mkdir(parents=True)
        (results / "selftest/faults" / variant / "record.json").write_text(text)
    return results


@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
@pytest.mark.parametrize("verb", ["report", "check", "machines"])
def test_a_record_that_is_json_but_not_an_object_is_shown_not_crashed_on(tmp_path, verb):
    """Valid JSON that is not an object crashed `report`, `check` and `machines`; `null` made
    the run vanish from the summary."""
    from tests.helpers import REPO, copy_project, hopperlab

    if verb == "report":
        project = copy_project(tmp_path / "project")
        _a_results_folder_with_odd_records(project)
        out = hopperlab(["report", "--config", "families=selftest"], project)
        text = out.stdout + out.stderr
        assert out.returncode == 0 and "Traceback" not in text, text[-3000:]
        summary = (project / "results/summary.csv").read_text()
        for variant in ("as-list", "as-null", "as-number"):
            row = next(ln for ln in summary.splitlines() if f",{variant}," in ln)
            assert ",failed," in row and "must be a JSON object" in row, row
        return
    results = _a_results_folder_with_odd_records(tmp_path)
    args = ["check", str(results)] if verb == "check" else ["machines", str(results)]
    out = hopperlab(["--root", str(REPO), *args], tmp_path)
    text = out.stdout + out.stderr
    assert "Traceback" not in text, text[-3000:]
    assert out.returncode in (0, 1), text[-3000:]


def test_a_records_machine_name_never_reads_references_outside_their_folder(tmp_path):
    """A record's `machine` of `../x` made `check` load references from anywhere on disk."""
    from hopperlab.results.machines.references import references_for

    refs = tmp_path / "configs/references"
    refs.mkdir(parents=True)
    outside = tmp_path / "evil.yaml"
    outside.write_text("machine: evil\nreferences: {}\n")
    assert references_for(refs, "../../evil") is None
    assert references_for(refs, str(outside.with_suffix(""))) is None


@pytest.mark.parametrize("value", [".nan", "-3", "0", ".inf"])
def test_a_machine_figure_must_be_a_finite_positive_number(tmp_path, value):
    from hopperlab.core.errors import SpecError
    from hopperlab.results.machines.descriptions import load_description
    from tests.helpers import REPO

    name = "h200-141g-pcie5-x86_64"
    text = (REPO / f"configs/machines/{name}.yaml").read_text()
    bad = text.replace("hbm_tbps: {value: 4.8,", f"hbm_tbps: {{value: {value},")
    assert bad != text
    path = tmp_path / f"{name}.yaml"
    path.write_text(bad)
    with pytest.raises(SpecError, match="hbm_tbps"):
        load_description(path)


@pytest.mark.parametrize("bound", ["lower: .nan", "upper: .inf", "lower: -.inf"])
def test_a_reference_tolerance_must_be_finite(tmp_path, bound):
    from hopperlab.core.errors import SpecError
    from hopperlab.results.machines.references import load_references

    other = "upper: 0.1" if bound.startswith("lower") else "lower: -0.1"
    path = tmp_path / "m1.yaml"
    path.write_text("machine: m1\nreferences:\n  selftest/faults/ok:\n"
                    f"    value: {{value: 3.0, {bound}, {other}, source: a test}}\n")
    with pytest.raises(SpecError, match="not a finite fraction"):
        load_references(path)


FIX_TP = FIX / "results-4xh200"  # the TP rows through the workflow, 4 x H200, 2026-11-26


def test_tensor_parallel_rows_are_predicted_on_gh200_from_their_decode_and_prefill():
    group = runs.load_folders([FIX_TP])[0]
    src = descriptions.find_description(REPO / "configs/machines", "h200-141g-pcie5-x86_64")
    tgt = descriptions.find_description(REPO / "configs/machines", "gh200-96gb")
    preds = {(p.variant, p.metric): p for p in predict.predict(group, src, tgt)
             if p.experiment == "tp-long-context"}
    key = "inference/tp-long-context/prompt-31k-c1"
    m = json.loads((FIX_TP / key / "metrics.json").read_text())["metrics"]
    k_hbm = 4.8 / 4.0  # H200 SXM / GH200 96 GB HBM, the descriptions' datasheet figures
    dec = (m["decode_ms_per_token"] - m["allreduce_cost_ms_per_token"]) * k_hbm \
        + m["allreduce_cost_ms_per_token"]
    lat = preds[("prompt-31k-c1", "request_latency_ms_p50")]
    assert lat.label == "prediction" and lat.unpredictable is None
    assert lat.predicted == pytest.approx(m["ttft_ms_p50"] * 1.0 + 99 * dec)
    assert "allreduce_cost_ms_per_token" in " ".join(lat.inputs)
    assert preds[("prompt-3k-c8", "decode_tokens_per_s")].predicted < \
        json.loads((FIX_TP / "inference/tp-long-context/prompt-3k-c8/metrics.json")
                   .read_text())["metrics"]["decode_tokens_per_s"]  # slower HBM, fewer tokens/s
    # the one-GPU rows held what fit an H200: refused with the reason, not guessed
    one = preds[("prompt-31k-c1-1gpu", "request_latency_ms_p50")]
    assert one.predicted is None and "70 of the 80 layers" in one.unpredictable


@pytest.fixture(scope="module")
def sharded_run(tmp_path_factory) -> Path:
    """A real sharded run (FSDP2 + CPU offload, the smoke shape, gloo on the CPU)."""
    from tests.helpers import hopperlab

    project = copy_project(tmp_path_factory.mktemp("sharded") / "project")
    out = hopperlab(["run", "finetune/full-llama2-13b-sharded/fsdp2-offload-1gpu", "--no-upload",
                     "--config", "families=finetune"], project)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    return project / "results"


@pytest.mark.integration
def test_a_sharded_run_records_its_cpu_optimizer_floor_from_the_host_rate_it_measured(sharded_run):
    from hopperlab.workloads.finetune.sharded.step_floor import ADAMW_TRAFFIC

    m = json.loads((sharded_run / "finetune/full-llama2-13b-sharded/fsdp2-offload-1gpu"
                    / "metrics.json").read_text())["metrics"]
    assert m["host_triad_gbps"] > 0
    share_gb = m["params_b"] * 4  # float32 at smoke scale, one rank holds every parameter
    assert m["optimizer_host_gb_per_step"] == pytest.approx(ADAMW_TRAFFIC * share_gb)
    assert m["optimizer_floor_s"] == pytest.approx(m["optimizer_host_gb_per_step"]
                                                   / m["host_triad_gbps"])
    assert m["optimizer_over_floor"] == pytest.approx(m["optimizer_step_s"] / m["optimizer_floor_s"])


@pytest.mark.integration
def test_a_sharded_step_is_predicted_on_gh200_from_its_floors_parts(sharded_run):
    """Issue 27 item 3: the GH200 prediction of a sharded row has a CPU optimizer term (host
    memory rate measured by the job against Grace's) and the C2C link term."""
    group = runs.load_folders([sharded_run])[0]
    src = descriptions.find_description(MACHINES, "h200-141g-pcie5-x86_64")
    tgt = descriptions.find_description(MACHINES, "gh200-144g-c2c-aarch64")
    (p,) = [p for p in predict.predict(group, src, tgt)
            if p.variant == "fsdp2-offload-1gpu" and p.metric == "tokens_per_s"]
    assert p.unpredictable is None and p.label == "prediction"
    m = json.loads((sharded_run / "finetune/full-llama2-13b-sharded/fsdp2-offload-1gpu"
                    / "metrics.json").read_text())["metrics"]
    k = 989 / 989  # bf16 peak: H200 SXM and GH200's Hopper alike
    link = max(m["h2d_gb_per_step"] / 375, m["d2h_gb_per_step"] / 297)  # C2C, the description's
    step = max(m["floor_compute_s"] * k, link) + m["floor_optimizer_s"] * m["host_triad_gbps"] / 486 \
        + (m["step_time_p50_s"] - m["step_floor_s"])
    assert p.predicted == pytest.approx(m["tokens_per_s"] * m["step_time_p50_s"] / step)
    text = " ".join(p.inputs)
    assert "host_triad_gbps" in text and "host_memory_gbps" in text and "O' = O * m_S/m_T" in p.formula


def test_the_host_triad_and_the_optimizer_floor_refuse_what_they_cannot_use():
    from hopperlab.node.host_bandwidth import triad_gbps
    from hopperlab.workloads.finetune.sharded.step_floor import optimizer_floor

    assert triad_gbps(mib_per_array=4, repeats=2) > 0
    with pytest.raises(ValueError, match="positive size"):
        triad_gbps(mib_per_array=0)
    assert optimizer_floor("fsdp2", 10**9, 2, 2, 100.0) == {}  # the optimizer runs on the GPUs
    assert optimizer_floor("fsdp2-cpu-offload", 10**9, 2, 2, None) == {}  # no rate, no floor
    two = optimizer_floor("fsdp2-cpu-offload", 10**9, 2, 2, 100.0)
    assert two["optimizer_host_gb_per_step"] == pytest.approx(7 * 1.0)  # half of 2 GB a rank
    assert optimizer_floor("torchao-cpu-offload", 10**9, 2, 2, 100.0)[
        "optimizer_host_gb_per_step"] == pytest.approx(14.0)  # torchao: one GPU, whole model


def test_a_machine_of_several_gpus_takes_the_per_gpu_figures_and_not_the_host_ones():
    four = descriptions.find_description(MACHINES, "4xh200-141g-pcie5-x86_64")
    one = descriptions.find_description(MACHINES, H200)
    assert four.name == "4xh200-141g-pcie5-x86_64"
    assert four.hbm_tbps == one.hbm_tbps and four.host_link == one.host_link
    assert four.cpu_cores.value is None and "write 4xh200-141g-pcie5-x86_64.yaml" in \
        four.cpu_cores.source
    with pytest.raises(SpecError, match="no description"):
        descriptions.find_description(MACHINES, "4xb300-288g-pcie6-x86_64")
