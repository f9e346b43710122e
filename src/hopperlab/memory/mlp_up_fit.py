"""How many decoder layers can keep their MLP's up-projection on this GPU (the sharded engine's
``llama.keep_mlp_up``, through the ``keep`` it hands here), measured rather than guessed, in two
sizing steps: the first, with none kept, gives the
step's peak, and the layers an estimate of each one's bytes (its up-projection's output and
input) fits above it, less a margin for the allocator's fragments, keep; the second measures
the peak with them and so what a keeping layer really adds, and the layers that still fit at
that rate join them.

Why measured: the peak depends on the loss (whole or chunked), the checkpoints, the compiled
graph's saved tensors, torch's version and what the GPU reserves. On 2026-11-28 a guess of 2.5
GiB a layer ran 20 keeping layers of the 13B out of an H200's 139.8 GiB; the estimate of 4 GiB
kept 17 at a peak of 115.5 GiB, about 3.0 GiB a layer measured. Figures:
docs/benchmarks/distributed.md.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Protocol


class MlpShape(Protocol):
    """What a layer's bytes are sized from: the model's hidden and MLP widths."""

    @property
    def hidden(self) -> int: ...
    @property
    def ffn(self) -> int: ...


#: ``keep(n)``: the last ``n`` decoder layers keep their up-projection (the others recompute
#: it); returns how many do (a model without recompute keeps none)
Keep = Callable[[int], int]

#: the room left unplanned: the caching allocator's fragments and a kernel's workspace (a
#: share of the GPU's memory, at least ``MARGIN_MIN_BYTES``). On an H200 (138.9 GiB for torch,
#: 2026-11-28, docs/benchmarks/distributed.md round 5) 4 % let 29 layers keep at a peak of
#: 133.6 GiB allocated, the allocator's reserve reached 138.8 GiB and it freed its cache and
#: retried 15 times (``gpu_alloc_retries``); 8 %: 27 layers, 126.8 GiB, still 138.8 reserved
#: and 8 retries, the step 9.80 s against 9.75 (one run each): the fragments grow with what
#: the layers free and take, so a wider margin only halves the retries
MARGIN_SHARE = 0.08
MARGIN_MIN_BYTES = 2 * 2**30

GIB = 2**30


@dataclass(frozen=True)
class Fit:
    """The outcome of fitting, as the record says it."""

    kept: int
    #: the most the run asked for (``mlp_up_saved_layers``)
    most: int
    layers: int
    #: the first sizing step's peak with no layer keeping, and what torch can hold on the GPU
    peak_bytes: int
    capacity_bytes: int
    #: a keeping layer's bytes: estimated (``layer_bytes``), then measured by the second step
    layer_bytes: int
    margin_bytes: int
    #: the layers the estimate kept and the second step's peak with them (None: not refined)
    first_kept: int | None = None
    second_peak_bytes: int | None = None
    #: the first step's estimate of a layer's bytes, said beside the measured one
    estimate_gib: float = 0.0

    def describe(self) -> str:
        said = (f"the last {self.kept} of {self.layers} decoder layers keep their MLP's "
                f"up-projection (at most {self.most} asked; {self.capacity_bytes / GIB:.1f} GiB "
                f"for torch on the GPU less a {self.margin_bytes / GIB:.1f} GiB margin; peak "
                f"{self.peak_bytes / GIB:.1f} GiB with none kept")
        if self.second_peak_bytes is None:
            return (f"fitted after a sizing step: {said}, {self.layer_bytes / GIB:.2f} GiB a "
                    f"keeping layer estimated)")
        return (f"fitted after two sizing steps: {said}, {self.second_peak_bytes / GIB:.1f} GiB "
                f"with the {self.first_kept} an estimate of {self.estimate_gib:.2f} GiB a layer "
                f"kept, so {self.layer_bytes / GIB:.2f} GiB a keeping layer measured)")


def layer_bytes(shape: MlpShape, tokens: int, elt_bytes: int) -> int:
    """GPU bytes a layer adds by keeping its up-projection over ``tokens`` tokens of a micro
    batch: the projection's output (gate and up, 2 x ffn) and its input (the MLP's norm,
    hidden), which a recomputing layer derives again from its checkpointed input."""
    return tokens * (2 * shape.ffn + shape.hidden) * elt_bytes


def margin_for(capacity_bytes: int) -> int:
    return max(MARGIN_MIN_BYTES, int(MARGIN_SHARE * capacity_bytes))


def layers_that_fit(peak_bytes: int, capacity_bytes: int, per_layer_bytes: int, most: int,
                    margin_bytes: int) -> int:
    """Keeping layers (0 to ``most``) whose bytes fit between the peak and the capacity less
    the margin."""
    room = capacity_bytes - margin_bytes - peak_bytes
    if room <= 0 or per_layer_bytes <= 0:
        return 0
    return max(0, min(most, room // per_layer_bytes))


def fit(keep: Keep, layers: int, shape: MlpShape, most: int, tokens: int, elt_bytes: int,
        peak_bytes: int, capacity_bytes: int) -> Fit:
    """After the first sizing step: let the last layers (of ``layers``) the estimate fits keep
    their up-projection (``keep``, at most ``most``) and say so. The compiled layers see the
    new flag at their next call (a guard: one more graph, compiled in the next step)."""
    per_layer = layer_bytes(shape, tokens, elt_bytes)
    margin = margin_for(capacity_bytes)
    kept = keep(layers_that_fit(peak_bytes, capacity_bytes, per_layer, most, margin))
    return Fit(kept=kept, most=most, layers=layers, peak_bytes=peak_bytes,
               capacity_bytes=capacity_bytes, layer_bytes=per_layer, margin_bytes=margin,
               estimate_gib=per_layer / GIB)


def refine(keep: Keep, first: Fit, second_peak_bytes: int) -> Fit:
    """After the second sizing step (``first.kept`` layers keeping): what a keeping layer
    really added, (second peak - first peak) / layers kept, and as many more of the last
    layers keep as fit at that rate above the second peak (never fewer than the first kept:
    they fitted, measured)."""
    if first.kept == 0:  # nothing kept: nothing to measure a layer by
        return replace(first, second_peak_bytes=second_peak_bytes, first_kept=0)
    measured = max(1, (second_peak_bytes - first.peak_bytes) // first.kept)
    more = layers_that_fit(second_peak_bytes, first.capacity_bytes, measured,
                           first.most - first.kept, first.margin_bytes)
    kept = keep(first.kept + more)
    return replace(first, kept=kept, layer_bytes=measured, first_kept=first.kept,
                   second_peak_bytes=second_peak_bytes)

