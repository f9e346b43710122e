"""The tokens an inference model generated, counted where they are made (the prefill gives each
sequence's first token, decode the rest) and split by whether the measured energy window was
open: what a run's ``measured_generated_tokens`` / ``measured_first_tokens`` must equal."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from hopperlab.core.window import MEASURED, listening


class TokensByWindow:
    """Wraps ``module``'s ``prefill`` (``prefill_logits`` too) and ``decode`` (monkeypatched)
    and counts their tokens by the window's state; ``listen()`` follows the measured window's
    start and end events."""

    def __init__(self, monkeypatch: Any, module: Any) -> None:
        self.events: list[str] = []
        self.tokens = {True: 0, False: 0}   # by whether the window was open
        self.firsts = {True: 0, False: 0}
        real_prefill, real_decode = getattr(module, "prefill", None), module.decode

        def prefill(model, ids, cache):
            first = real_prefill(model, ids, cache)
            self.tokens[self.is_open()] += first.numel()
            self.firsts[self.is_open()] += first.numel()
            return first

        def decode(model, first, cache, steps):
            out = real_decode(model, first, cache, steps)
            self.tokens[self.is_open()] += out.numel() - first.numel()  # the first: prefill's
            return out

        if real_prefill is not None:
            monkeypatch.setattr(module, "prefill", prefill)
        monkeypatch.setattr(module, "decode", decode)
        real_logits = getattr(module, "prefill_logits", None)
        if real_logits is not None:  # a prefill whose logits the caller keeps (issue 47)
            def prefill_logits(model, ids, cache):
                logits = real_logits(model, ids, cache)
                self.tokens[self.is_open()] += logits.shape[0]
                self.firsts[self.is_open()] += logits.shape[0]
                return logits

            monkeypatch.setattr(module, "prefill_logits", prefill_logits)

    def is_open(self) -> bool:
        return bool(self.events) and self.events[-1] == "start"

    def listen(self) -> AbstractContextManager:
        return listening(lambda event, name: self.events.append(event)
                         if name == MEASURED else None)
