"""One tree of the errors hopperlab expects, so that the command line can tell them from bugs.

Every error a user can cause or meet (a config mistake, a missing asset, an unreachable
server, a node that lacks a capability) derives from ``HopperlabError``: ``hopperlab`` prints
its message in one line and exits 2. Anything else is a bug and keeps its traceback. Errors
that belong to one technique (``CudaError``, ``Fp8Unavailable``...) are defined beside it and
derive from a class here.
"""

from __future__ import annotations

import reprlib


class HopperlabError(Exception):
    """An expected error: its message says what went wrong and where, for a person."""


class SpecError(HopperlabError, ValueError):
    """A mistake in a config, site, experiments or assets file, or an unknown target.

    The message names the file, the key path and what was expected.
    """


class AssetError(HopperlabError, RuntimeError):
    """An asset could not be fetched, built, verified or repaired."""


class NoNetworkError(AssetError):
    """The source (the Hugging Face Hub) cannot be reached from this machine."""


class AssetMissing(AssetError):
    """A run needs an asset that was not built (or names no asset for a role); the message
    names the asset and the command that builds it."""


class NodeError(HopperlabError, RuntimeError):
    """This node lacks what a run or a command needs (a driver call failed, a runtime or a
    capability is missing)."""


class ResultsError(HopperlabError, RuntimeError):
    """Recorded results cannot be read, uploaded or compared as asked."""


#: the most characters of one value an error message shows
SHOWN_MAX = 100


def shown(value: object, limit: int = SHOWN_MAX) -> str:
    """``repr(value)`` cut to ``limit`` characters with an ellipsis, for error messages.

    A message echoes what the user wrote; a whole file passed as a name, or an expanded YAML
    alias, must not become the message. Containers are summarized by ``reprlib`` so that a
    huge one is never rendered in full.
    """
    if isinstance(value, str):
        text = repr(value[:limit + 1])
    else:
        brief = reprlib.Repr()
        brief.maxlevel, brief.maxstring, brief.maxother = 3, limit, limit
        brief.maxlist = brief.maxtuple = brief.maxdict = brief.maxset = 8
        text = brief.repr(value)
    return clip(text, limit)


def clip(text: str, limit: int = SHOWN_MAX) -> str:
    """``text`` cut to ``limit`` characters, the cut marked by an ellipsis."""
    return text if len(text) <= limit else text[:limit - 1] + "…"


def one_line(exc: BaseException, prefix: str = "hopperlab") -> str:
    """The one line an expected error is printed as: ``hopperlab: config error: <file>: <key>:
    ...``; a message of several lines (a list of choices, two ways out) is joined with "; "."""
    text = "; ".join(part.strip() for part in str(exc).splitlines() if part.strip())
    kind = "config error: " if isinstance(exc, SpecError) else ""
    return f"{prefix}: {kind}{text}"
