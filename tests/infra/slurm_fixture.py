"""Pytest plugin: a real Slurm cluster, started once per session by slurm_cluster.sh: two nodes
where a network namespace can be made (the second slurmd in its own), else one.

Use the session fixture ``slurm_cluster`` (a :class:`SlurmCluster`). The cluster needs root and the
Debian packages (installed with apt-get when missing); when that is impossible the fixture skips,
unless ``HOPPERLAB_REQUIRE_SLURM=1`` (CI) turns the skip into a failure so a broken setup cannot pass
silently.

Only one cluster fits on a machine (fixed ports, /etc/slurm links), so sessions take an exclusive lock
for the cluster's lifetime; whoever holds it knows any other running test cluster is a crashed leftover.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shlex
import shutil
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("slurm_cluster.sh")
REQUIRE_ENV = "HOPPERLAB_REQUIRE_SLURM"
# Fixed default so a crashed session's daemons, pid files and MariaDB datadir are found and reused.
DIR_ENV = "HOPPERLAB_SLURM_DIR"
DEFAULT_DIR = "/tmp/hopperlab-slurm"
LOCK_PATH = Path("/run/lock" if Path("/run/lock").is_dir() else "/tmp") / "hopperlab-slurm.lock"
LOCK_TIMEOUT_S = float(os.environ.get("HOPPERLAB_SLURM_LOCK_TIMEOUT", "900"))
SLURM_LINK = Path("/etc/slurm/slurm.conf")
BINARIES = ("munged", "mariadbd", "slurmdbd", "slurmctld", "slurmd", "sbatch", "sacct")

SACCT_FIELDS = (
    "JobID", "JobName", "Partition", "State", "ExitCode", "Elapsed", "Timelimit",
    "NodeList", "AllocTRES", "Start", "End",
)  # fmt: skip
# sacct states after which a job never runs again ("CANCELLED by 0" is matched by prefix).
FINAL_STATES = (
    "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL",
    "BOOT_FAIL", "DEADLINE",
)  # fmt: skip


@dataclass(frozen=True)
class SlurmCluster:
    """Handle on the running test cluster.

    ``env`` holds only the cluster's variables (SLURM_CONF); merge it into ``os.environ`` (as
    ``run`` does) or set it with ``monkeypatch.setenv`` before libraries like submitit call sbatch.
    """

    dir: Path
    conf: Path
    env: dict[str, str]
    partition: str = "debug"
    #: the cluster's node names, this host's first
    nodes: tuple[str, ...] = ()
    #: the interface both nodes reach each other on (GLOO_SOCKET_IFNAME of a two-node job)
    ifname: str | None = None

    def need_two_nodes(self) -> None:
        """Skip (or fail, under HOPPERLAB_REQUIRE_SLURM=1) a test that needs the second node."""
        if len(self.nodes) < 2:
            _unavailable(f"the cluster has one node ({', '.join(self.nodes)}): no network "
                         f"namespace for a second slurmd here")

    def kill_node(self) -> None:
        """The second node dies: its slurmd and its jobs' processes get SIGKILL."""
        proc = _script("kill-node", str(self.dir), timeout=60)
        if proc.returncode != 0:
            raise RuntimeError(_failure("slurm_cluster.sh kill-node", proc))

    def start_node(self) -> None:
        """The second node's slurmd again, until the node is idle."""
        proc = _script("start-node", str(self.dir), timeout=240)
        if proc.returncode != 0:
            raise RuntimeError(_failure("slurm_cluster.sh start-node", proc))

    def run(
        self, cmd: str | Sequence[str], *, timeout: float = 60, check: bool = False, **kwargs
    ) -> subprocess.CompletedProcess[str]:
        """Run a command (list, or a string split like a shell would) with the cluster's env; text output."""
        args = shlex.split(cmd) if isinstance(cmd, str) else list(cmd)
        env = {**os.environ, **self.env, **kwargs.pop("env", {})}
        return subprocess.run(
            args, env=env, capture_output=True, text=True, timeout=timeout, check=check, **kwargs
        )

    def sacct(self, job_id: int | str) -> list[dict[str, str]]:
        """Accounting rows of a job: the allocation first, then its steps (batch, extern, 0, ...)."""
        out = self.run(
            ["sacct", "-j", str(job_id), "--parsable2", "--format=" + ",".join(SACCT_FIELDS)],
            check=True,
        ).stdout
        lines = out.splitlines()
        if not lines:
            return []
        header = lines[0].split("|")
        return [dict(zip(header, line.split("|"))) for line in lines[1:] if line]

    def wait(self, job_id: int | str, timeout: float = 120, poll: float = 0.5) -> dict[str, str]:
        """Poll sacct until the job reaches a final state; return its allocation row.

        A job that ends within a second can show up in sacct as finished before its start record
        is stored (Partition still empty), so that counts as not yet finished.
        """
        deadline = time.monotonic() + timeout
        row: dict[str, str] = {}
        while True:
            rows = [r for r in self.sacct(job_id) if r["JobID"] == str(job_id)]
            row = rows[0] if rows else {}
            if row.get("State", "").startswith(FINAL_STATES) and row.get("Partition"):
                return row
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} not finished after {timeout}s: {row or 'not in sacct'}")
            time.sleep(poll)


    @contextlib.contextmanager
    def accounting_down(self) -> Iterator[None]:
        """slurmdbd stopped (sacct fails, jobs still run) for the block; started again after."""
        proc = _script("stop-dbd", str(self.dir), timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(_failure("slurm_cluster.sh stop-dbd", proc))
        try:
            yield
        finally:
            proc = _script("start-dbd", str(self.dir), timeout=120)
            if proc.returncode != 0:
                raise RuntimeError(_failure("slurm_cluster.sh start-dbd", proc))


def _unavailable(reason: str) -> None:
    """Skip, or fail when the environment demands a real cluster (so CI cannot skip silently)."""
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"Slurm cluster required ({REQUIRE_ENV}=1) but unavailable: {reason}", pytrace=False)
    pytest.skip(f"Slurm cluster unavailable: {reason}")


