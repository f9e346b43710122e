"""What a secret looks like, and how it is taken out of text: one place for every caller.

Secrets (the Hugging Face token, MLflow credentials) come from the environment only
(ARCHITECTURE.md, "Secrets and safety"); what is written or shown (errors, logs, MLflow tags,
params and artifacts, ``spec.json``) goes through ``scrub`` or ``redact_uri`` first. The asset
fetcher and the tracking client each had their own scrubber, each blind to the other's secret:
a token in an MLflow error, a ``user:password@`` URL in a hub error.
"""

from __future__ import annotations

import os
import re
from urllib.parse import urlsplit, urlunsplit

#: the environment variables that hold secrets (the submitting side needs them; a job never)
SECRET_ENV = ("MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_USERNAME",
              "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_TOKEN")
#: shown instead of a secret's value
MASK = "***"
#: a value shorter than this is not replaced (a one-letter user name would mask every such letter)
MIN_SECRET_CHARS = 4

_USERINFO = re.compile(r"(?<=://)[^/@\s]+@")


def redact_uri(uri: str) -> str:
    """``uri`` without ``user:password@`` (and without a trailing slash): what may be written."""
    uri = str(uri).strip()
    try:
        parts = urlsplit(uri)
    except ValueError:
        return uri
    if parts.scheme in ("http", "https") and ("@" in parts.netloc):
        netloc = parts.netloc.rsplit("@", 1)[1]
        parts = parts._replace(netloc=netloc)
        uri = urlunsplit(parts)
    return uri.rstrip("/") if parts.scheme in ("http", "https") else uri


def scrub(text: str) -> str:
    """``text`` without any URL's ``user:password@`` and without the value of any secret the
    environment holds now (``SECRET_ENV``), each replaced by ``***``."""
    text = _USERINFO.sub("", str(text))
    for name in SECRET_ENV:
        value = os.environ.get(name) or ""
        if len(value) >= MIN_SECRET_CHARS:
            text = text.replace(value, MASK)
    return text
