"""How many decoder layers can keep their MLP's up-projection (``llama.keep_mlp_up``) on this
GPU, measured rather than guessed: a first step with none kept gives the step's peak; a keeping
layer adds at most its up-projection's output and input for the whole step, so the layers that
fit are the room above that peak, less a margin for the allocator's fragments.

Why measured: the peak depends on the loss (whole or chunked), the checkpoints, torch's version
and what the GPU reserves; on 2026-11-28 a guess of 2.5 GiB a layer ran 20 keeping layers of the
13B out of an H200's 139.8 GiB. Figures: docs/benchmarks/distributed.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from hopperlab.workloads.finetune.llama import Llama, Shape, keep_mlp_up

#: the room left unplanned: the caching allocator's fragments and a kernel's workspace (a
#: share of the GPU's memory, at least ``MARGIN_MIN_BYTES``)
MARGIN_SHARE = 0.04
MARGIN_MIN_BYTES = 2 * 2**30

GIB = 2**30


@dataclass(frozen=True)
class Fit:
    """The outcome of fitting, as the record says it."""

    kept: int
    #: the most the run asked for (``mlp_up_saved_layers``)
    most: int
    layers: int
    #: the sizing step's peak with no layer keeping, and what torch can hold on the GPU
    peak_bytes: int
    capacity_bytes: int
    layer_bytes: int
    margin_bytes: int

    def describe(self) -> str:
        return (f"fitted after a sizing step: the last {self.kept} of {self.layers} decoder "
                f"layers keep their MLP's up-projection (at most {self.most} asked; peak "
                f"{self.peak_bytes / GIB:.1f} GiB with none kept, {self.layer_bytes / GIB:.2f} "
                f"GiB a keeping layer, {self.capacity_bytes / GIB:.1f} GiB for torch on the GPU "
                f"less a {self.margin_bytes / GIB:.1f} GiB margin)")


def layer_bytes(shape: Shape, tokens: int, elt_bytes: int) -> int:
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


def fit(model: Llama, most: int, tokens: int, elt_bytes: int, peak_bytes: int,
        capacity_bytes: int) -> Fit:
    """Let the last layers that fit keep their up-projection (``keep_mlp_up``, at most
    ``most``) and say so. The compiled layers see the new flag at their next call (a guard:
    one more graph, compiled in the next warm-up step)."""
    per_layer = layer_bytes(model_shape(model), tokens, elt_bytes)
    margin = margin_for(capacity_bytes)
    kept = keep_mlp_up(model, layers_that_fit(peak_bytes, capacity_bytes, per_layer, most, margin))
    return Fit(kept=kept, most=most, layers=len(model.layers), peak_bytes=peak_bytes,
               capacity_bytes=capacity_bytes, layer_bytes=per_layer, margin_bytes=margin)


def model_shape(model: Llama) -> Shape:
    """The shape a built model has (its first layer's projections; the vocabulary's head)."""
    layer = model.layers[0]
    hidden = layer.qkv.in_features
    return Shape(hidden=hidden, heads=layer.heads, ffn=layer.down.in_features,
                 vocab=model.head.out_features, layers=len(model.layers))
