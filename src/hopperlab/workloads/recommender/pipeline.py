"""The latency pipeline: one query at a time, one component after another, each timed.

``Pipeline.query(user)`` runs each component inside its NVTX range ``pipeline.<component>`` and
synchronises before the next, as the source slides time it. ``PipelineConfig`` chooses the CPU
peer or the GPU (item embeddings resident or streamed in chunks), pinned or pageable staging,
worker threads and CUDA graphs. The same code runs on the CPU in CI. Each component in detail:
docs/benchmarks/recommender.md.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

from hopperlab.cuda.nvtx import nvtx_range
from hopperlab.memory.pinned import pinned_copy
from hopperlab.workloads.recommender import COMPONENTS
from hopperlab.workloads.recommender.data import RecsysData
from hopperlab.workloads.recommender.features import (NumpyAugmenter, PackedTables,
                                                      PandasAugmenter, pack)
from hopperlab.workloads.recommender.placement import ManagedTables, host_buffer
from hopperlab.workloads.recommender.ranking import DLRM
from hopperlab.workloads.recommender.retrieval import TwoTower, item_embeddings


@dataclass(frozen=True)
class PipelineConfig:
    device: str = "cpu"  # "cuda" or "cpu"
    candidates: int = 1000
    top_n: int = 10
    augment: str = "numpy"  # "numpy" | "pandas"
    workers: int = 0
    pinned: bool = True
    item_embeddings: str = "gpu"  # "gpu" (resident on the pipeline's device) | "host" (streamed)
    managed: bool = False  # feature tables in managed memory, gathered by the GPU
    cuda_graphs: bool = True
    host_chunks: int = 8
    allow_oversubscription: bool = False


@dataclass
class QueryResult:
    items: np.ndarray  # the final ranked list, best first
    seconds: dict[str, float] = field(default_factory=dict)  # per component, and "e2e"


def _graph(fn: Callable[[], None]) -> Callable[[], None]:
    """``fn`` captured as a CUDA graph (after warm-up on a side stream); returns its replay."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


