"""Errors of fetching and building assets (config mistakes are ``hopperlab.config.spec.SpecError``)."""

from __future__ import annotations


class AssetError(RuntimeError):
    """An asset could not be fetched, built, verified or repaired."""


class NoNetworkError(AssetError):
    """The source (the Hugging Face Hub) cannot be reached from this machine."""
