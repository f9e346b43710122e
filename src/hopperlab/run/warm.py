"""The warm starter: one process per workflow that has imported torch and transformers once and
forks each local job from there (``run/warm_client.py`` is the job's side).

Why: on a 2-core Xeon a smoke run's own work takes a second or two, its imports 2-4 s of CPU
(``import torch`` 1.2 s, transformers another 2 s with torch's dynamo and DTensor); 80 runs
paid them 80 times (docs/benchmarks/platform.md, issue 37). A forked child shares the imported
modules and starts where a fresh process would be after its imports; everything after is the
job's own: its environment, working folder, stdin/stdout/stderr and memory cgroup are the
client's (so a memory cap and the kernel's OOM word apply as before), its thread pools are sized
by the runner (``torch.set_num_threads``), and it ends as a process would (atexit, exit code, the
signal that killed it). The starter forks only while it runs no Python thread and computes
nothing (OpenMP's pool and CUDA never start here); jobs with GPUs, a container or a profiler are started as before.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import os
import runpy
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import traceback
from pathlib import Path
from typing import Any

from hopperlab.core.secrets import SECRET_ENV
from hopperlab.node import oom_kills
from hopperlab.node.threads import LAUNCHER_ENV, THREAD_ENV
from hopperlab.run import jobenv, runner
from hopperlab.run.warm_client import FORKED_ENV, recv_msg, send_msg

#: variables read while torch, transformers and Python start: a job whose environment differs
#: in one of them is started cold (the pool sizes are set by the runner, not at import)
IMPORT_ENV_PREFIXES = ("PYTHON", "TORCH", "PYTORCH", "HF_", "HUGGINGFACE", "TRANSFORMERS",
                       "CUDA_", "NCCL", "MKL", "KMP", "OMP", "LD_", "TRITON", "XDG_", "MPL")
#: the job's command line a child can run: ``-u -m <module> args...`` (submitit's)
RUNNABLE = ("-u", "-m")


def import_env(env: dict[str, str]) -> dict[str, str]:
    """The part of ``env`` the imports read (a secret, ``HF_TOKEN``, is read when a download
    asks for it, never at import: it never makes a job cold)."""
    skip = set(THREAD_ENV) | set(LAUNCHER_ENV) | set(SECRET_ENV)
    return {k: v for k, v in env.items() if k.startswith(IMPORT_ENV_PREFIXES) and k not in skip}


def preload() -> None:
    """Import what the jobs import (the runner is already in). A package missing here is
    left to the jobs that need it (they import it, or say it is missing, as without a
    starter)."""
    import submitit  # noqa: F401
    import torch  # noqa: F401

    try:
        import transformers  # noqa: F401
        from transformers import modeling_utils  # noqa: F401
        from transformers.models.llama import modeling_llama  # noqa: F401
    except ImportError as exc:
        print(f"hopperlab: warm start: not preloaded: {exc}", file=sys.stderr)
    try:
        import peft  # noqa: F401
    except ImportError as exc:
        print(f"hopperlab: warm start: not preloaded: {exc}", file=sys.stderr)
    assert callable(runner.execute)  # the job's function, unpickled by name in the child


def refusal(msg: dict[str, Any], own_env: dict[str, str]) -> str | None:
    """Why the starter will not fork this job (None: it will)."""
    argv = msg.get("argv") or []
    if list(argv[:2]) != list(RUNNABLE) or len(argv) < 3:
        return f"a command it does not run: {argv[:3]}"
    theirs = import_env(msg.get("env") or {})
    differ = sorted(k for k in set(theirs) | set(own_env) if theirs.get(k) != own_env.get(k))
    if differ:
        return f"the job's environment differs where imports read it: {', '.join(differ[:8])}"
    if threading.active_count() > 1:
        # (the idle native threads torch's import leaves are those a DataLoader's fork meets)
        return "the starter runs a Python thread (forking would be unsafe)"
    return None


def _join_cgroup(client: int) -> None:
    """Move this process into the client's memory cgroup (its cap, its OOM counters)."""
    theirs, mine = oom_kills.memory_cgroup(client), oom_kills.memory_cgroup()
    if theirs is None or theirs == mine:
        return
    try:
        (theirs[0] / "cgroup.procs").write_text(str(os.getpid()))
    except OSError as exc:
        print(f"hopperlab: warm start: could not join the job's memory cgroup {theirs[0]}: "
              f"{exc}", file=sys.stderr)


