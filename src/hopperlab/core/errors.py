"""Errors shared by the modules that read configuration (kept apart so they import no one)."""


class SpecError(ValueError):
    """A mistake in a config, site, experiments or assets file, or an unknown target.

    The message names the file, the key path and what was expected.
    """


class AssetMissing(RuntimeError):
    """A run needs an asset that was not built (or names no asset for a role); the message
    names the asset and the command that builds it."""