def _script(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def _failure(what: str, proc: subprocess.CompletedProcess[str]) -> str:
    return f"{what} failed (rc={proc.returncode}):\n{proc.stderr[-4000:]}"


def _acquire_lock() -> int:
    """Exclusive machine-wide lock, held until the session ends; released by the kernel on a crash."""
    fd = os.open(LOCK_PATH, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + LOCK_TIMEOUT_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() > deadline:
                os.close(fd)
                pytest.fail(f"another test session held {LOCK_PATH} for {LOCK_TIMEOUT_S:.0f}s", pytrace=False)
            time.sleep(1)


def _stop_leftover_cluster(our_dir: Path) -> None:
    """A cluster from another DIR that runs while we hold the lock was left by a crashed session."""
    if not SLURM_LINK.is_symlink():
        return
    other = Path(os.readlink(SLURM_LINK)).parent.parent
    if other != our_dir and (other / "run").is_dir():
        _script("stop", str(other), timeout=120)


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """Start the cluster once per session (installing packages if needed); stop it at session end."""
    if os.geteuid() != 0:
        _unavailable("not running as root")
    if not all(shutil.which(b) for b in BINARIES) and shutil.which("apt-get") is None:
        _unavailable("Slurm packages are missing and apt-get is not available")

    cluster_dir = Path(os.environ.get(DIR_ENV, DEFAULT_DIR)).resolve()
    lock_fd = _acquire_lock()
    started = False
    try:
        _stop_leftover_cluster(cluster_dir)
        proc = _script("install", timeout=1200)
        if proc.returncode != 0:
            pytest.fail(_failure("slurm_cluster.sh install", proc), pytrace=False)
        started = True  # a failed start may leave some daemons running: stop them below
        proc = _script("start", str(cluster_dir), timeout=300)
        if proc.returncode != 0:
            pytest.fail(_failure(f"slurm_cluster.sh start {cluster_dir}", proc), pytrace=False)
        said = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
        env = {k: v for k, v in said.items() if not k.startswith("HOPPERLAB_")}
        nodes = tuple(n for n in said.get("HOPPERLAB_SLURM_NODES", "").split(",") if n)
        yield SlurmCluster(dir=cluster_dir, conf=Path(env["SLURM_CONF"]), env=env, nodes=nodes,
                           ifname=said.get("HOPPERLAB_SLURM_IFNAME"))
    finally:
        try:
            if started:
                proc = _script("stop", str(cluster_dir), timeout=180)
                if proc.returncode != 0:
                    raise RuntimeError(_failure(f"slurm_cluster.sh stop {cluster_dir}", proc))
        finally:
            os.close(lock_fd)  # releases the flock
