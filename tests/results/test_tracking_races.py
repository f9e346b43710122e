"""Client-side races of the upload (issue 46, D30): ``hopperlab submit`` imports MLflow in a
thread while its job runs; a job that ends before that import does (a skipped run) must not
have its upload import MLflow beside it (two threads importing MLflow at once load its protobuf
descriptors twice). An error of MLflow's client in this process is said to be one, not "MLflow
refused"."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from hopperlab.results.tracking import client
from hopperlab.results.tracking.client import TrackingError, translate_errors
from tests.helpers import REPO

SERVER = "http://127.0.0.1:9"


def test_an_upload_waits_for_the_background_import_of_mlflow(monkeypatch):
    """The import held half-way (deterministically): the upload's MLflow calls begin only once
    it is done, never beside it."""
    started, release, entered = threading.Event(), threading.Event(), threading.Event()

    def held_import() -> None:
        started.set()
        release.wait(30)

    monkeypatch.setattr(client, "_import_mlflow", held_import)
    monkeypatch.setattr(client, "_warm_up", None, raising=False)
    client.warm_up_in_background()
    assert started.wait(30)

    def upload() -> None:
        with translate_errors(SERVER):
            entered.set()

    uploader = threading.Thread(target=upload, daemon=True)
    uploader.start()
    try:
        assert not entered.wait(0.5), "the upload ran beside the half-done import of MLflow"
    finally:
        release.set()
    uploader.join(30)
    assert entered.is_set()


def test_an_error_of_mlflows_client_is_not_said_to_be_the_server_refusing():
    from mlflow.exceptions import MlflowException, RestException

    with pytest.raises(TrackingError) as err, translate_errors(SERVER):
        raise MlflowException("Unexpected URI scheme 'http' for tracking store")
    assert "refused" not in str(err.value)
    assert str(err.value).startswith("MLflow's client failed in this process (not an answer of "
                                     "the server at http://127.0.0.1:9): MlflowException: ")
    with pytest.raises(TrackingError, match=r"^MLflow at http://127.0.0.1:9 refused: "
                                            r"INVALID_PARAMETER_VALUE: bad key"), \
            translate_errors(SERVER):
        raise RestException({"error_code": "INVALID_PARAMETER_VALUE", "message": "bad key"})


@pytest.mark.integration  # a fresh python importing MLflow: seconds of CPU
def test_an_mlflow_import_right_after_the_warm_up_never_fails():
    """What an upload right after the warm-up does, in a fresh process: on the code before the
    fix it failed most times on a 2-core machine (TypeError from protobuf's descriptor pool)."""
    script = ("from hopperlab.results.tracking import client\n"
              "client.warm_up_in_background()\n"
              f"with client.translate_errors({SERVER!r}):\n"
              "    from mlflow.entities import Metric, Param, RunTag\n"
              "    client.mlflow_client('sqlite:///:memory:')\n"
              "print('imported')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"),
                                                        os.environ.get("PYTHONPATH", "")])}
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                             text=True, timeout=300)
        assert out.returncode == 0 and out.stdout.strip() == "imported", out.stderr[-2000:]
