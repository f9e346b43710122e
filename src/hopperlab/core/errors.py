"""Errors shared by the modules that read configuration (kept apart so they import no one)."""

import reprlib


class SpecError(ValueError):
    """A mistake in a config, site, experiments or assets file, or an unknown target.

    The message names the file, the key path and what was expected.
    """


class AssetMissing(RuntimeError):
    """A run needs an asset that was not built (or names no asset for a role); the message
    names the asset and the command that builds it."""


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
