"""One tree of the errors hopperlab expects, so that the command line can tell them from bugs.

Every error a user can cause or meet (a config mistake, a missing asset, an unreachable
server, a node that lacks a capability) derives from ``HopperlabError``: ``hopperlab`` prints
its message in one line and exits 2. Anything else is a bug and keeps its traceback. Errors
that belong to one technique (``CudaError``, ``Fp8Unavailable``...) are defined beside it and
derive from a class here.
"""

from __future__ import annotations


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
