"""Compile hopperlab's own modules once, before a workflow's jobs start.

Why: every run is three Python processes (``hopperlab submit``, submitit's controller, the job),
and each imports tens of hopperlab modules. Where Python writes no bytecode itself
(``PYTHONDONTWRITEBYTECODE``, set in many CI and container images) a fresh checkout compiles
those modules again in every process: about 0.3 s of CPU per process on a 2-core Xeon,
~0.5 s per run (docs/benchmarks/platform.md). Compiling the package once at the workflow's
start costs about 0.4 s. The bytecode is Python's usual ``__pycache__`` (git-ignored), checked
against the source's timestamp as always, so an edited module is recompiled, never run stale.
"""

from __future__ import annotations

import compileall
import os
from pathlib import Path

#: the package this checkout runs (src/hopperlab in a clone, site-packages when installed)
PACKAGE_DIR = Path(__file__).resolve().parents[1]


def compile_package(package_dir: Path = PACKAGE_DIR) -> bool:
    """Write the bytecode of every module under ``package_dir`` whose ``__pycache__`` entry is
    missing or older than its source; False when some could not be written (a read-only
    install: the jobs then compile as before, nothing else changes)."""
    if not os.access(package_dir, os.W_OK):
        return False
    # quiet=2: nothing printed, not even errors (a module that does not compile fails its
    # import in the job with the real traceback); workers=1: the jobs want the other core
    return bool(compileall.compile_dir(str(package_dir), quiet=2, workers=1))
