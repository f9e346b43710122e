"""The measured window, announced to whoever listens: the seam every family already opens.

Families mark the part of a run their figures come from with ``measured_region()``
(``cuda/nvtx.py``), which synchronises the device and then opens this window; a family may also
open a named window of its own (``window("duckdb")``: the database family's CPU peer). The
runner's energy meter listens (``listening``), so that every family's run carries its energy
without the families knowing about meters. No listener: every call costs one list check.

A listener is ``listener(event, name)`` with ``event`` ``"start"`` or ``"end"``. A listener that
raises never breaks the run: the error is kept (``errors()``) for the record to say.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

#: the window ``measured_region()`` opens
MEASURED = "measured"

Listener = Callable[[str, str], None]

_listeners: list[Listener] = []
_errors: list[str] = []


def announce(event: str, name: str) -> None:
    """Tell every listener that window ``name`` starts or ends (``event``)."""
    for listener in list(_listeners):
        try:
            listener(event, name)
        except Exception as exc:  # noqa: BLE001 - a meter never takes the run down
            _errors.append(f"{event} {name}: {type(exc).__name__}: {exc}")


@contextmanager
def window(name: str = MEASURED) -> Iterator[None]:
    """Window ``name`` around the block (the caller synchronises the device first)."""
    announce("start", name)
    try:
        yield
    finally:
        announce("end", name)


@contextmanager
def listening(listener: Listener) -> Iterator[None]:
    """``listener`` hears every window opened inside the block."""
    _listeners.append(listener)
    try:
        yield
    finally:
        _listeners.remove(listener)


def errors() -> list[str]:
    """What listeners raised since the last call (then forgotten)."""
    out = list(_errors)
    _errors.clear()
    return out
