"""recommender: the latency pipeline of the source slides, on a trained recommender
(FAMILY, params).

A two-tower retrieval model and a DLRM ranking model are trained briefly on the ``recsys`` tables,
checked against a popularity baseline, then timed per query one component after another:
``retrieval``, ``features``, ``transfer``, ``ranking``, ``topn`` (``COMPONENTS``). Metrics:
per-component and end-to-end p50/p99 latency, shares, qps, recall@k and AUC. Cheap to import
(no torch, no numpy): the spec layer reads it. Details: docs/benchmarks/recommender.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from hopperlab.core.schema import bounded, settle_fields
from hopperlab.workloads.base import (HIGHER, LOWER, PROFILERS, Contradiction, FamilyInfo, Knobs,
                                      WorkUnit)

COMPONENTS = ("retrieval", "features", "transfer", "ranking", "topn")
Pipeline = Literal["gpu", "cpu"]
PIPELINES = get_args(Pipeline)
Augment = Literal["numpy", "pandas"]
AUGMENTS = get_args(Augment)
Transfer = Literal["pinned", "pageable"]
TRANSFERS = get_args(Transfer)
EmbeddingPlace = Literal["gpu", "host"]
EMBEDDING_PLACES = get_args(EmbeddingPlace)

HEADLINE_METRICS: tuple[str, ...] = (
    "lat_e2e_p50_ms", "qps", *(f"lat_{c}_p50_ms" for c in COMPONENTS),
    *(f"share_{c}" for c in COMPONENTS), "recall_at_k", "recall_at_k_popularity", "rank_auc")


@dataclass(frozen=True)
class RecommenderParams:
    #: "gpu": retrieval and ranking on the GPU (CPU stand-in on a node without one);
    #: "cpu": every component on the CPU, on all of the node's cores (the peer)
    pipeline: Pipeline = "gpu"
    #: feature augmentation: "numpy" (vectorised gathers into staging buffers) or "pandas"
    #: (DataFrame lookups and concatenation: the "before")
    augment: Augment = "numpy"
    #: feature-augmentation worker threads = the node's core count (knob num_workers must be 0)
    workers_all_cores: bool = False
    #: host staging buffers of the ranking batch: "pinned" (page-locked) or "pageable"
    transfer: Transfer = "pinned"
    #: where the item embeddings live for retrieval: "gpu", or "host" (pinned, streamed per query)
    item_embeddings: EmbeddingPlace = "gpu"
    #: replay retrieval and ranking as CUDA graphs (fewer launches); GPU only
    cuda_graphs: bool = True
    #: candidates retrieved per query (the ranking batch) and the final list's length
    candidates: int = bounded(1000, at_least=1)
    top_n: int = bounded(10, at_least=1)
    #: timed queries and untimed warm-up queries (random users, seeded)
    queries: int = bounded(1000, at_least=1)
    warmup: int = bounded(50, at_least=0)
    #: model sizes: categorical embedding width, tower output width, hidden width
    embedding_dim: int = bounded(16, at_least=1)
    tower_dim: int = bounded(64, at_least=1)
    hidden_dim: int = bounded(256, at_least=1)
    #: brief training: steps and batch size of each model, learning rate
    retrieval_steps: int = bounded(300, at_least=1)
    ranking_steps: int = bounded(300, at_least=1)
    batch_size: int = bounded(4096, at_least=1)
    learning_rate: float = bounded(0.003, above=0)
    #: evaluation: recall@recall_k over at most eval_users held-out users
    recall_k: int = bounded(100, at_least=1)
    eval_users: int = bounded(2000, at_least=1)
    #: item-embedding chunks streamed per query when item_embeddings is "host"
    host_chunks: int = bounded(8, at_least=1)
    #: write the trained models' state dicts to artifacts/models.pt
    save_models: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        """Types and bounds are declared on the fields (``settle_fields``); here: the fields
        that go together."""
        settle_fields(self)
        if self.top_n > self.candidates:
            raise ValueError(f"top_n ({self.top_n}) must not exceed candidates "
                             f"({self.candidates})")
        if self.pipeline == "cpu" and (self.item_embeddings != "gpu" or self.transfer != "pinned"):
            raise ValueError("pipeline: cpu runs every component on the CPU; item_embeddings "
                             "and transfer are GPU choices (leave them at their defaults)")


def check(knobs: Knobs, params: RecommenderParams) -> None:
    """Refuse a variant whose knobs contradict its params (``FamilyInfo.check``)."""
    if params.workers_all_cores and knobs.num_workers:
        raise Contradiction("num_workers", f"{knobs.num_workers} contradicts workers_all_cores: "
                            f"true (it sets the feature workers to the node's core count)")
    if knobs.memory != "managed":
        return
    if params.pipeline == "cpu":
        raise Contradiction("memory", "managed puts the feature tables where the GPU reads them; "
                            "pipeline: cpu has no GPU component")
    if params.transfer != "pinned" or params.augment != "numpy":
        raise Contradiction("memory", "managed gathers the batch on the GPU: there is no staging "
                            "buffer to transfer nor CPU augmentation (leave transfer and augment "
                            "at their defaults)")


#: which way each figure is better and what a run's cost is divided by
METRIC_DIRECTIONS = {"lat_e2e_p50_ms": LOWER, "qps": HIGHER,
              **{f"lat_{c}_p50_ms": LOWER for c in COMPONENTS},
              "recall_at_k": HIGHER, "rank_auc": HIGHER}
WORK_UNITS = (WorkUnit("cost_per_1m_recommendations", "per 1M recommendations", 1e6, "per_s",
                       "qps", scale_param="top_n", work_per_j="recommendations_per_j",
                       done=("measured_queries",),
                       work_label="recommendations per joule"),)

FAMILY = FamilyInfo(
    name="recommender",
    entry="hopperlab.workloads.recommender.workload:run",
    sameness="hopperlab.workloads.recommender.sameness:rule",
    predict="hopperlab.workloads.recommender.predict:MODEL",
    supported_knobs={
        "num_workers": frozenset({0, 4}),
        "memory": frozenset({"device", "managed"}),
        "profiler": PROFILERS,
    },
    params=RecommenderParams,
    headline_metrics=HEADLINE_METRICS,
    charts="hopperlab.workloads.recommender.charts:charts",
    directions=METRIC_DIRECTIONS,
    judged=("lat_e2e_p50_ms",),
    work_units=WORK_UNITS,
    check=check,
    # training takes 10 s, a window of queries well under one: windows after one warm-up
    repeat_unit="windows",
    # the pipeline's CPU parts (features, launches) follow the host's CPU (issue 29)
    host_cpu_metrics=("lat_*", "qps"),
)
