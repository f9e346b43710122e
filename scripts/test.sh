#!/usr/bin/env bash
# The whole test suite on a fresh Debian 12 machine, as root (`--unit`: only the unit tests, no
# install; below): installs what it needs (Python packages; Slurm, munge, slurmdbd, MariaDB and
# Chromium from Debian), runs pytest, and the tests themselves start and stop the one-node Slurm
# cluster and the MLflow server.
# Not root? The Slurm tests skip with the reason (HOPPERLAB_REQUIRE_SLURM=1 makes that a failure).
set -euo pipefail
cd "$(dirname "$0")/.."

# --unit: plain pytest (the unit tests, pyproject.toml's addopts) with what is installed, before
# and instead of any install step: the quick check while working, on any machine
if [ "${1:-}" = "--unit" ]; then
  shift
  exec python3 -m pytest -q "$@"
fi

# how long each phase took, printed at the end (and on failure): where the next person looks first
T0=$SECONDS; PHASES=(); PHASE_START=$SECONDS; PHASE_NAME=""
phase() {
  [ -n "$PHASE_NAME" ] && PHASES+=("$(printf '%-28s %5d s' "$PHASE_NAME" $((SECONDS - PHASE_START)))")
  PHASE_NAME="$1"; PHASE_START=$SECONDS
}
report_phases() {
  phase ""
  echo "[test.sh] time per phase (whole run $((SECONDS - T0)) s):"
  printf '[test.sh]   %s\n' "${PHASES[@]}"
}
trap report_phases EXIT
phase "Debian packages"

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

phase "Python packages"
# torch first, pinned: an unpinned torch pulls a multi-GB CUDA build on CPU machines.
python3 -c 'import torch' 2>/dev/null || python3 -m pip install -q torch==2.13.0
python3 -m pip install -q -e '.[test]'

phase "linters"
# the rules of the house (ARCHITECTURE.md): layers kept by import-linter, heavy packages imported
# inside functions only (ruff's banned module-level imports), and no pyflakes finding
lint-imports
ruff check --select TID253 src
# pyflakes' findings (unused imports and variables, shadowed names) everywhere Python lives
ruff check --select F src tests benchmarks
# types, where they are declared ([tool.mypy] in pyproject.toml names the paths)
mypy

# every test: plain `pytest` deselects those marked integration (pyproject.toml's addopts: the
# quick unit run); this selects both, and a later -m in "$@" still narrows it.
# Most tests wait on processes (Snakemake, Slurm, MLflow, jobs), so more workers than cores pay:
# each test file is one unit, the Slurm tests one group on one worker (tests/infra/workers.py).
# The units that set the suite's length (the Slurm group, the Charliecloud image build) keep the
# CPU first: the other units run HOPPERLAB_TEST_NICE (default 5; 0: all alike) nice steps lower.
# HOPPERLAB_TEST_WORKERS=0 runs in this process, in file order.
# Idle OpenMP threads sleep instead of spinning: the workers' torch processes share 2 cores, and
# spinning threads of one burn the CPU another needs (4 torch loops side by side: 14 s of CPU
# passive against 103 s by default, docs/benchmarks/platform.md "The test suite").
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
phase "tests (${HOPPERLAB_TEST_WORKERS:=6} workers)"
workers=(-n 0)  # one process: overrides the -n auto of pyproject.toml's addopts
[ "$HOPPERLAB_TEST_WORKERS" != 0 ] && workers=(-n "$HOPPERLAB_TEST_WORKERS" --maxprocesses "$HOPPERLAB_TEST_WORKERS"
  --dist loadgroup --no-loadscope-reorder)  # --maxprocesses: addopts caps plain pytest at 4
# the per-test lines go to HOPPERLAB_TEST_TIMES when given (kept), else to a file removed after
times="${HOPPERLAB_TEST_TIMES:-}"
[ -n "$times" ] || { times=$(mktemp -t hopperlab-test-times.XXXXXX); trap 'rm -f "$times"; report_phases' EXIT; }
set +e
# -p no:benchmark: pytest-benchmark, where installed, warns once per worker and measures nothing
HOPPERLAB_TEST_TIMES="$times" python3 -m pytest -ra --timeout=1800 --durations=25 -p no:benchmark \
  -m "integration or not integration" "${workers[@]}" "$@"
rc=$?
set -e
phase "summary"
python3 scripts/test_times.py "$times" --top 15 || true
if [ "$rc" = 5 ]; then
  echo "[test.sh] pytest collected no tests: that is a failure" >&2
  exit 1
fi
exit "$rc"
