"""Activation checkpointing of decoder layers (``torch.utils.checkpoint``, non-reentrant).

Each layer keeps only its inputs for backward and recomputes its forward there. The layer is
called *as a module* inside the checkpoint (``layer(*args)``, not ``layer.forward``), so the
forward hooks of other techniques also run during the recomputation: parameter offload brings
the layer's weights back through them. In forward the hooks therefore run twice (outside and
inside the checkpoint); the hooks of this package are idempotent.

With ``ActivationOffload`` active around forward, the only tensors its hooks see inside the
layers are the checkpoint inputs (the non-reentrant checkpoint saves them through autograd,
outside its own hooks), so combining the two offloads exactly the layer inputs.
"""

from __future__ import annotations

from typing import Any, Iterable

from torch import nn
from torch.utils.checkpoint import checkpoint


class _CheckpointedForward:
    """Replaces ``layer.forward``: outside, run the layer under a checkpoint; inside (the
    module call the checkpoint makes, in forward and in recomputation), the real forward."""

    def __init__(self, layer: nn.Module, preserve_rng_state: bool):
        self.layer = layer
        self.original = layer.forward
        self.preserve_rng_state = preserve_rng_state
        self.inside = False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.inside:
            return self.original(*args, **kwargs)
        return checkpoint(self._call_module, *args, use_reentrant=False,
                          preserve_rng_state=self.preserve_rng_state, **kwargs)

    def _call_module(self, *args: Any, **kwargs: Any) -> Any:
        self.inside = True
        try:
            return self.layer(*args, **kwargs)
        finally:
            self.inside = False


class CheckpointedLayers:
    """Handle on the wrapped layers; ``remove()`` restores their plain forward."""

    def __init__(self, wrapped: list[tuple[nn.Module, _CheckpointedForward]]):
        self._wrapped = wrapped

    def __len__(self) -> int:
        return len(self._wrapped)

    def remove(self) -> None:
        for layer, _fwd in self._wrapped:
            del layer.forward          # the instance attribute: the class's forward is back
        self._wrapped = []


def checkpoint_layers(layers: Iterable[nn.Module], *, preserve_rng_state: bool = True) -> CheckpointedLayers:
    """Checkpoint every layer of ``layers`` (e.g. ``decoder_layers(model)``).

    ``preserve_rng_state`` replays dropout identically in the recomputation (needed for exact
    gradients with dropout; costs an RNG state save per layer).
    """
    wrapped = []
    for layer in layers:
        if isinstance(layer.__dict__.get("forward"), _CheckpointedForward):
            raise ValueError(f"layer {type(layer).__name__} is already checkpointed")
        fwd = _CheckpointedForward(layer, preserve_rng_state)
        layer.forward = fwd
        wrapped.append((layer, fwd))
    return CheckpointedLayers(wrapped)
