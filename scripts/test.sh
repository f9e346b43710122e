#!/usr/bin/env bash
# The whole test suite on a fresh Debian 12 machine, as root: installs what it needs (Python
# packages; Slurm, munge, slurmdbd, MariaDB and Chromium from Debian), runs pytest, and the
# tests themselves start and stop the one-node Slurm cluster and the MLflow server.
# Not root? The Slurm tests skip with the reason (HOPPERLAB_REQUIRE_SLURM=1 makes that a failure).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  need=""
  # charliecloud-runtime (ch-run) + mmdebstrap: the container image built and run by the workflow
  for pkg in slurmctld slurmd slurm-client munge slurmdbd mariadb-server chromium \
             charliecloud-runtime mmdebstrap; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need="$need $pkg"
  done
  if [ -n "$need" ]; then
    echo "[test.sh] installing Debian packages:$need"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $need >/dev/null
  fi
fi

# torch first, pinned: an unpinned torch pulls a multi-GB CUDA build on CPU machines.
python3 -c 'import torch' 2>/dev/null || python3 -m pip install -q torch==2.13.0
python3 -m pip install -q -e '.[test]'

# the rules of the house (ARCHITECTURE.md): layers kept by import-linter, heavy packages imported
# inside functions only (ruff's banned module-level imports), and no pyflakes finding
lint-imports
ruff check --select TID253 src
# pyflakes' findings (unused imports and variables, shadowed names) everywhere Python lives
ruff check --select F src tests benchmarks

# every test: plain `pytest` deselects those marked integration (pyproject.toml's addopts: the
# quick unit run); this selects both, and a later -m in "$@" still narrows it
set +e
python3 -m pytest -ra --timeout=1800 -m "integration or not integration" "$@"
rc=$?
set -e
if [ "$rc" = 5 ]; then
  echo "[test.sh] pytest collected no tests: that is a failure" >&2
  exit 1
fi
exit "$rc"
