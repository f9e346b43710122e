"""The recommender pipeline on smoke data (CPU): real models, same answers through every path.

* The same queries give the same ranked lists through the CPU-only pipeline (pandas features,
  resident embeddings) and the GPU-capable code path (numpy gathers on worker threads, item
  embeddings streamed in chunks, and on a CUDA machine the GPU itself).
* The trained retriever beats the popularity baseline at recall@k, the ranker at AUC.
* ``run(spec, recorder)`` records the per-component metrics the report charts.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from hopperlab.assets.recsys import RecsysSpec, generate, write
from hopperlab.config.matrix import load_matrix
from hopperlab.core.rundir import Recorder, SkipRun, read_steps
from hopperlab.workloads import family_info
from hopperlab.workloads.base import Contradiction, Knobs, fake_run
from hopperlab.workloads.recommender import (
    COMPONENTS,
    FAMILY,
    HEADLINE_METRICS,
    RecommenderParams,
    check,
    workload,
)
from hopperlab.workloads.recommender.data import load
from hopperlab.workloads.recommender.pipeline import Pipeline, PipelineConfig, summarize
from hopperlab.workloads.recommender.training import auc, train_and_evaluate

ROOT = Path(__file__).resolve().parents[3]
#: the smoke scale of experiments/recommender.yaml (kept in step by test_smoke_params_match)
SMOKE = dict(candidates=100, top_n=10, queries=30, warmup=3, embedding_dim=8, tower_dim=32,
             hidden_dim=64, retrieval_steps=50, ranking_steps=50, batch_size=256,
             learning_rate=0.01, recall_k=20, eval_users=500, host_chunks=4)
#: recsys-smoke of configs/assets.d/recommender.yaml
SMOKE_DATA = dict(users=2210, items=8500, interactions=40_000, topics=20, max_cardinality=2000,
                  seed=0)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("recsys-smoke")
    write(generate(RecsysSpec(name="recsys-smoke", kind="recsys", **SMOKE_DATA)), folder)
    (folder / "MANIFEST.sha256").write_text("")  # what spec.asset_path checks for
    return folder


@pytest.fixture(scope="module")
def trained(data_dir):
    data = load(data_dir)
    torch.set_num_threads(1)
    return data, train_and_evaluate(data, RecommenderParams(**SMOKE), torch.device("cpu"))


def _lists(data, model, cfg, users):
    pipe = Pipeline(data, model.two_tower, model.dlrm, cfg)
    try:
        return [pipe.query(int(u)).items for u in users]
    finally:
        pipe.close()


@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
def test_same_ranked_list_cpu_only_and_gpu_capable_paths(trained):
    data, model = trained
    users = np.random.default_rng(7).integers(0, data.users, 25)
    cpu_only = _lists(data, model, PipelineConfig(candidates=100, augment="pandas"), users)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    variants = [PipelineConfig(device=device, candidates=100, workers=2),
                PipelineConfig(device=device, candidates=100, item_embeddings="host",
                               host_chunks=3, workers=3)]
    if device == "cuda":
        variants.append(PipelineConfig(device="cuda", candidates=100, managed=True))
    for cfg in variants:
        got = _lists(data, model, cfg, users)
        assert all(len(g) == 10 for g in got)
        same = [np.array_equal(a, b) for a, b in zip(got, cpu_only)]
        assert all(same), (cfg, same)
    # and the list depends on the user: not one answer for everyone
    assert len({tuple(x) for x in cpu_only}) > 5


def test_recall_and_auc_beat_popularity(trained):
    m = trained[1].metrics
    assert m["recall_at_k"] > m["recall_at_k_popularity"] + 0.03, m
    assert m["rank_auc"] > m["rank_auc_popularity"] + 0.03, m
    assert m["rank_auc"] > 0.65 and m["recall_eval_pairs"] > 100


def test_auc_known_values():
    labels = np.array([0, 0, 1, 1], dtype=np.float32)
    assert auc(np.array([0.1, 0.2, 0.3, 0.4]), labels) == 1.0
    assert auc(np.array([0.4, 0.3, 0.2, 0.1]), labels) == 0.0
    assert auc(np.ones(4), labels) == 0.5
    assert auc(np.array([0.1, 0.5, 0.5, 0.9]), labels) == 0.875


def test_summarize_shares_and_names():
    from hopperlab.workloads.recommender.pipeline import QueryResult

    res = [QueryResult(np.arange(3), {"retrieval": 0.001 * i, "features": 0.002, "transfer": 0.0,
                                      "ranking": 0.003, "topn": 0.0005,
                                      "e2e": 0.0055 + 0.001 * i}) for i in range(1, 11)]
    s = summarize(res)
    assert sum(s[f"share_{c}"] for c in COMPONENTS) == pytest.approx(1.0)
    assert s["lat_ranking_p50_ms"] == pytest.approx(3.0)
    assert s["lat_retrieval_p99_ms"] > s["lat_retrieval_p50_ms"]
    assert s["qps"] == pytest.approx(10 / sum(r.seconds["e2e"] for r in res))


def _spec(data_dir, memory="device", num_workers=0, cpus=1, **params):
    return fake_run(RecommenderParams(**{**SMOKE, **params}), cpus=cpus,
                    assets={"data": data_dir}, memory=memory, num_workers=num_workers)


@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
@pytest.mark.parametrize("params,knobs", [({"pipeline": "cpu"}, {}),
                                          ({"pipeline": "gpu", "item_embeddings": "host"},
                                           {"num_workers": 4})])
def test_run_records_per_component_metrics(tmp_path, data_dir, params, knobs):
    rec = Recorder(tmp_path / "run")
    workload.run(_spec(data_dir, **knobs, **params), rec)
    record = rec.finish("ok")
    m = record["metrics"]
    for c in (*COMPONENTS, "e2e"):
        assert m[f"lat_{c}_p50_ms"] >= 0 and m[f"lat_{c}_p99_ms"] >= m[f"lat_{c}_p50_ms"]
    assert sum(m[f"share_{c}"] for c in COMPONENTS) == pytest.approx(1.0, abs=0.05)
    assert m["qps"] > 0 and m["recall_at_k"] > m["recall_at_k_popularity"]
    assert set(HEADLINE_METRICS) <= set(m)
    steps = read_steps(tmp_path / "run")
    assert len(steps) == SMOKE["queries"] and "ranking_ms" in steps[0]["metrics"]
    assert record["tags"]["recommender.gpu_measured"] == "false"
    assert record["tags"]["recommender.feature_workers"] == str(knobs.get("num_workers", 0))
    assert (tmp_path / "run" / "artifacts" / "training_loss.csv").exists()


def test_contradictions_are_refused_and_managed_skips_without_gpu(tmp_path, data_dir):
    with pytest.raises(Contradiction, match="contradicts"):
        check(Knobs(num_workers=4), RecommenderParams(workers_all_cores=True))
    with pytest.raises(Contradiction, match="no GPU component"):
        check(Knobs(memory="managed"), RecommenderParams(pipeline="cpu"))
    check(Knobs(memory="managed"), RecommenderParams())
    with pytest.raises(SkipRun, match="CUDA"):
        workload.run(_spec(data_dir, memory="managed"), Recorder(tmp_path / "c"))
    assert workload.feature_workers(RecommenderParams(workers_all_cores=True), 0, 7) == 7


def test_params_validation():
    with pytest.raises(ValueError, match="augment"):
        RecommenderParams(augment="polars")
    with pytest.raises(ValueError, match="top_n"):
        RecommenderParams(candidates=5, top_n=10)
    with pytest.raises(ValueError, match="pipeline: cpu"):
        RecommenderParams(pipeline="cpu", item_embeddings="host")


def test_family_and_matrix():
    assert family_info("recommender") is FAMILY
    assert FAMILY.load_entry() is workload.run
    matrix = load_matrix(ROOT, {"families": "recommender", "scale": "smoke"})
    runs = [s for s in matrix.runs.values() if s.family == "recommender"]
    assert 6 <= len(runs) <= 8
    assert {s.assets["data"] for s in runs} == {"recsys-smoke"}
    by_variant = {s.variant: s for s in runs}
    assert by_variant["gpu-managed"].knobs.memory == "managed"
    assert by_variant["gpu-workers4"].knobs.num_workers == 4
    assert by_variant["cpu-only"].params.pipeline == "cpu"
    full = load_matrix(ROOT, {"families": "recommender", "scale": "full"})
    assert {s.assets["data"] for s in full.runs.values()} == {"recsys-full"}


def test_smoke_params_match():
    matrix = load_matrix(ROOT, {"families": "recommender", "scale": "smoke"})
    p = matrix.runs["recommender/latency/cpu-only"].params
    assert {k: getattr(p, k) for k in SMOKE} == SMOKE
    assert dataclasses.replace(p, pipeline="gpu").pipeline == "gpu"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("memory,profiler", [("device", "torch"), ("managed", "none")])
def test_run_on_gpu(tmp_path, data_dir, memory, profiler):
    s = _spec(data_dir, memory=memory)
    s.resources.gpus = 1
    s.knobs.profiler = profiler
    rec = Recorder(tmp_path / "run")
    workload.run(s, rec)
    record = rec.finish("ok")
    assert record["tags"]["recommender.device"] == "cuda"
    assert record["tags"]["recommender.gpu_measured"] == "true"
    assert record["tags"]["recommender.cuda_graphs"] == "true"
    assert record["metrics"]["check_same_topn"] == 1.0
    if profiler == "torch":
        trace = tmp_path / "run" / "artifacts" / "profile" / "torch_trace.json"
        assert "pipeline.ranking" in trace.read_text()


@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
def test_repeats_are_windows_of_queries_after_one_training(tmp_path, data_dir):
    """repeats: 3 trains once and measures 3 windows of ``queries`` each (issue 29)."""
    from hopperlab.run import repeats
    from hopperlab.workloads.recommender import FAMILY

    s = _spec(data_dir, pipeline="cpu")
    s.repeats, s.headline_metrics = 3, FAMILY.headline_metrics
    rec = Recorder(tmp_path / "run")
    repeats.measure(workload.run, s, rec, FAMILY)
    assert len(rec.samples) == 3 and rec.tags["repeat_unit"] == "windows"
    m = rec.metrics
    assert m["lat_e2e_p50_ms_n"] == 3
    assert m["lat_e2e_p50_ms_ci_low"] <= m["lat_e2e_p50_ms"] <= m["lat_e2e_p50_ms_ci_high"]
    assert len(read_steps(tmp_path / "run")) == 3 * SMOKE["queries"]
