"""The job's ``python`` where a warm starter runs (``run/warm.py``): have it fork the job.

submitit's local controller starts ``<python> -u -m submitit.core._submit FOLDER`` for each
task. Under a workflow with a warm starter, ``<python>`` is ``python -m hopperlab.run.warm_client
SOCKET``: this process hands its arguments, environment, working folder and stdin/stdout/stderr
to the starter, which forks a child that has already imported torch and transformers (2-4 s of
CPU a job on a 2-core Xeon). This process then stands for the child: the signals it gets
(Ctrl-C, the controller's SIGINT/SIGTERM, submitit's timeout signal) go on to the child, it ends
as the child ended (its exit code, or the same signal: a kernel OOM kill stays a SIGKILL), and
when it is killed itself the child goes too. It imports nothing heavy. Where the starter
cannot take the job (not running, or the job's environment differs where imports read it),
this process becomes plain python, the job as it is started without a starter; why is said on
the job's stderr and in its record (``COLD_ENV``: the runner writes it into hardware.json).

A starter that does not answer (frozen, stopped) is waited for ``REPLY_S`` seconds at most,
then the job starts cold, saying so: never a wait to the job's time limit. The child runs the
job only once this process, having its pid, says "go": a starter that answers after this
process gave up forks a child that ends without running anything.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import struct
import sys
import time
from pathlib import Path
from typing import Any

from hopperlab.node.oom_kills import STAND_IN_FILE

#: where the workflow tells its jobs the starter's socket (cli/workflow.py sets it)
SOCKET_ENV = "HOPPERLAB_WARM_SOCKET"
#: set in a forked job's environment: the pid of the starter it came from
FORKED_ENV = "HOPPERLAB_WARM_FORKED"
#: set in the environment of a job that a starter was asked for but that started cold: why
COLD_ENV = "HOPPERLAB_WARM_COLD"
#: how long the job waits for the starter's answer (seconds; ``REPLY_S_ENV`` overrides it)
REPLY_S = 30.0
REPLY_S_ENV = "HOPPERLAB_WARM_REPLY_S"
#: the signals passed on to the child (SIGKILL cannot be caught: the child sees this process go)
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
             signal.SIGUSR2, signal.SIGCONT)
_HEADER = struct.Struct("!I")


def serves(backend: Any, gpus: int) -> bool:
    """Whether a warm starter can start a job of ``backend`` with ``gpus`` GPUs: a process
    on this host (not in-process, not a scheduler's) with no GPU (CUDA never starts in the
    starter, so forking stays safe)."""
    return gpus == 0 and backend.job_handle == "process" and not backend.in_process


def send_msg(sock: socket.socket, obj: Any, fds: list[int] | None = None) -> None:
    """One message: a length, JSON, and with the first bytes the file descriptors ``fds``."""
    data = json.dumps(obj).encode()
    payload = _HEADER.pack(len(data)) + data
    sent = socket.send_fds(sock, [payload], fds) if fds else sock.send(payload)
    if sent < len(payload):
        sock.sendall(payload[sent:])


def recv_msg(sock: socket.socket, max_fds: int = 0) -> tuple[Any, list[int]] | None:
    """The next message and the descriptors that came with it; None at end of stream."""
    buf = b""
    fds: list[int] = []
    while len(buf) < _HEADER.size:
        if max_fds and not buf:
            chunk, got, _, _ = socket.recv_fds(sock, 65536, max_fds)
            fds.extend(got)
        else:
            chunk = sock.recv(65536)
        if not chunk:
            return None
        buf += chunk
    (size,) = _HEADER.unpack_from(buf)
    while len(buf) < _HEADER.size + size:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        buf += chunk
    return json.loads(buf[_HEADER.size:_HEADER.size + size]), fds


def cold(rest: list[str], why: str | None = None) -> None:
    """Become plain python with the job's arguments (no starter, or it refused the job);
    ``why`` goes to the job's stderr and, through ``COLD_ENV``, into its record."""
    if why:
        print(f"hopperlab: warm start: job started cold: {why}", file=sys.stderr)
        os.environ[COLD_ENV] = why
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, *rest])


