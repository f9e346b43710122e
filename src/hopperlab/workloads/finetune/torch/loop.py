"""The training loop: warm-up steps, then measured steps inside the profiler's capture window.

A step is: wait for the loader's batch (``data.wait``), copy it to the device, forward and
backward under the step's techniques (activation offload hooks), the optimizer step, and the
loss read back (``.item()``: the synchronisation that makes the host-clock step time cover the
GPU's work). Step time runs from asking for the batch to the loss on the host, so the data wait
is part of it and the data-wait fraction is ``wait / step time``.

Each step also reports how long its phases took on the device's timeline (``forward_s``,
``backward_s``, ``optimizer_s``: CUDA events on the compute stream, read after the step's
synchronisation, so no extra wait; the host clock without CUDA): where a technique's cost lands.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from typing import Any, Callable, Iterator

from hopperlab.assets.dolly import IGNORE_INDEX
from hopperlab.cuda.nvtx import BACKWARD, FORWARD, OPTIMIZER, STEP, measured_region, nvtx_range
from hopperlab.workloads.finetune.metrics import StepRecord

Batch = dict[str, Any]


def to_device(batch: Batch, device: Any) -> Batch:
    """Inputs on ``device``, without the attention mask where causal attention alone gives the
    same loss (``causal_mask_suffices``): transformers then calls SDPA with ``is_causal=True``
    and no mask, which lets flash attention skip the masked half of every product; with a
    padding mask it gets a [batch, 1, seq, seq] mask and computes the whole square (3.3x the
    kernel time of megatron-core's causal call on an H200 at 4 x 2048)."""
    mask = batch.get("attention_mask")
    out = {"input_ids": batch["input_ids"].to(device, non_blocking=True),
           "labels": batch["labels"].to(device, non_blocking=True)}
    if mask is not None and not causal_mask_suffices(mask, batch["labels"]):
        out["attention_mask"] = mask.to(device, non_blocking=True)
    return out


def causal_mask_suffices(mask: Any, labels: Any) -> bool:
    """Whether dropping this padding mask leaves the causal-LM loss as it is: every row is
    ones then zeros (right padding, or no padding) and every padded position's label is
    ignored. A real token then never attends to a pad (pads come after it, and causal
    attention looks back only), and a pad's output predicts only ignored labels (the next
    position is a pad too), so no loss term and no gradient changes. Left padding, holes or
    labelled pads keep the mask. ``mask`` and ``labels`` are the loader's host tensors."""
    keep = mask.bool()
    if bool(keep.all()):
        return True
    ones_then_zeros = bool((keep[:, 1:] <= keep[:, :-1]).all())
    return ones_then_zeros and bool((labels[~keep] == IGNORE_INDEX).all())


class PhaseClock:
    """Marks between a step's phases; ``durations()`` once the step has synchronised."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self._marks: list[tuple[str, Any]] = []

    def mark(self, name: str) -> None:
        if self.cuda:
            import torch

            self._marks.append((name, torch.cuda.current_stream().record_event(
                torch.cuda.Event(enable_timing=True))))
        else:
            self._marks.append((name, time.perf_counter()))

    def durations(self) -> dict[str, float]:
        """Seconds from each mark to the next, keyed ``<mark>_s``."""
        out: dict[str, float] = {}
        for (name, start), (_, end) in zip(self._marks, self._marks[1:]):
            out[f"{name}_s"] = start.elapsed_time(end) / 1e3 if self.cuda else end - start
        return out


def forward_backward(model: Any, inputs: Batch, forward_context: Callable[[], Any],
                     clock: PhaseClock | None = None) -> Any:
    """Loss of one batch and its gradients (accumulated into ``.grad``); returns the loss.

    ``forward_context()`` is entered around the forward only: saved-tensor hooks (activation
    offload) must see what forward saves, not what backward's recomputation saves again."""
    clock = clock or PhaseClock(cuda=False)
    clock.mark("forward")
    with forward_context():
        with nvtx_range(FORWARD):
            loss = model(**inputs).loss
    clock.mark("backward")
    with nvtx_range(BACKWARD):
        loss.backward()
    return loss


def trainable_grad_norm(model: Any) -> Any:
    """The L2 norm of every trainable parameter's gradient, as a 0-d tensor (read after the
    step's synchronisation): compared with the baseline's step by step (issue 47), a backward
    that did not run, or ran on wrong saved tensors, shows at its first step."""
    import torch

    grads = [p.grad for p in model.parameters() if p.requires_grad and p.grad is not None]
    if not grads:
        return torch.zeros(())
    return torch.linalg.vector_norm(torch.stack([n.float() for n in torch._foreach_norm(grads)]))


def _profiler(kind: str, cuda: bool, trace_path: Callable[[], Any]) -> Any:
    if kind != "torch":
        return nullcontext(None)
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    return profile(activities=activities, record_shapes=False, profile_memory=False)


def train(model: Any, optimizer: Any, batches: Iterator[tuple[Batch, float]], *, device: Any,
          warmup_steps: int, measured_steps: int, techniques: Any, profiler: str = "none",
          cuda: bool = False, on_step: Callable[[StepRecord], None] | None = None,
          trace_path: Callable[[], Any] | None = None,
          on_measure_start: Callable[[], None] | None = None,
          census: Callable[[Callable[[], Any]], Callable[[], Any]] | None = None,
          ) -> list[StepRecord]:
    """Run warm-up then measured steps; return every step's record (``measured`` marks them).

    ``census`` (``SavedTensorCensus.observe``) wraps the forward context of one extra step run
    after warm-up and before ``on_measure_start``: unmeasured (``extra["census"] = 1``), so
    neither its hooks' cost nor its memory enters the measured figures.
    ``on_measure_start`` runs between the two phases (e.g. to reset peak-memory counters);
    ``profiler: torch`` wraps the measured steps in torch.profiler and writes its Chrome trace
    to ``trace_path()``.
    """
    records: list[StepRecord] = []
    model.train()

    def one(step: int, measured: bool, census_context: Callable[[], Any] | None = None) -> None:
        t0 = time.perf_counter()
        batch, wait = next(batches)
        with nvtx_range(STEP):
            inputs = to_device(batch, device)
            clock = PhaseClock(cuda)
            loss = forward_backward(model, inputs, census_context or techniques.forward_context,
                                    clock)
            grad_norm = trainable_grad_norm(model)  # issue 47: a skipped backward reads 0
            clock.mark("optimizer")
            with nvtx_range(OPTIMIZER):
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            clock.mark("end")
            value = float(loss.detach().float().item())
        elapsed = time.perf_counter() - t0
        rec = StepRecord(step=step, loss=value, step_s=elapsed, data_wait_s=wait,
                         tokens=int(inputs["input_ids"].numel()), measured=measured,
                         extra={**clock.durations(), **techniques.step_stats(),
                                "attention_mask_passed": float("attention_mask" in inputs),
                                "grad_norm": float(grad_norm.item()),
                                **({"census": 1.0} if census_context else {})})
        records.append(rec)
        if on_step is not None:
            on_step(rec)

    for step in range(warmup_steps):
        one(step, False)
    if census is not None:
        warmup_steps += 1
        one(warmup_steps - 1, False, census(techniques.forward_context))
    if on_measure_start is not None:
        on_measure_start()
    with measured_region(), _profiler(profiler, cuda, trace_path) as prof:
        for step in range(warmup_steps, warmup_steps + measured_steps):
            one(step, True)
    if prof is not None and trace_path is not None:
        prof.export_chrome_trace(str(trace_path()))
    return records
