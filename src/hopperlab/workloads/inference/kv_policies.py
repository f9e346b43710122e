"""What happens to an idle session's KV cache: the three policies of the kv-cache study.

* ``resident``: every cache stays in GPU memory (where it fits: running out is an ``oom`` result).
* ``offload``: at most ``capacity`` caches stay on the GPU (least recently used leave first); an
  evicted cache moves to host memory (``PinnedHostStore``, or ``ManagedStore`` under
  ``memory: managed``) and comes back on resume, layer by layer when ``layered``.
* ``recompute``: the same capacity, but an evicted cache is dropped; on resume the session's whole
  history is prefilled again together with the new turn.

The dialogue asks ``resume(session)`` before a round and gives the cache back with
``park(session, cache)`` after it; the policy owns every cache in between.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from hopperlab.workloads.inference.kv_cache import cache_nbytes, layer_tensors
from hopperlab.workloads.inference.layered_reload import Reload


@dataclass
class Resumed:
    #: the cache to run the new turn on (None: start from an empty cache)
    cache: Any
    #: the reload under way, when the cache comes back from host memory
    reload: Reload | None = None
    #: True when the session's history must be prefilled again (its cache was dropped)
    recompute: bool = False


class KvCachePolicy:
    def __init__(self, name: str, capacity: int | None, store: Any = None,
                 layered: bool = True) -> None:
        if name == "offload" and store is None:
            raise ValueError("the offload policy needs a host store")
        self.name = name
        self.capacity = None if name == "resident" else capacity
        self.store = store if name == "offload" else None
        self.layered = layered
        self._gpu: OrderedDict[int, Any] = OrderedDict()
        self._away: dict[int, Any] = {}
        self.evictions = 0

    def resume(self, session: int, has_history: bool) -> Resumed:
        if session in self._gpu:
            return Resumed(cache=self._gpu.pop(session))
        if session in self._away:
            reload = self.store.load(self._away.pop(session), self.layered)
            return Resumed(cache=reload.cache, reload=reload)
        return Resumed(cache=None, recompute=has_history)

    def park(self, session: int, cache: Any) -> None:
        """The round is over: keep the cache, evicting the least recently used beyond capacity."""
        self._gpu[session] = cache
        self._gpu.move_to_end(session)
        while self.capacity is not None and len(self._gpu) > self.capacity:
            old, old_cache = self._gpu.popitem(last=False)
            self.evictions += 1
            if self.store is not None:
                self._away[old] = self.store.save(layer_tensors(old_cache))

    def end(self, session: int) -> None:
        """The conversation is over: forget its cache wherever it is."""
        self._gpu.pop(session, None)
        away = self._away.pop(session, None)
        if away is not None:
            self.store.drop(away)

    def gpu_cache_bytes(self) -> int:
        return sum(cache_nbytes(layer_tensors(c)) for c in self._gpu.values())

    def host_bytes(self) -> int:
        return self.store.held_bytes if self.store is not None else 0
