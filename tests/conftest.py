"""Test setup: the real-service fixtures (Slurm cluster, MLflow server) live in tests/infra/."""

pytest_plugins = ["tests.infra.slurm_fixture", "tests.infra.mlflow_fixture"]



import signal as _signal
import warnings as _warnings

import pytest as _pytest

_STOP_SIGNALS = (_signal.SIGINT, _signal.SIGTERM)


@_pytest.fixture(autouse=True)
def _signal_handlers_left_as_found(request):
    """A test that leaves SIGINT ignored or blocked in pytest makes every later child ignore it
    (an ignored or blocked signal stays so across exec; Python then installs no Ctrl-C handler):
    in CI a later test's SIGINT to snakemake did nothing. Put both back, and say which test."""
    handlers = {s: _signal.getsignal(s) for s in _STOP_SIGNALS}
    blocked = _signal.pthread_sigmask(_signal.SIG_BLOCK, [])
    yield
    now_handlers = {s: _signal.getsignal(s) for s in _STOP_SIGNALS}
    now_blocked = _signal.pthread_sigmask(_signal.SIG_SETMASK, blocked)
    for s, handler in handlers.items():
        _signal.signal(s, handler)
    if now_handlers != handlers or now_blocked != blocked:
        _warnings.warn(f"{request.node.nodeid} left SIGINT/SIGTERM changed: handlers "
                       f"{now_handlers} (were {handlers}), blocked {now_blocked} (was {blocked})")