def reply_s() -> float:
    """How long to wait for the starter's answer."""
    try:
        value = float(os.environ.get(REPLY_S_ENV) or REPLY_S)
    except ValueError:
        return REPLY_S
    return value if value > 0 else REPLY_S


def _note_child(rest: list[str], child: int) -> None:
    """Name the child in the job's submitit folder (the last argument of ``_submit``): the
    kernel names the process it kills for memory by its pid (node/oom_kills)."""
    try:
        folder = Path(rest[-1])
        (folder / STAND_IN_FILE.format(client=os.getpid())).write_text(f"{child}\n")
    except (OSError, IndexError):
        pass


def _wait_gone(pid: int) -> None:
    """Wait until ``pid`` has ended (the starter that would have told how is gone)."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return
    try:
        select.select([fd], [], [])
    finally:
        os.close(fd)


def _wait_status(sock: socket.socket, child: int) -> Any:
    """The starter's word of how ``child`` ended; None when the starter went, or when it has
    not said so ``reply_s()`` after the child ended (a frozen starter)."""
    try:
        pidfd = os.pidfd_open(child)
    except OSError:
        pidfd = None
    try:
        ready, _, _ = select.select([sock] + ([pidfd] if pidfd is not None else []), [], [])
        if sock not in ready and not select.select([sock], [], [], reply_s())[0]:
            # the child ended and the starter, which reaps it, has not said how
            print(f"hopperlab: warm start: the job's process {child} ended but the warm "
                  f"starter did not say how within {reply_s():g} s (frozen?); the job counts "
                  f"as failed", file=sys.stderr)
            return None
        ended = recv_msg(sock)
    except OSError:
        return None
    finally:
        if pidfd is not None:
            os.close(pidfd)
    return ended[0].get("status") if ended and isinstance(ended[0], dict) else None


def _end_as(status: int) -> None:
    """End this process as the child ended: the same exit code, or the same signal."""
    code = os.waitstatus_to_exitcode(status)
    sys.stdout.flush()
    sys.stderr.flush()
    if code < 0:
        if -code in FORWARDED:  # (SIGKILL's disposition cannot be set, nor needs to be)
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        time.sleep(1)  # a signal that does not end a process by default: end as killed
        code = 128 - code
    os._exit(code)


def _ask(sock_path: str, rest: list[str]) -> tuple[socket.socket | None, int | str]:
    """Ask the starter at ``sock_path`` to fork the job: (the connection, the child's pid), or
    (None, why it will not be forked). The child waits for our "go"."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    wait_s = reply_s()
    sock.settimeout(wait_s)
    try:
        sock.connect(sock_path)
        send_msg(sock, {"argv": rest, "env": dict(os.environ), "cwd": os.getcwd(),
                        "pid": os.getpid()}, [0, 1, 2])
        got = recv_msg(sock)
        reply = got[0] if got else None
        if isinstance(reply, dict) and isinstance(reply.get("pid"), int):
            send_msg(sock, {"go": True})
            sock.settimeout(None)
            return sock, reply["pid"]
        why = (f"the warm starter refused it: {reply['refused']}"
               if isinstance(reply, dict) and reply.get("refused") else
               "the warm starter closed the connection without an answer")
    except TimeoutError:
        why = f"the warm starter at {sock_path} did not answer within {wait_s:g} s (frozen?)"
    except OSError as exc:
        why = f"no warm starter answers at {sock_path}: {type(exc).__name__}: {exc.strerror or exc}"
    sock.close()
    return None, why


def main(argv: list[str]) -> None:
    sock_path, rest = argv[1], argv[2:]
    sock, child = _ask(sock_path, rest)
    if sock is None or not isinstance(child, int):
        cold(rest, str(child))
        return
    _note_child(rest, child)

    def forward(signum: int, _frame: Any) -> None:
        try:
            os.kill(child, signum)
        except ProcessLookupError:
            pass

    for signum in FORWARDED:
        signal.signal(signum, forward)
    status = _wait_status(sock, child)
    if not isinstance(status, int):
        _wait_gone(child)
        os._exit(1)
    _end_as(status)


if __name__ == "__main__":
    main(sys.argv)
