"""A job process stopped by SIGTERM writes its threads' Python stacks to stderr first."""
import os
import signal
import subprocess
import sys
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[2] / "src")

STOPPED = """
import os, signal, time
from hopperlab.run.stacks import dump_on_term
assert dump_on_term()
def waiting_for_a_peer():
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(30)
waiting_for_a_peer()
"""

INTERRUPTED = """
import os, signal, time
from hopperlab.run.stacks import dump_on_term
assert dump_on_term()
def waiting_for_a_peer():
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(30)
try:
    waiting_for_a_peer()
except KeyboardInterrupt:
    raise SystemExit(7)
"""


def test_a_process_stopped_by_sigterm_says_where_it_was_and_still_ends():
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-c", STOPPED], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == -signal.SIGTERM  # the signal still ends it (chained)
    assert "waiting_for_a_peer" in done.stderr  # the frame it was in


def test_without_it_sigterm_leaves_no_stack():
    plain = STOPPED.replace("assert dump_on_term()", "pass")
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-c", plain], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == -signal.SIGTERM
    assert "waiting_for_a_peer" not in done.stderr


def test_an_interrupted_process_says_where_it_was_and_still_gets_its_keyboardinterrupt():
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-c", INTERRUPTED], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 7  # Python's own SIGINT handler ran after the dump
    assert "waiting_for_a_peer" in done.stderr
