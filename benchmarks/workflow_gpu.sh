#!/usr/bin/env bash
# The platform end to end on one GPU node without a scheduler (docs/profiling.md): an MLflow
# tracking server on 127.0.0.1 (SQLite backend), `snakemake` over the selected runs with the
# local executor (configs/sites/gpu-node.yaml) and `profiler=nsys` for every run, then what the
# server holds, read back. On the lent machine, from the repository root:
#   bash benchmarks/workflow_gpu.sh OUT RUNS [SUBSTITUTES]
# RUNS: comma-separated run keys (the `only` config key). SUBSTITUTES: asset_substitutes, for a
# node without the Hugging Face Hub. SITE, SCALE, PROFILER override gpu-node, full, nsys;
# GPUS (1) is snakemake's --resources gpus= (4 on a 4-GPU node for its multi-GPU runs), CORES (all)
# its --cores (1: one job at a time, e.g. so that a link measurement has the node to itself);
# SNAKEMAKE_TIMEOUT_S stops snakemake and the jobs it started after that long (0: never;
# benchmarks/bounded.sh), so that what ran is still read back; RESULTS names the results
# folder (results-gpu); REPEATS, the `repeats` config key (unset: the config's 1). Wheels
# missing from the node's image: in
# $WHEELS (.whl-wf). At the end: a short table of the runs (`hopperlab table runs`), `hopperlab
# check`, and $OUT/runs.tgz with each run's small files (no profiles), for docs and fixtures.
set -uo pipefail
OUT=${1:?OUT}; RUNS=${2:?RUNS}; SUBS=${3:-}
WHEELS=${WHEELS:-.whl-wf}
if compgen -G "$WHEELS/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$WHEELS"/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD/src${PYTHONPATH:+:$PYTHONPATH}  # e.g. nemo_gpu.sh's megatron-core
fi
export PYTHONUNBUFFERED=1 LD_LIBRARY_PATH=$PWD/.device-libs:${LD_LIBRARY_PATH:-}
mkdir -p "$OUT"
# shellcheck source=benchmarks/mlflow_server.sh
. "$(dirname "$0")/mlflow_server.sh"
start_mlflow_server /tmp/mlflow "$OUT/mlflow-server.log" 120
echo "[workflow_gpu] mlflow server up after ${SECONDS}s"
# shellcheck source=benchmarks/bounded.sh
. "$(dirname "$0")/bounded.sh"
run_bounded "${SNAKEMAKE_TIMEOUT_S:-0}" python3 -m snakemake --cores "${CORES:-all}" \
  --resources "gpus=${GPUS:-1}" --scheduler greedy \
  --config "site=${SITE:-gpu-node}" "scale=${SCALE:-full}" "profiler=${PROFILER:-nsys}" \
  results_dir="${RESULTS:-results-gpu}" "only=$RUNS" ${REPEATS:+"repeats=$REPEATS"} \
  ${SUBS:+"asset_substitutes=$SUBS"} >"$OUT/snakemake.log" 2>&1
RC=$?
grep -E "^\[hopperlab|rror|Finished job|steps \(|done\)" "$OUT/snakemake.log" | tail -60
echo "[workflow_gpu] snakemake exit $RC after ${SECONDS}s$([ $RC = 124 ] && echo ' (stopped at SNAKEMAKE_TIMEOUT_S, with its jobs)')"
R=${RESULTS:-results-gpu}
python3 benchmarks/mlflow_readback.py http://127.0.0.1:5000 --json "$OUT/mlflow-readback.json" \
  >"$OUT/mlflow-readback.txt" 2>&1
python3 -m hopperlab.cli table runs "$R" | tee "$OUT/table.txt"
python3 -m hopperlab.cli check "$R" | tee "$OUT/check.txt"
# small copies of what each run produced, for the docs and the test fixtures (no profiles)
tar -czf "$OUT/runs.tgz" --exclude='artifacts' --exclude='attempts' --exclude='mlflow.db' "$R" \
  2>/dev/null
cp "$R/summary.csv" "$OUT/" 2>/dev/null
# each run's power trace and energy windows, the report, and the energy table
# (docs/benchmarks/energy.md)
(cd "$R" && find . -path '*/artifacts/energy/*' -print0 | tar -czf "$OUT/energy.tgz" --null -T -) \
  2>/dev/null
cp "$R/report.html" "$OUT/" 2>/dev/null
python3 -m hopperlab.cli table energy "$R" | tee "$OUT/energy.txt"
kill $SERVER 2>/dev/null
