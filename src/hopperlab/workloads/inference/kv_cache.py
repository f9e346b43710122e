"""The KV cache as this family handles it: a transformers ``DynamicCache`` (transformers 5: a list
of ``cache.layers``, each holding ``keys`` and ``values`` of shape [batch, kv_heads, tokens,
head_dim]) that the policies take apart into per-layer tensors and put together again.

``LayerwiseReadyCache`` is the piece that lets a reload overlap the next prefill: it is a
DynamicCache whose layers may still be arriving; when the model's attention of layer i updates the
cache, the compute stream first waits for layer i's arrival event, and only for that one.
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

#: (keys, values) of one layer
LayerKV = tuple[Any, Any]


def _require_layers(cache: Any) -> list[Any]:
    layers = getattr(cache, "layers", None)
    if layers is None:
        raise RuntimeError(
            f"{type(cache).__name__} has no .layers: this family needs transformers >= 5 "
            f"(per-layer cache objects)")
    return layers


def layer_tensors(cache: Any) -> list[LayerKV]:
    """The cache's (keys, values) per layer, as the tensors it holds (no copy)."""
    return [(layer.keys, layer.values) for layer in _require_layers(cache)]


def cache_tokens(cache: Any) -> int:
    return int(cache.get_seq_length()) if cache is not None else 0


def cache_nbytes(layers: Sequence[LayerKV]) -> int:
    return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in layers)


def _filled_layer(keys: Any, values: Any) -> Any:
    from transformers.cache_utils import DynamicLayer  # noqa: PLC0415

    layer = DynamicLayer()
    layer.lazy_initialization(keys, values)
    layer.keys, layer.values = keys, values
    return layer


def _dynamic_cache_class() -> type:
    from transformers import DynamicCache  # noqa: PLC0415

    return DynamicCache


def new_cache() -> Any:
    """An empty DynamicCache (its layers are made by the first forward)."""
    return _dynamic_cache_class()()


def cache_from_layers(layers: Sequence[LayerKV]) -> Any:
    """A DynamicCache holding exactly these tensors (no copy)."""
    cache = _dynamic_cache_class()()
    _require_layers(cache).extend(_filled_layer(k, v) for k, v in layers)
    return cache


def caches_equal(a: Sequence[LayerKV], b: Sequence[LayerKV]) -> bool:
    """Bit-for-bit equality of two caches' tensors (same layers, shapes, dtypes, values)."""
    if len(a) != len(b):
        return False
    for (ka, va), (kb, vb) in zip(a, b):
        for x, y in ((ka, kb), (va, vb)):
            if x.shape != y.shape or x.dtype != y.dtype:
                return False
            if not bool((x.cpu() == y.cpu()).all()):
                return False
    return True


@functools.lru_cache(maxsize=1)
def _layerwise_ready_class() -> type:
    base = _dynamic_cache_class()

    class LayerwiseReadyCache(base):  # type: ignore[misc, valid-type]
        """A DynamicCache whose layers are still being copied in, layer 0 first.

        ``get_seq_length`` and the mask only read shapes, so the model can start at once; the
        first thing that reads layer i's values is its ``update``, which makes the compute stream
        wait for layer i's event. So the new turn's embedding and the attention of layers
        0..i-1 run while layers i.. are still on the link.
        """

        def update(self, key_states: Any, value_states: Any, layer_idx: int, *args: Any,
                   **kwargs: Any) -> Any:
            event = self._pending.pop(layer_idx, None)
            if event is not None:
                self._rt.compute_waits(event)
            return super().update(key_states, value_states, layer_idx, *args, **kwargs)

    return LayerwiseReadyCache


def make_layerwise_ready_cache(layers: Sequence[LayerKV], ready: Sequence[Any],
                               rt: Any) -> Any:
    """A cache over ``layers`` whose layer i may be used only once ``ready[i]`` (a CUDA event, or
    None when already there) has fired; see ``LayerwiseReadyCache``."""
    cache = _layerwise_ready_class()()
    _require_layers(cache).extend(_filled_layer(k, v) for k, v in layers)
    cache._pending = {i: e for i, e in enumerate(ready) if e is not None}
    cache._rt = rt
    return cache


def wait_all_layers(cache: Any, rt: Any) -> None:
    """Make the compute stream wait for every layer still pending (e.g. before decode reads a
    layer that the prefill never touched)."""
    pending = getattr(cache, "_pending", None) or {}
    for event in pending.values():
        rt.compute_waits(event)
    pending.clear()
