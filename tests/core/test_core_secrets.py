"""One scrubber in core (issue 31): the asset fetcher's and the tracking client's messages each
missed the other's secret (a token in an MLflow error, a ``user:password@`` URL in a hub error)."""

from __future__ import annotations

from hopperlab.assets import hub
from hopperlab.core import secrets
from hopperlab.results import tracking
from hopperlab.results.tracking import client

URL = "https://alice:s3cret-pw@mlflow.example.org/api"


def test_one_scrubber_removes_both_kinds_of_secret(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_abcdef123456")
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", "mlflow-tok-987")
    text = f"failed at {URL} with hf_abcdef123456 and mlflow-tok-987"
    for scrub in (secrets.scrub, hub.scrub, tracking.scrub, client.scrub):
        clean = scrub(text)
        assert "s3cret-pw" not in clean and "alice" not in clean, scrub
        assert "hf_abcdef123456" not in clean and "mlflow-tok-987" not in clean, scrub
        assert "mlflow.example.org/api" in clean


def test_callers_use_the_core_functions():
    assert hub.scrub is secrets.scrub and client.scrub is secrets.scrub
    assert tracking.redact_uri is secrets.redact_uri
    assert secrets.redact_uri(URL + "/") == "https://mlflow.example.org/api"


def test_short_values_are_not_masked(monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "a")
    assert secrets.scrub("a cat") == "a cat"
