"""Two known third-party log lines dropped at their loggers, so that a run's output says what matters.

Why: every job that imports torchao printed "Failed to load .../torchao/_C_mxfp8...so" (and
``_C_cutlass_90a``): kernels built for another Python or CUDA than this machine's, which no
hopperlab code path uses (FP8 training runs on ``torch._scaled_mm``). torch >= 2.12 logs, for
each Enum torchao registers with pytree, that ``register_constant()`` on Enums is deprecated.
Both repeat in every job log and terminal and read like faults. Only these messages are
dropped; every other record of those loggers passes. Nothing here imports torch or torchao.
"""

from __future__ import annotations

import logging

#: logger name -> the message fragments dropped from it (both must match)
KNOWN_NOISE: dict[str, tuple[str, ...]] = {
    "torchao": ("Failed to load", "torchao/_C"),
    "torch.utils._pytree": ("is an Enum subclass", "register_constant()"),
}


class _DropKnown(logging.Filter):
    def __init__(self, fragments: tuple[str, ...]) -> None:
        super().__init__()
        self.fragments = fragments

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        return not all(f in text for f in self.fragments)


def silence_known_noise() -> None:
    """Attach the filters (once per process; before or after the libraries are imported)."""
    for name, fragments in KNOWN_NOISE.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropKnown) for f in logger.filters):
            logger.addFilter(_DropKnown(fragments))
