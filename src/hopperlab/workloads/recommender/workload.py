"""recommender's entry: ``run(spec, recorder)``: train, evaluate, then time the pipeline.

``pipeline: gpu`` runs retrieval and ranking on the GPU where there is one, else the same code on
the CPU (tagged ``recommender.gpu_measured=false``); ``pipeline: cpu`` is the all-CPU peer on the
job's cores. Knobs: ``num_workers`` (feature threads), ``memory`` (managed feature tables),
``profiler``. What runs where: docs/benchmarks/recommender.md.
"""

from __future__ import annotations

import copy
import csv
import dataclasses
import os
import time
from contextlib import nullcontext
from typing import Any

import numpy as np

from hopperlab.workloads.base import Recording, RunView
from hopperlab.cuda.nvtx import measured_region
from hopperlab.core.rundir import SkipRun
from hopperlab.workloads.recommender import COMPONENTS, RecommenderParams
from hopperlab.workloads.recommender import data as data_mod
from hopperlab.workloads.recommender.pipeline import Pipeline, PipelineConfig, summarize
from hopperlab.workloads.recommender.training import train_and_evaluate
from hopperlab.workloads.sameness import add_evidence

#: queries checked against the CPU-only pipeline when the GPU pipeline runs (same ranked list?)
CHECK_QUERIES = 5


def node_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def job_cores(spec: RunView) -> int:
    """The cores this job may use: the node's (its CPU affinity), at most ``resources.cpus``.

    Under Slurm the affinity is the allocation; run locally, ``resources.cpus`` keeps two jobs
    side by side from each starting a thread per core of the whole machine (OpenMP threads that
    share cores spin against each other and run many times slower).
    """
    cpus = spec.resources.cpus
    return min(node_cores(), cpus) if cpus > 0 else node_cores()



def feature_workers(params: RecommenderParams, num_workers: int, cores: int) -> int:
    """The feature workers: the node's cores with ``workers_all_cores`` (the matrix refuses a
    num_workers knob beside it), else the knob."""
    return cores if params.workers_all_cores else int(num_workers)


def pipeline_config(params: RecommenderParams, *, device: str, workers: int, managed: bool,
                    allow_oversubscription: bool) -> Any:
    return PipelineConfig(
        device=device, candidates=params.candidates, top_n=params.top_n, augment=params.augment,
        workers=workers, pinned=params.transfer == "pinned",
        item_embeddings=params.item_embeddings, managed=managed, cuda_graphs=params.cuda_graphs,
        host_chunks=params.host_chunks, allow_oversubscription=allow_oversubscription)


def query_users(n_users: int, count: int, seed: int) -> np.ndarray:
    """The randomly generated queries: user ids, seeded."""
    return np.random.default_rng(seed + 1).integers(0, n_users, size=count)


