#!/usr/bin/env bash
# The platform end to end on one GPU node without a scheduler (docs/profiling.md): an MLflow
# tracking server on 127.0.0.1 (SQLite backend), `snakemake` over the selected runs with the
# local executor (configs/sites/gpu-node.yaml) and `profiler=nsys` for every run, then what the
# server holds, read back. On the lent machine, from the repository root:
#   bash benchmarks/workflow_gpu.sh OUT RUNS [SUBSTITUTES]
# RUNS: comma-separated run keys (the `only` config key). SUBSTITUTES: asset_substitutes, for a
# node without the Hugging Face Hub. SITE, SCALE, PROFILER override gpu-node, full, nsys;
# SNAKEMAKE_TIMEOUT_S stops snakemake after that long (0: never), so that what ran is still read back. Wheels missing from the node's image: in $WHEELS (.whl-wf).
set -uo pipefail
OUT=${1:?OUT}; RUNS=${2:?RUNS}; SUBS=${3:-}
WHEELS=${WHEELS:-.whl-wf}
if compgen -G "$WHEELS/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$WHEELS"/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD/src
fi
export PYTHONUNBUFFERED=1 LD_LIBRARY_PATH=$PWD/.device-libs:${LD_LIBRARY_PATH:-}
mkdir -p "$OUT" /tmp/mlflow
python3 -m mlflow server --backend-store-uri sqlite:////tmp/mlflow/mlflow.db \
  --default-artifact-root /tmp/mlflow/artifacts --host 127.0.0.1 --port 5000 \
  >"$OUT/mlflow-server.log" 2>&1 &
SERVER=$!
for _ in $(seq 120); do
  python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:5000/health', timeout=2)" \
    2>/dev/null && break; sleep 1
done
echo "[workflow_gpu] mlflow server up after ${SECONDS}s"
timeout "${SNAKEMAKE_TIMEOUT_S:-0}" python3 -m snakemake --cores all --resources gpus=1 --scheduler greedy \
  --config "site=${SITE:-gpu-node}" "scale=${SCALE:-full}" "profiler=${PROFILER:-nsys}" \
  results_dir=results-gpu "only=$RUNS" \
  ${SUBS:+"asset_substitutes=$SUBS"} 2>&1 | tee "$OUT/snakemake.log" | \
  grep -E "^\[hopperlab|rror|Finished job|steps \(|done\)" | tail -60
echo "[workflow_gpu] snakemake exit ${PIPESTATUS[0]} after ${SECONDS}s"
python3 benchmarks/mlflow_readback.py http://127.0.0.1:5000 --json "$OUT/mlflow-readback.json"
# small copies of what each run produced, for the docs and the test fixtures (no .nsys-rep)
tar -czf "$OUT/runs.tgz" --exclude='*.nsys-rep' --exclude='*.qdstrm' results-gpu 2>/dev/null
ls -la results-gpu/*/*/*/artifacts/profile/ 2>/dev/null | grep -E "nsys-rep|sqlite" | head -20
kill $SERVER 2>/dev/null
