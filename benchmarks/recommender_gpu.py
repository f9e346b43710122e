"""The recommender latency pipeline at full scale on one GPU node: every variant, one process.

Generates the ``recsys-full`` tables (the asset's own generator, same definition as
configs/assets.d/recommender.yaml), trains the two models once on the GPU, evaluates them
(recall@k vs popularity, AUC), then times each variant of experiments/recommender.yaml on the
same trained models: N random queries after a warm-up, per-component p50/p99 and shares.
Also checks that GPU and CPU pipelines give the same ranked lists, and prints a PREDICTION for
Grace Hopper from the measured transfer and feature figures (not a measurement).

    PYTHONPATH=src python3 benchmarks/recommender_gpu.py --out $OUT

Writes ``results.json`` (every figure) and ``table.txt`` under --out; prints the table last.
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hopperlab.assets import recsys
from hopperlab.workloads.recommender import COMPONENTS, RecommenderParams
from hopperlab.workloads.recommender import data as data_mod
from hopperlab.workloads.recommender.features import pack
from hopperlab.workloads.recommender.pipeline import Pipeline, summarize
from hopperlab.workloads.recommender.retrieval import item_embeddings
from hopperlab.workloads.recommender.training import train_and_evaluate
from hopperlab.workloads.recommender.workload import node_cores, pipeline_config, query_users

#: recsys-full of configs/assets.d/recommender.yaml
FULL = dict(users=221_000, items=850_000, interactions=4_000_000, topics=200,
            max_cardinality=200_000, seed=0)
#: experiments/recommender.yaml, scale full
PARAMS = dict(candidates=1000, top_n=10, queries=1000, warmup=50, embedding_dim=16, tower_dim=64,
              hidden_dim=256, retrieval_steps=400, ranking_steps=400, batch_size=4096,
              learning_rate=0.01, recall_k=100, eval_users=2000, host_chunks=8)
#: name -> (params, knobs) as in experiments/recommender.yaml; "all" = the node's cores
VARIANTS: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("cpu-only", {"pipeline": "cpu"}, {}),
    ("gpu", {}, {}),
    ("gpu-pandas", {"augment": "pandas"}, {}),
    ("gpu-workers4", {}, {"num_workers": 4}),
    ("gpu-workers-all", {"workers_all_cores": True}, {}),
    ("gpu-pageable", {"transfer": "pageable"}, {}),
    ("gpu-managed", {}, {"memory": "managed"}),
    ("gpu-host-embeddings", {"item_embeddings": "host"}, {}),
    ("gpu-nographs", {"cuda_graphs": False}, {}),  # extra: what the CUDA graphs buy
]
#: variants whose queries are slow (CPU work of tens of ms): fewer timed queries
SLOW = {"cpu-only", "gpu-pandas"}
#: ASSUMPTIONS of the Grace Hopper prediction (not measured here): NVLink-C2C host->device
#: bandwidth per direction (GB/s), and how much faster Grace runs the feature gathers
C2C_GBPS = 450.0
GRACE_FEATURE_SPEEDUPS = (1.0, 1.5)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--data", type=Path, default=None, help="a built recsys-full folder")
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--slow-queries", type=int, default=200)
    ap.add_argument("--only", default="", help="comma-separated variant names")
    ap.add_argument("--budget-s", type=float, default=300.0,
                    help="start no further variant after this many seconds")
    args = ap.parse_args(argv)
    started = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    assert torch.cuda.is_available(), "this benchmark needs a CUDA device"
    cores = node_cores()
    torch.set_num_threads(cores)
    machine = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
               "cuda": torch.version.cuda, "cpu_arch": platform.machine(), "cores": cores,
               "python": platform.python_version(), "driver": _driver()}
    print("machine:", json.dumps(machine), flush=True)
    results: dict[str, Any] = {"machine": machine, "variants": {}}

    t0 = time.perf_counter()
    folder = args.data
    if folder is None:
        folder = Path(tempfile.mkdtemp(prefix="recsys-full-"))
        spec = recsys.RecsysSpec(name="recsys-full", kind="recsys", **FULL)
        recsys.write(recsys.generate(spec), folder)
    results["generate_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    data = data_mod.load(folder)
    results["load_s"] = time.perf_counter() - t0
    print(f"data: {data.users} users, {data.items} items, {len(data.train)} train / "
          f"{len(data.test)} test interactions; generated in {results['generate_s']:.1f} s, "
          f"loaded in {results['load_s']:.1f} s", flush=True)

    base = RecommenderParams(**PARAMS)
    t0 = time.perf_counter()
    trained = train_and_evaluate(data, base, torch.device("cuda"))
    torch.cuda.synchronize()
    results["train_s"] = time.perf_counter() - t0
    results["quality"] = trained.metrics
    print(f"trained in {results['train_s']:.1f} s: " + ", ".join(
        f"{k}={v:.4f}" for k, v in trained.metrics.items()), flush=True)
    packed = pack(data)
    with torch.no_grad():
        emb = item_embeddings(trained.two_tower, torch.from_numpy(data.item_cont).cuda(),
                              torch.from_numpy(data.item_cat).cuda())
    cpu_models = (copy.deepcopy(trained.two_tower).cpu(), copy.deepcopy(trained.dlrm).cpu())

    only = {v for v in args.only.split(",") if v}
    lists: dict[str, np.ndarray] = {}
    for name, params, knobs in VARIANTS:
        if only and name not in only:
            continue
        if time.monotonic() - started > args.budget_s:
            print(f"[budget] {name}: not run", flush=True)
            continue
        p = RecommenderParams(**{**PARAMS, **params})
        n = args.slow_queries if name in SLOW else args.queries
        workers = cores if p.workers_all_cores else int(knobs.get("num_workers", 0))
        device = "cpu" if p.pipeline == "cpu" else "cuda"
        cfg = pipeline_config(p, device=device, workers=workers,
                              managed=knobs.get("memory") == "managed",
                              allow_oversubscription=False)
        tower, dlrm = cpu_models if device == "cpu" else (trained.two_tower, trained.dlrm)
        t0 = time.perf_counter()
        try:
            pipe = Pipeline(data, tower, dlrm, cfg, packed=packed,
                            item_emb=emb.cpu() if device == "cpu" else emb)
            setup = time.perf_counter() - t0
            users = query_users(data.users, p.warmup + max(args.queries, args.slow_queries),
                                p.seed)[:p.warmup + n]  # every variant: the same first queries
            for u in users[:p.warmup]:
                pipe.query(int(u))
            res = [pipe.query(int(u)) for u in users[p.warmup:]]
            lists[name] = np.stack([r.items for r in res[:20]])
            notes = dict(pipe.notes, graphs=pipe.graphs, pinned=bool(pipe.staging.is_pinned()),
                         workers=workers)
            pipe.close()
        except Exception as exc:  # noqa: BLE001 - report, go on with the next variant
            traceback.print_exc()
            results["variants"][name] = {"status": "failed", "reason": f"{type(exc).__name__}: {exc}"}
            continue
        summary = summarize(res)
        results["variants"][name] = {"status": "ok", "setup_s": setup, "notes": notes, **summary}
        print(f"[{time.monotonic() - started:6.1f}s] {name}: e2e p50 "
              f"{summary['lat_e2e_p50_ms']:.3f} ms, " + ", ".join(
                  f"{c} {summary[f'lat_{c}_p50_ms']:.3f}" for c in COMPONENTS) + f" {notes}",
              flush=True)
        _save(args.out, results)

    if "cpu-only" in lists:  # the same queries (first 20) through each path: same ranked lists?
        ref = lists["cpu-only"]
        results["same_topn_as_cpu"] = {k: float(np.mean([np.array_equal(a, b) for a, b in
                                                         zip(v, ref)])) for k, v in lists.items()}
        results["topn_overlap_with_cpu"] = {k: float(np.mean([len(np.intersect1d(a, b)) / len(b)
                                                              for a, b in zip(v, ref)]))
                                            for k, v in lists.items()}
    results["prediction_gh200"] = predict(results, data, packed.layout.words * 4 * base.candidates)
    text = table(results)
    (args.out / "table.txt").write_text(text + "\n")
    _save(args.out, results)
    print()
    print(text, flush=True)
    return 0


def _driver() -> str | None:
    import subprocess  # noqa: PLC0415

    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        return out.stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        return None


def _save(out: Path, results: dict[str, Any]) -> None:
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str) + "\n")


def predict(results: dict[str, Any], data: Any, batch_bytes: int) -> dict[str, Any]:
    """PREDICTION (not a measurement) of the ``gpu`` variant on Grace Hopper: the GPU components
    as measured (same Hopper GPU), the batch transfer at C2C_GBPS (bandwidth only: optimistic,
    a copy's fixed latency is left out), the feature gathers GRACE_FEATURE_SPEEDUPS times faster
    (an assumption: Grace's memory system against this node's x86 CPU)."""
    v = results["variants"].get("gpu")
    if not v or v.get("status") != "ok":
        return {}
    mean = {c: v[f"lat_{c}_mean_ms"] for c in COMPONENTS}
    measured = sum(mean.values())
    transfer_gbps = batch_bytes / (mean["transfer"] / 1e3) / 1e9
    c2c_transfer = batch_bytes / (C2C_GBPS * 1e9) * 1e3
    out: dict[str, Any] = {"assumptions": {"c2c_gbps": C2C_GBPS,
                                           "grace_feature_speedups": GRACE_FEATURE_SPEEDUPS},
                           "batch_bytes": batch_bytes, "measured_e2e_mean_ms": measured,
                           "measured_transfer_effective_gbps": transfer_gbps, "cases": []}
    for speedup in GRACE_FEATURE_SPEEDUPS:
        pred = dict(mean, transfer=min(mean["transfer"], c2c_transfer),
                    features=mean["features"] / speedup)
        total = sum(pred.values())
        out["cases"].append({"grace_feature_speedup": speedup, "predicted_e2e_mean_ms": total,
                             "predicted_speedup": measured / total})
    return out


def table(results: dict[str, Any]) -> str:
    lines = [f"machine: {results['machine']}",
             "quality: " + ", ".join(f"{k}={v:.4f}" for k, v in results["quality"].items()),
             "", "per-component p50 ms (share of summed e2e time); e2e p50/p99 ms; queries/s"]
    head = f"{'variant':<20}" + "".join(f"{c:>17}" for c in COMPONENTS) + \
        f"{'e2e p50':>9}{'e2e p99':>9}{'qps':>8}"
    lines.append(head)
    for name, v in results["variants"].items():
        if v.get("status") != "ok":
            lines.append(f"{name:<20}  {v.get('status')}: {v.get('reason')}")
            continue
        cells = "".join(f"{v[f'lat_{c}_p50_ms']:>9.3f} ({v[f'share_{c}']:>4.0%})" for c in COMPONENTS)
        lines.append(f"{name:<20}{cells}{v['lat_e2e_p50_ms']:>9.3f}{v['lat_e2e_p99_ms']:>9.3f}"
                     f"{v['qps']:>8.0f}")
    var = results["variants"]
    if var.get("cpu-only", {}).get("status") == "ok" and var.get("gpu", {}).get("status") == "ok":
        lines.append("")
        for c in ("retrieval", "ranking", "e2e"):
            ratio = var["cpu-only"][f"lat_{c}_p50_ms"] / var["gpu"][f"lat_{c}_p50_ms"]
            lines.append(f"cpu-only / gpu at p50, {c}: {ratio:.1f}x")
    if "same_topn_as_cpu" in results:
        lines.append("same ranked list as cpu-only (20 queries): " + ", ".join(
            f"{k}={v:.2f}" for k, v in results["same_topn_as_cpu"].items()))
        lines.append("top-n overlap with cpu-only: " + ", ".join(
            f"{k}={v:.2f}" for k, v in results["topn_overlap_with_cpu"].items()))
    pred = results.get("prediction_gh200")
    if pred:
        lines.append(f"PREDICTION (not measured) for GH200, gpu variant: batch "
                     f"{pred['batch_bytes']} B moved at {pred['measured_transfer_effective_gbps']:.1f}"
                     f" GB/s effective here; assumed C2C {pred['assumptions']['c2c_gbps']} GB/s")
        for case in pred["cases"]:
            lines.append(f"  Grace gathers {case['grace_feature_speedup']}x faster: e2e mean "
                         f"{pred['measured_e2e_mean_ms']:.3f} -> {case['predicted_e2e_mean_ms']:.3f}"
                         f" ms ({case['predicted_speedup']:.2f}x)")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
