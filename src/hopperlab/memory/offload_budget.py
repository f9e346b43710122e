"""The budget policy of activation offload: which saved tensors to offload, and which reloads to
start, so that a step's peak GPU memory stays under ``budget_bytes`` while as little as possible
crosses the host link.

Why apart from the mechanism (``activation_offload``): the hooks and streams move bytes; this
decides from figures (a plan in bytes from the last step, a reserve learned from memory windows
around backward). ``OffloadBudget`` is the base of ``ActivationOffload``: its state lives on the
same object, and the mechanism calls it at the moments of a step (the ``_budget_*`` methods,
``_within_budget``, ``_fits_prefetch``). The policy itself is described in docs/memory.md
("Activation offload: how and the policy").
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from hopperlab.cuda import peaks

#: the budget plan aims this fraction of the budget below it (the allocator's rounding, what
#: the reserve's window did not see)
PLAN_MARGIN = 0.02


class OffloadBudget:
    """Budget bookkeeping and decisions; ``budget_bytes=None`` offloads every eligible tensor."""

    # -- what the mechanism provides ------------------------------------------------------
    device: torch.device
    cuda: bool
    _stats: Any                      # this step's OffloadStats (bytes_offloaded, bytes_kept)
    _inflight_bytes: int             # device->host copies issued and not seen to be over
    _head_group: int | None          # the first group after the last layer (wrap_layers)

    def _throttle(self) -> None:
        """Let lagging device->host copies finish (their memory is then free to reuse)."""
        raise NotImplementedError

    def _group_bytes(self, group: int) -> int:
        """Bytes of ``group``'s offloaded tensors still held."""
        raise NotImplementedError

    # -- state -------------------------------------------------------------------------------
    def _init_budget(self, budget_bytes: int | None, reserve_bytes: int,
                     memory_probe: Callable[[], int] | None) -> None:
        self.budget_bytes = budget_bytes
        self.reserve_bytes = reserve_bytes
        self._memory_probe = memory_probe or (self._cuda_allocated if self.cuda else self._kept_bytes)
        self._learned_reserve = 0                 # from steps that followed a plan
        self._warmup_reserve = 0                  # from the first (everything offloaded)
        self._planned_measured = False            # a planned step has measured its need
        self._use_planned = False                 # ... and a step has begun since
        self._layer_window: int | None = None     # the backward group being measured
        self._layer_window_start = 0
        self._layer_transient = 0                 # most a layer's backward rose above its start
        self._alloc_at_forward_end: int | None = None
        self._deciding_bytes = 0
        self._eligible_bytes = 0                    # offloadable bytes saved this step
        self._last_eligible_bytes = 0               # and in the last step
        self._last_offloaded = 0
        self._plan_bytes: int | None = None
        self._inflight_at_forward_end = 0
        self._window_open = False

    # -- the moments of a step (called by the mechanism) -----------------------------------
    def _budget_step_begins(self) -> None:
        """Forward is about to start: close what the last step left open, make this step's
        plan."""
        self._close_window()
        # the lowest layer's window ran on into the optimizer's step: not a layer's need
        self._layer_window = None
        self._use_planned = self._planned_measured   # a whole planned step has been measured
        if self.cuda and self.budget_bytes is not None:
            peaks.start_window(self.device)       # forward's own peak, for the reserve
        self._plan_bytes = self._make_plan()
        self._eligible_bytes = 0

    def _budget_figures(self) -> dict[str, int]:
        """The policy's figures of this step, for its stats."""
        return {"reserve_bytes": self._reserve(), "plan_bytes": self._plan_bytes or 0,
                "transient_bytes": self._layer_transient}

    def _budget_keeps(self, nbytes: int) -> bool:
        """Whether an eligible saved tensor of ``nbytes`` stays on the device: with a plan from
        the last step, offload until the plan's bytes are reached, then keep unless memory
        already passes the budget; without one (first step), offload."""
        self._eligible_bytes += nbytes
        self._deciding_bytes = nbytes
        if self.budget_bytes is None or self._plan_bytes is None:
            return False
        if self._stats.bytes_offloaded < self._plan_bytes:
            return False
        if not self._within_budget():
            # over the budget past the plan: copies that lag hold memory; offloading more
            # would add to them, waiting for them frees it
            self._throttle()
        return self._within_budget()

    def _budget_forward_ends(self) -> None:
        """Forward is over: what it left allocated, and (CUDA, with a budget) its own peak above
        that; the reserve's window opens."""
        self._last_eligible_bytes = self._eligible_bytes
        self._last_offloaded = self._stats.bytes_offloaded
        if self.cuda:
            self._alloc_at_forward_end = peaks.allocated_now(self.device)
            # offloaded, yet still allocated (held until their copies are seen to be over):
            # counted in both figures
            self._inflight_at_forward_end = self._inflight_bytes
            if self.budget_bytes is not None:
                # forward may peak above its end (the loss's logits, copies still in flight)
                self._learn_reserve(peaks.window_peak_allocated(self.device)
                                    - self._alloc_at_forward_end)
                peaks.start_window(self.device)
                self._window_open = True
        else:
            self._deciding_bytes = 0
            self._alloc_at_forward_end = self._memory_probe()

    def _budget_backward_reaches(self, group: int) -> bool:
        """Backward unpacks a tensor of ``group``: close the reserve's window once below the last
        layer; returns whether a new layer's window starts (``_budget_layer_starts``)."""
        last_layer = None if self._head_group is None else self._head_group - 1
        if self._window_open and last_layer is not None and group < last_layer:
            self._close_window()          # backward is done with the last layer
        new_layer = self.cuda and self.budget_bytes is not None and not self._window_open \
            and group != self._layer_window
        if new_layer:
            self._close_layer_window()
            peaks.start_window(self.device)
        return new_layer

    def _budget_layer_starts(self, group: int) -> None:
        """From here (this unpack's reloads included) to the next layer's first unpack."""
        self._layer_window, self._layer_window_start = group, self._memory_probe()

    def _window_holds(self, group: int) -> bool:
        """No layer below the last is reloaded while the reserve's window is open."""
        last_layer = None if self._head_group is None else self._head_group - 1
        return self._window_open and last_layer is not None and group < last_layer

    def _budget_reload_starts(self) -> None:
        if self._window_open and self._head_group is None:
            self._close_window()          # no layers marked: the window ends at the first reload

    # -- figures -------------------------------------------------------------------------------
    def _cuda_allocated(self) -> int:
        return peaks.allocated_now(self.device)

    def _kept_bytes(self) -> int:
        # the CPU stand-in for memory_allocated(): what this step kept, plus the tensor being
        # decided on (on CUDA it is already allocated, so memory_allocated() counts it)
        return self._stats.bytes_kept + self._deciding_bytes

    def _reserve(self) -> int:
        learned = self._learned_reserve if self._use_planned else self._warmup_reserve
        return learned + self.reserve_bytes

    def _learn_reserve(self, need: int) -> None:
        """Keep the largest need seen; what the first step (everything offloaded, a different
        memory picture) measured serves only until a planned step has measured its own."""
        if self._plan_bytes is None:
            self._warmup_reserve = max(self._warmup_reserve, need)
        else:
            self._learned_reserve = max(self._learned_reserve, need)
            self._planned_measured = True

    def _close_window(self) -> None:
        """Backward's need at its start, beyond forward's end (CUDA, with a budget): the peak of
        the window opened at forward's end, closed when backward is done with the last layer
        (the loss's temporaries, and the last layer's backward: with a chunked loss that is the
        larger); no layer further down is reloaded while it is open."""
        if not self._window_open:
            return
        self._window_open = False
        peak = peaks.window_peak_allocated(self.device)
        if self._alloc_at_forward_end is not None:
            self._learn_reserve(peak - self._alloc_at_forward_end)

    def _close_layer_window(self) -> None:
        """A layer's backward allocates its gradients and temporaries before it frees what it
        had saved: the most it rose above its start (reloads started later inside it count:
        an over-estimate) is the room a prefetch must leave."""
        if self._layer_window is None:
            return
        self._layer_window = None
        self._layer_transient = max(self._layer_transient, peaks.window_peak_allocated(
            self.device) - self._layer_window_start)

    def _make_plan(self) -> int | None:
        """How many bytes to offload this step, from the last step's figures: the memory at the
        end of forward had nothing been offloaded is what was allocated then plus what was
        offloaded, less what was both (copies still running at forward's end: counting them
        twice made every step offload more than the last, up to everything); the excess over
        98% of the budget (with the reserve). The mechanism takes them from the first saved
        tensors on: the earliest layers, whose copies overlap the rest of forward and whose
        reloads have the whole backward to hide in."""
        if self.budget_bytes is None or self._alloc_at_forward_end is None:
            return None
        if not self._last_eligible_bytes:
            return None
        all_kept = self._alloc_at_forward_end + self._last_offloaded - \
            self._inflight_at_forward_end
        need = all_kept + self._reserve() - self.budget_bytes * (1 - PLAN_MARGIN)
        return max(0, int(need))

    def _within_budget(self) -> bool:
        if self.budget_bytes is None:
            return False
        return self._memory_probe() + self._reserve() <= self.budget_bytes

    def _fits_prefetch(self, group: int) -> bool:
        """A reload under a budget leaves room for the larger of the reserve and the most a
        layer's backward rose above its start."""
        if self.budget_bytes is None or not self.cuda:
            return False
        room = max(self._reserve(), self._layer_transient + self.reserve_bytes)
        return self._memory_probe() + self._group_bytes(group) + room <= self.budget_bytes