def run(spec: RunView, recorder: Recording) -> None:
    import torch  # noqa: PLC0415

    p: RecommenderParams = spec.params
    memory = spec.knobs.memory
    profiler = spec.knobs.profiler
    cores = job_cores(spec)
    workers = feature_workers(p, spec.knobs.num_workers, cores)
    managed = memory == "managed"
    gpus = spec.resources.gpus
    has_gpu = gpus > 0 and torch.cuda.is_available()
    device = "cuda" if (has_gpu and p.pipeline == "gpu") else "cpu"
    if managed and device != "cuda":
        raise SkipRun("memory=managed needs a CUDA device (none visible, or resources.gpus: 0)")
    torch.set_num_threads(cores)  # the CPU peer: all of them; training and the rest: no more
    recorder.set_tag("recommender.pipeline", p.pipeline)
    recorder.set_tag("recommender.device", device)
    recorder.set_tag("recommender.gpu_measured", str(device == "cuda").lower())
    recorder.set_tag("recommender.feature_workers", workers)
    recorder.set_tag("recommender.node_cores", node_cores())
    recorder.set_tag("recommender.job_cores", cores)
    recorder.set_tag("recommender.torch_threads", torch.get_num_threads())
    recorder.set_tag("recommender.memory", memory)
    if device == "cuda":
        recorder.set_tag("recommender.gpu", torch.cuda.get_device_name())

    t0 = time.perf_counter()
    data = data_mod.load(spec.asset_path("data"))
    recorder.log_metrics(load_s=time.perf_counter() - t0, feature_table_mb=data.feature_bytes() / 1e6)

    train_device = torch.device("cuda" if has_gpu else "cpu")
    losses: list[tuple[str, int, float]] = []
    t0 = time.perf_counter()
    trained = train_and_evaluate(data, p, train_device,
                                 log=lambda model, step, loss: losses.append((model, step, loss)))
    recorder.log_metrics(train_s=time.perf_counter() - t0, **trained.metrics)
    recorder.set_tag("recommender.train_device", train_device.type)
    _write_losses(recorder.artifact_path("training_loss.csv"), losses)
    if p.save_models:
        torch.save({"two_tower": trained.two_tower.state_dict(), "dlrm": trained.dlrm.state_dict()},
                   recorder.artifact_path("models.pt"))

    cfg = pipeline_config(p, device=device, workers=workers, managed=managed,
                          allow_oversubscription=bool(getattr(spec.site, "allow_oversubscription",
                                                              False)))
    pipe = Pipeline(data, trained.two_tower, trained.dlrm, cfg)
    try:
        recorder.set_tag("recommender.staging", "pinned" if pipe.staging.is_pinned() else "pageable")
        recorder.set_tag("recommender.cuda_graphs", str(pipe.graphs).lower())
        for name, note in pipe.notes.items():
            recorder.set_tag(f"recommender.{name}", note)
        windows = spec.repeats  # repeat_unit "windows": after warm-up
        users = query_users(data.users, p.warmup + p.queries * windows, p.seed)
        for user in users[:p.warmup]:
            pipe.query(int(user))
        results = []
        with _profiling(torch, profiler, device, recorder), measured_region():
            for step, user in enumerate(users[p.warmup:]):
                if windows > 1:
                    recorder.repeat = step // p.queries
                res = pipe.query(int(user))
                results.append(res)
                recorder.log_step(step, **{f"{c}_ms": res.seconds[c] * 1e3
                                           for c in (*COMPONENTS, "e2e")})
                if windows > 1 and (step + 1) % p.queries == 0:
                    recorder.add_sample(summarize(results[-p.queries:]))
        recorder.repeat = None
        recorder.log_metrics(summarize(results))
        # every query inside the measured window (all windows): what its joules are divided by
        recorder.log_metric("measured_queries", float(len(results)))
        # each fixed query's ranked list, compared with the baseline's (issue 47)
        add_evidence(recorder, "topn", [r.items.tolist() for r in results[:p.queries]])
        if device == "cuda":
            recorder.log_metric("check_same_topn", _agreement(
                data, trained, p, pipe, users[p.warmup:p.warmup + CHECK_QUERIES], cfg))
    finally:
        pipe.close()


def _agreement(data: Any, trained: Any, p: RecommenderParams, pipe: Any, users: np.ndarray,
               gpu_cfg: Any) -> float:
    """Share of ``users`` whose ranked list is the same through the CPU-only pipeline."""
    cpu_cfg = dataclasses.replace(gpu_cfg, device="cpu", managed=False, item_embeddings="gpu",
                                  workers=0, cuda_graphs=False)
    ref = Pipeline(data, copy.deepcopy(trained.two_tower).cpu(), copy.deepcopy(trained.dlrm).cpu(),
                   cpu_cfg)
    try:
        same = [np.array_equal(pipe.query(int(u)).items, ref.query(int(u)).items) for u in users]
    finally:
        ref.close()
    return float(np.mean(same)) if same else float("nan")


def _profiling(torch: Any, profiler: str, device: str, recorder: Recording) -> Any:
    if profiler != "torch":
        return nullcontext()
    from torch.profiler import ProfilerActivity, profile  # noqa: PLC0415

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    return _TorchTrace(profile(activities=activities),
                       recorder.artifact_path("profile/torch_trace.json"))


class _TorchTrace:
    def __init__(self, prof: Any, path: Any) -> None:
        self.prof, self.path = prof, path

    def __enter__(self) -> Any:
        return self.prof.__enter__()

    def __exit__(self, *exc: Any) -> None:
        self.prof.__exit__(*exc)
        if exc[0] is None:
            self.prof.export_chrome_trace(str(self.path))


def _write_losses(path: Any, losses: list[tuple[str, int, float]]) -> None:
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["model", "step", "loss"])
        writer.writerows(losses)
