"""What a family's prediction model sees (``FamilyInfo.predict``), cheap to import (no torch).

A model predicts one figure of a run measured on a machine we have, on a machine we do not
(``hopperlab predict``). It reads the run through ``PredictionInputs``: its params and knobs,
its metrics and its siblings' (runs of the same experiment), and both machines' described
figures, each read noting itself as an input; results/machines/predict.py provides it, labels
the prediction and keeps the formula, the inputs and the error. The models' formulas:
docs/benchmarks/machines.md ("Predictions").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol

from hopperlab.core.errors import HopperlabError


class Unpredictable(HopperlabError):
    """The model does not cover this variant (the message says why)."""


class MissingInput(HopperlabError):
    """An input the model needs is not there (the message says which and where)."""


class MeasuredRun(Protocol):
    """A measured run as a model reads it (results' RunRow has it)."""

    @property
    def key(self) -> str: ...
    @property
    def metrics(self) -> Mapping[str, float]: ...


class PredictionInputs(Protocol):
    """One source run, its siblings and both machines' descriptions; every read is noted in
    ``inputs`` (label -> value and where it comes from)."""

    params: dict[str, Any]
    knobs: dict[str, Any]
    inputs: dict[str, str]
    #: a model that brackets its figure sets the bracket's half-width over the value
    spread: float | None

    @property
    def row(self) -> MeasuredRun: ...
    @property
    def src(self) -> Any: ...  # the source machine's description
    @property
    def tgt(self) -> Any: ...  # the target machine's description

    def metric(self, name: str, row: MeasuredRun | None = None,
               label: str | None = None) -> float:
        """The run's (or ``row``'s) metric ``name``; MissingInput when it has none."""
        ...

    def fig(self, desc: Any, path: str, label: str) -> float:
        """A machine description's figure at ``path`` (``host_link.pinned.h2d``)."""
        ...

    def sibling(self, match: Callable[[dict[str, Any], dict[str, Any]], bool],
                what: str) -> MeasuredRun:
        """The first ok run of the same experiment whose (params, knobs) ``match``."""
        ...

    def compute_scale(self, kind: str) -> float:
        """k = peak_S / peak_T for ``bf16``, ``fp8`` or ``hbm``."""
        ...


#: ``model(inputs, metric) -> (value, model name, formula)``; raises Unpredictable or MissingInput
Model = Callable[[PredictionInputs, str], "tuple[float, str, str]"]


@dataclass(frozen=True)
class Collective:
    """A measured collective (a membench/collective run) a GPU-count model may read: its op,
    whether it was replayed from a CUDA graph, its GPU count, and the run."""

    op: str
    graph: bool
    world: int
    row: MeasuredRun


#: ``model(inputs, metric, gpus, collectives) -> (value, model name, formula)``: the run (on
#: one GPU) predicted on ``gpus`` GPUs of the same machine; raises Unpredictable or MissingInput
CountModel = Callable[[PredictionInputs, str, int, "tuple[Collective, ...]"],
                      "tuple[float, str, str]"]


@dataclass(frozen=True)
class PredictModel:
    """A family's prediction model, named by ``FamilyInfo.predict``."""

    #: the figures predicted (the family's headline throughput or time)
    metrics: tuple[str, ...]
    predict: Model
    #: a figure an ok run did not measure is left out (a query or study the run does not
    #: run), rather than reported unpredictable
    only_measured: bool = False
    #: the same run on more GPUs of the machine (None: not modelled across GPU counts)
    across_gpus: CountModel | None = None


def overlap(t: float, c: float, link: float, k: float, r_ratio: float) -> float:
    """The overlap model: t' = max(C*k, L*r_S/r_T) + (t - max(C, L))."""
    return max(c * k, link * r_ratio) + (t - max(c, link))


def same_host(ctx: PredictionInputs, what: str) -> None:
    """A figure whose host-side dispatch (Python, the framework's per-kernel work) is a large
    part of it keeps the source's dispatch time: only onto the source's own machine kind. No
    record or machine description holds a host's dispatch rate, and two x86 hosts of the same
    core count differed here by ~20 % in it (H200 and H100 nodes: docs/benchmarks/machines.md,
    "Error by model class"), so across machines such a row is not predicted."""
    src, tgt = getattr(ctx.src, "name", None), getattr(ctx.tgt, "name", None)
    ctx.inputs["machine S/T (host dispatch)"] = f"{src} / {tgt} (the machine descriptions)"
    same_host_kind(ctx, what)
    if src != tgt:
        raise Unpredictable(f"{what} is bound by the host's kernel dispatch, which no record "
                            f"or machine description measures: not carried from {src} to {tgt} "
                            f"(its launch-bound model erred over 10 % between two x86 hosts)")


def same_host_kind(ctx: PredictionInputs, what: str) -> None:
    """A launch-bound figure keeps the source's launch and dispatch time: only on a host of the
    same CPU architecture (Unpredictable otherwise, naming what is missing)."""
    src, tgt = getattr(ctx.src, "cpu_arch", None), getattr(ctx.tgt, "cpu_arch", None)
    ctx.inputs["host kind S/T (cpu_arch)"] = f"{src} / {tgt} (the machine descriptions)"
    if src != tgt:
        raise Unpredictable(f"{what} is launch-bound (kernel launches and the host's dispatch "
                            f"on the critical path), and a {tgt} host's dispatch speed is in no "
                            f"machine description (the source's host is {src})")
