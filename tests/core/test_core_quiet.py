"""torchao's "Failed to load _C_mxfp8" and torch's register_constant deprecation are dropped
from every run's output; other records of those loggers still pass (issue 28, item 18)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

from hopperlab.core.quiet import silence_known_noise


def test_only_the_known_lines_are_dropped(caplog):
    silence_known_noise()
    silence_known_noise()   # twice: one filter per logger
    assert len(logging.getLogger("torchao").filters) == 1
    with caplog.at_level(logging.WARNING):
        logging.getLogger("torchao").warning("Failed to load /x/torchao/_C_mxfp8.so: nope")
        logging.getLogger("torch.utils._pytree").warning(
            "%s is an Enum subclass and is now natively supported by torch.compile as an "
            "opaque value type. Calling register_constant() on Enum subclasses is deprecated", "E")
        logging.getLogger("torchao").warning("a real torchao warning")
    assert [r.getMessage() for r in caplog.records] == ["a real torchao warning"]


@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
def test_a_job_importing_torchao_prints_neither():
    code = ("from hopperlab.run import runner; runner.silence_known_noise(); "
            "import torchao.float8, torchao.float8.float8_linear")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ), timeout=300)
    assert out.returncode == 0, out.stderr
    assert "Failed to load" not in out.stderr and "register_constant" not in out.stderr


def test_the_command_line_silences_before_any_verb():
    from hopperlab.cli import main
    assert main.silence_known_noise is silence_known_noise