class Pipeline:
    def __init__(self, data: RecsysData, two_tower: TwoTower, dlrm: DLRM, cfg: PipelineConfig,
                 packed: PackedTables | None = None, item_emb: torch.Tensor | None = None) -> None:
        self.cfg = cfg
        self.dev = torch.device(cfg.device)
        self.cuda = self.dev.type == "cuda"
        if cfg.managed and not self.cuda:
            raise ValueError("managed feature tables need the pipeline on a CUDA device")
        self.notes: dict[str, str] = {}
        self.packed = packed if packed is not None else pack(data)
        lay = self.layout = self.packed.layout
        k, words = cfg.candidates, lay.words
        if k > data.items:
            raise ValueError(f"candidates ({k}) exceeds the items ({data.items})")
        self.user_tower = two_tower.user.to(self.dev).eval()
        self.dlrm = dlrm.to(self.dev).eval()
        if item_emb is None:
            with torch.no_grad():
                item_emb = item_embeddings(two_tower.to(self.dev),
                                           torch.from_numpy(data.item_cont).to(self.dev),
                                           torch.from_numpy(data.item_cat).to(self.dev))
        self._sync = torch.cuda.synchronize if self.cuda else (lambda: None)

        # tables: managed (GPU reads them directly) or on the pipeline's device / host
        self.managed: ManagedTables | None = None
        if cfg.managed:
            self.managed = ManagedTables({"user": self.packed.user_words,
                                          "item": self.packed.item_words},
                                         allow_oversubscription=cfg.allow_oversubscription)
            self.user_table = self.managed.tensors["user"]
            self.notes["managed_bytes"] = str(self.managed.nbytes)
        else:
            self.user_table = torch.from_numpy(self.packed.user_words).to(self.dev)

        # item embeddings: resident on the device, or pinned on the host and streamed
        self.streamed = cfg.item_embeddings == "host" and self.cuda
        if cfg.item_embeddings == "host":
            host = item_emb.detach().to("cpu").contiguous()
            self.item_emb = pinned_copy(host) if self.cuda else host
            bounds = np.linspace(0, host.shape[0], cfg.host_chunks + 1).astype(int)
            self.chunks = [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
            width = max(b - a for a, b in self.chunks)
            self.chunk_bufs = [torch.empty((width, host.shape[1]), device=self.dev)
                               for _ in range(2 if self.cuda else 0)]
            if self.cuda:
                self.copy_stream = torch.cuda.Stream()
        else:
            self.item_emb = item_emb.detach().to(self.dev).contiguous()

        # static buffers (CUDA graphs replay on fixed addresses)
        self.uid = torch.zeros(1, dtype=torch.int64, device=self.dev)
        self.cands = torch.zeros(k, dtype=torch.int64, device=self.dev)
        self.scores = torch.zeros(k, dtype=torch.float32, device=self.dev)
        self.cands_host = host_buffer((k,), torch.int64, cfg.pinned) if self.cuda else self.cands
        # zeroed: graph capture runs the ranking once before any query filled the batch, and
        # id 0 is a valid row of every embedding table
        self.staging = host_buffer((k, words), torch.int32, cfg.pinned and self.cuda).zero_()
        self.batch = torch.zeros((k, words), dtype=torch.int32, device=self.dev) if self.cuda \
            else self.staging
        if cfg.managed:
            self.augment = None
        elif cfg.augment == "pandas":
            self.augment = PandasAugmenter(data, self.packed, self.staging.numpy())
        else:
            self.augment = NumpyAugmenter(self.packed, self.staging.numpy(), cfg.workers)

        self._retrieve = self._retrieve_streamed if cfg.item_embeddings == "host" \
            else self._retrieve_resident
        self._rank = self._rank_eager
        self.graphs = False
        if self.cuda and cfg.cuda_graphs:
            try:
                with torch.no_grad():
                    if not self.streamed:
                        self._retrieve = _graph(self._retrieve_resident)
                    self._rank = _graph(self._rank_eager)
                self.graphs = True
            except Exception as exc:  # noqa: BLE001 - eager still measures the pipeline
                self._retrieve = self._retrieve_streamed if self.streamed else self._retrieve_resident
                self._rank = self._rank_eager
                self.notes["cuda_graphs_failed"] = f"{type(exc).__name__}: {exc}"[:300]

    # ------------------------------------------------------------------ device work
    def _user_vector(self) -> torch.Tensor:
        row = self.user_table[self.uid]
        uc = self.layout.user_continuous
        return self.user_tower(row[:, :uc].view(torch.float32), row[:, uc:])[0]

    def _retrieve_resident(self) -> None:
        scores = self.item_emb @ self._user_vector()
        self.cands.copy_(torch.topk(scores, self.cfg.candidates, sorted=True).indices)

    def _retrieve_streamed(self) -> None:
        """Top-k over item embeddings in host memory, chunk by chunk (double-buffered copies on
        a side stream on CUDA), keeping each chunk's top-k, then the top-k of those."""
        user = self._user_vector()
        k = self.cfg.candidates
        values, index = [], []
        if self.cuda:
            main = torch.cuda.current_stream()
            used = [torch.cuda.Event(), torch.cuda.Event()]
            for e in used:
                e.record(main)
        for c, (a, b) in enumerate(self.chunks):
            if self.cuda:
                buf = self.chunk_bufs[c % 2][:b - a]
                ready = torch.cuda.Event()
                with torch.cuda.stream(self.copy_stream):
                    self.copy_stream.wait_event(used[c % 2])
                    buf.copy_(self.item_emb[a:b], non_blocking=True)
                    ready.record(self.copy_stream)
                main.wait_event(ready)
            else:
                buf = self.item_emb[a:b]
            top = torch.topk(buf @ user, min(k, b - a), sorted=True)
            if self.cuda:
                used[c % 2].record(main)
            values.append(top.values)
            index.append(top.indices + a)
        best = torch.topk(torch.cat(values), k, sorted=True).indices
        self.cands.copy_(torch.cat(index)[best])

    def _rank_eager(self) -> None:
        self.scores.copy_(self.dlrm.score_words(self.batch, self.layout))

    # ------------------------------------------------------------------ the components
    def retrieval(self, user: int) -> None:
        self.uid.fill_(user)
        self._retrieve()
        if self.cuda and self.managed is None:
            self.cands_host.copy_(self.cands, non_blocking=True)
        self._sync()

    def features(self, user: int) -> None:
        if self.managed is not None:
            u = self.layout.user_words
            self.batch[:, :u] = self.user_table[self.uid]
            self.batch[:, u:] = self.managed.tensors["item"][self.cands]
            self._sync()
            return
        self.augment(user, self.cands_host.numpy())

    def transfer(self) -> None:
        if self.cuda and self.managed is None:
            self.batch.copy_(self.staging, non_blocking=self.cfg.pinned)
            self._sync()

    def ranking(self) -> None:
        self._rank()
        self._sync()

    def topn(self) -> np.ndarray:
        best = torch.topk(self.scores, self.cfg.top_n, sorted=True).indices
        return self.cands[best].cpu().numpy()

    @torch.no_grad()
    def query(self, user: int) -> QueryResult:
        seconds: dict[str, float] = {}
        t_start = t = time.perf_counter()
        steps: list[tuple[str, Callable[[], Any]]] = [
            ("retrieval", lambda: self.retrieval(user)), ("features", lambda: self.features(user)),
            ("transfer", self.transfer), ("ranking", self.ranking), ("topn", self.topn)]
        items = None
        for name, fn in steps:
            with nvtx_range(f"pipeline.{name}"):
                out = fn()
            now = time.perf_counter()
            seconds[name] = now - t
            t = now
            if name == "topn":
                items = out
        seconds["e2e"] = t - t_start
        return QueryResult(np.asarray(items), seconds)

    def close(self) -> None:
        if self.augment is not None:
            self.augment.close()
        if self.managed is not None:
            self.managed.close()
            self.managed = None


def summarize(results: list[QueryResult]) -> dict[str, float]:
    """p50/p99 per component and end to end (ms), each component's share of the summed
    end-to-end time (shares add to 1 up to the gaps between components), queries per second."""
    out: dict[str, float] = {}
    e2e = np.array([r.seconds["e2e"] for r in results])
    for name in (*COMPONENTS, "e2e"):
        ms = np.array([r.seconds[name] for r in results]) * 1e3
        out[f"lat_{name}_p50_ms"] = float(np.percentile(ms, 50))
        out[f"lat_{name}_p99_ms"] = float(np.percentile(ms, 99))
        out[f"lat_{name}_mean_ms"] = float(ms.mean())
        if name != "e2e":
            out[f"share_{name}"] = float(ms.sum() / 1e3 / e2e.sum())
    out["qps"] = float(len(results) / e2e.sum())
    out["queries"] = float(len(results))
    return out
