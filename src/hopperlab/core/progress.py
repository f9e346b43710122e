"""The one progress bar of the platform (uploads, report charts, downloads, checksums).

Drawn by rich on stderr and transient, so that it never mixes into a command's output and leaves
nothing behind in a log; the caller decides whether a bar is worth showing. rich is imported only
when a bar is drawn; without rich the work runs the same, silently.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator, Sequence, TypeVar

T = TypeVar("T")


@contextmanager
def progress_bar(description: str, total: float | None, *, show: bool = True,
                 unit: str = "") -> Iterator[Callable[[float], None]]:
    """Yield ``advance(n)``: move the bar ``n`` units on (thread-safe). ``unit="B"`` shows bytes
    (sizes and speed, binary units); ``show=False`` draws nothing."""
    if not show:
        yield _nothing
        return
    try:
        from rich.console import Console
        from rich.progress import (BarColumn, DownloadColumn, MofNCompleteColumn, Progress,
                                   TextColumn, TimeRemainingColumn, TransferSpeedColumn)
    except ImportError:  # pragma: no cover - a bar is a nicety
        yield _nothing
        return
    counts = ((DownloadColumn(binary_units=True), TransferSpeedColumn()) if unit == "B"
              else (MofNCompleteColumn(),))
    columns = (TextColumn("{task.description}"), BarColumn(), *counts, TimeRemainingColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(description, total=total)
        yield lambda n: bar.advance(task, n)


def track(items: Sequence[T], description: str, *, show: bool = True) -> Iterator[T]:
    """The items of ``items``, one by one, with a bar counting them."""
    with progress_bar(description, len(items), show=show) as advance:
        for item in items:
            yield item
            advance(1)


def _nothing(n: float) -> None:
    pass
