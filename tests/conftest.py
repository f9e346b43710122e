"""Test setup: the real-service fixtures (Slurm cluster, MLflow server) live in tests/infra/; the
``integration`` mark is given here to every test that starts a real service (plain ``pytest``
runs the others; scripts/test.sh runs both)."""

pytest_plugins = ["tests.infra.slurm_fixture", "tests.infra.mlflow_fixture", "tests.infra.timing",
                  "tests.infra.workers"]

import signal as _signal
import warnings as _warnings

import pytest as _pytest

from tests import helpers as _helpers

_STOP_SIGNALS = (_signal.SIGINT, _signal.SIGTERM)

#: marks that name a real service (pyproject.toml): each makes a test an integration test
SERVICE_MARKS = frozenset({"slurm", "mlflow_server", "browser", "charliecloud", "network"})
#: fixtures that start one (tests/infra/)
SERVICE_FIXTURES = frozenset({"slurm_cluster", "mlflow_server", "mlflow_uri"})


def is_integration(item) -> bool:
    """A test that starts Slurm, an MLflow server, a browser or a container: by its marks or
    the fixtures it uses. Tests that start Snakemake or a job say so with ``integration``
    themselves; tests/helpers.py refuses to start them in a test that does not."""
    marks = {m.name for m in item.iter_markers()}
    return "integration" in marks or bool(marks & SERVICE_MARKS
                                          or set(getattr(item, "fixturenames", ())) & SERVICE_FIXTURES)


@_pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marks
def pytest_collection_modifyitems(config, items):
    for item in items:
        if is_integration(item) and not item.get_closest_marker("integration"):
            item.add_marker(_pytest.mark.integration)


@_pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Let tests/helpers.py know whether this test is an integration test (before any of its
    fixtures, a module's included), so that an unmarked test which starts Snakemake or a job
    fails at once instead of slowing the unit run."""
    _helpers.INTEGRATION_TEST = item.get_closest_marker("integration") is not None


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