def _watch_client(conn: socket.socket) -> None:
    """Die with the client: once it has gone (killed), nobody waits for this job."""
    def watch() -> None:
        try:
            while conn.recv(4096):
                pass
        except OSError:
            pass
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="hopperlab-warm-client", daemon=True).start()


def _child(conn: socket.socket, msg: dict[str, Any], fds: list[int]) -> None:
    """In the forked child: become the job the client asked for, then exit as it ends."""
    code: int = 1
    try:
        for sig in (signal.SIGTERM, signal.SIGCHLD, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        go = recv_msg(conn)  # the client has our pid and stands for us (not gone cold)
        if not (go and isinstance(go[0], dict) and go[0].get("go")):
            return
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for target, fd in enumerate(fds[:3]):
            os.dup2(fd, target)
        for fd in fds:
            os.close(fd)
        os.chdir(msg["cwd"])
        os.environ.clear()
        os.environ.update(msg["env"])
        os.environ[FORKED_ENV] = str(os.getppid())
        _join_cgroup(int(msg["pid"]))
        sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8",
                                      write_through=True)
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8",
                                      errors="backslashreplace", write_through=True)
        _watch_client(conn)
        module, args = msg["argv"][2], msg["argv"][3:]
        sys.argv = [module, *args]
        sys.path[0] = msg["cwd"]
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            if exc.code is None or isinstance(exc.code, int):
                code = exc.code or 0
            else:
                print(exc.code, file=sys.stderr)
                code = 1
        except KeyboardInterrupt:
            _finish()
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        except BaseException:  # noqa: BLE001 - as python prints an uncaught exception
            traceback.print_exc()
            code = 1
        _finish()
    finally:
        os._exit(code)


def _finish() -> None:
    """What the interpreter does at its end: join threads, atexit, flush."""
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None:
        shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


def serve(path: str, workflow: int) -> None:
    """Preload, listen on ``path`` and fork each job asked for until SIGTERM, or until the
    process ``workflow`` that started it has gone (killed outright: no atexit ran)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the workflow stops it, not Ctrl-C

    def stop(_signum: int, _frame: Any) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    own_env = import_env(dict(os.environ))  # as the imports saw it (torch adds to it)
    preload()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    waiting: dict[int, socket.socket] = {}
    try:
        while os.getppid() == workflow:  # a workflow killed outright leaves no starter behind
            ready, _, _ = select.select([listener], [], [], 0.05)
            if ready:
                _take(listener, waiting, own_env)
            _reap(waiting)
    finally:
        listener.close()
        with contextlib.suppress(OSError):
            os.unlink(path)


def _take(listener: socket.socket, waiting: dict[int, socket.socket],
          own_env: dict[str, str]) -> None:
    conn, _ = listener.accept()
    got = recv_msg(conn, max_fds=3)
    if got is None:
        conn.close()
        return
    msg, fds = got
    why = refusal(msg, own_env) if isinstance(msg, dict) and len(fds) == 3 else "a bad request"
    if why:
        print(f"hopperlab: warm start: job started cold: {why}", file=sys.stderr, flush=True)
        for fd in fds:
            os.close(fd)
        send_msg(conn, {"refused": why})
        conn.close()
        return
    pid = os.fork()
    if pid == 0:
        listener.close()
        for other in waiting.values():
            other.close()
        _child(conn, msg, fds)
    for fd in fds:
        os.close(fd)
    try:
        send_msg(conn, {"pid": pid})
    except OSError:
        pass  # the client went: its child sees it and goes too
    waiting[pid] = conn


def _reap(waiting: dict[int, socket.socket]) -> None:
    """Tell each client whose child ended how it ended."""
    while waiting:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = waiting.pop(pid, None)
        if conn is None:
            continue
        try:
            send_msg(conn, {"status": status})
        except OSError:
            pass
        conn.close()


class Starter:
    """The starter process of one workflow and the socket its jobs reach it by."""

    def __init__(self, log: Path, site_env: dict[str, str] | None = None) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="hopperlab-warm-"))
        self.socket = str(self.folder / "starter.sock")
        # the jobs' environment (the site's env, no secret: a forked job's process image is
        # this one's), and no GPU for the starter or its jobs (it serves jobs without GPUs:
        # CUDA never starts here, forking stays safe), as submitit's local executor gives
        # such a job none
        env = {**jobenv.job_env(os.environ, site_env or {}), "CUDA_VISIBLE_DEVICES": ""}
        with open(log, "ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "hopperlab.run.warm", self.socket, str(os.getpid())],
                env=env,
                stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True)

    def stop(self) -> None:
        """End the starter (jobs it forked run on) and remove its socket."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]))
