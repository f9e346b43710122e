"""pytest plugin: a real MLflow tracking server in a subprocess.

Fixtures:

* ``mlflow_server`` (session): an :class:`MlflowServer` on a free port of 127.0.0.1 with a
  SQLite backend in a temporary folder. ``.uri`` is its tracking URI; ``.stop()`` and
  ``.start()`` take it down and bring it back on the same port and database (an outage).
* ``mlflow_uri`` (function): the URI of that server, started again if a test left it stopped.

Starting takes 20-30 s on a small machine (MLflow imports a lot and checks the DB schema), so
the server is shared by the whole session and started with one worker.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

START_TIMEOUT_S = float(os.environ.get("HOPPERLAB_MLFLOW_START_TIMEOUT", "120"))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _mlflow_command() -> list[str]:
    exe = shutil.which("mlflow")
    if exe:
        return [exe]
    return [sys.executable, "-m", "mlflow"]


class MlflowServer:
    """``mlflow server`` with a SQLite store under ``root``; stop/start keeps port and DB."""

    def __init__(self, root: Path, port: int | None = None, host: str = "127.0.0.1") -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.host = host
        self.port = port or free_port()
        self.db = self.root / "mlflow.db"
        self.artifacts = self.root / "artifacts"
        self.log_path = self.root / "server.log"
        self.proc: subprocess.Popen | None = None
        self.start_seconds: list[float] = []

    @property
    def uri(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        return _mlflow_command() + [
            "server",
            "--backend-store-uri", f"sqlite:///{self.db}",
            "--default-artifact-root", str(self.artifacts),
            "--host", self.host,
            "--port", str(self.port),
            "--workers", "1",
        ]

    def healthy(self, timeout: float = 2.0) -> bool:
        try:
            return requests.get(self.uri + "/health", timeout=timeout).status_code == 200
        except requests.RequestException:
            return False

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout: float = START_TIMEOUT_S) -> "MlflowServer":
        if self.running and self.healthy():
            return self
        self._wait_port_free()
        env = dict(os.environ)
        # The server must not inherit a client-side tracking URI or our short HTTP settings.
        for name in ("MLFLOW_TRACKING_URI",):
            env.pop(name, None)
        # MLflow 3's job runner (a huey consumer per job type, seven processes polling) serves
        # its GenAI jobs, which no test asks for: each server's would cost CPU the tests need
        env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"
        t0 = time.monotonic()
        log = open(self.log_path, "ab")
        log.write(f"\n=== start {time.ctime()}: {' '.join(self.command())}\n".encode())
        log.flush()
        self.proc = subprocess.Popen(
            self.command(), cwd=self.root, stdout=log, stderr=subprocess.STDOUT, env=env,
            start_new_session=True,  # its own process group: stop() takes the workers too
        )
        log.close()
        deadline = t0 + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited with {self.proc.returncode}:\n"
                                   f"{self.log_tail()}")
            if self.healthy():
                self.start_seconds.append(time.monotonic() - t0)
                return self
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"mlflow server did not answer /health within {timeout:.0f}s:\n"
                           f"{self.log_tail()}")

    def stop(self, timeout: float = 15.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with _suppress():
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=timeout)
        # Workers of the group may outlive the leader for a moment.
        with _suppress():
            os.killpg(proc.pid, signal.SIGKILL)

    def _wait_port_free(self, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind((self.host, self.port))
                    return
                except OSError:
                    time.sleep(0.3)
        raise RuntimeError(f"port {self.port} still busy")

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"


class _suppress:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return exc[0] is not None and issubclass(exc[0], (ProcessLookupError, PermissionError))


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    server = MlflowServer(tmp_path_factory.mktemp("mlflow-server"))
    server.start()
    print(f"\nmlflow server at {server.uri} answered /health after "
          f"{server.start_seconds[-1]:.1f}s")
    yield server
    server.stop()


@pytest.fixture
def mlflow_uri(mlflow_server) -> str:
    """The shared server's URI; started again if an earlier test left it down."""
    if not mlflow_server.healthy():
        mlflow_server.start()
    return mlflow_server.uri
