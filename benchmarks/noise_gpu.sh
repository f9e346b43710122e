#!/usr/bin/env bash
# The noise measurement of docs/benchmarks/noise.md on one GPU node, from the repository root:
#   bash benchmarks/noise_gpu.sh OUT [extra noise_gpu.py arguments]
# Wheels missing from the node's image: in $WHEELS (.whl-wf), as benchmarks/workflow_gpu.sh.
# Writes OUT/noise/noise.json (every check's verdict, the rates, the co-runner's tuned duty and the
# slowdown it caused per run), OUT/noise/references/<machine>.yaml (from the reference windows),
# OUT/noise.log and OUT/noise-runs.tgz (the runs' samples and steps). DEADLINE_S: start no run
# after this many seconds (default 300).
set -uo pipefail
OUT=${1:?OUT}; shift
WHEELS=${WHEELS:-.whl-wf}
if compgen -G "$WHEELS/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$WHEELS"/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD/src
else
  export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD/src
fi
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >"$OUT/gpu.txt" 2>&1
python3 benchmarks/noise_gpu.py "$OUT/noise" --deadline-s "${DEADLINE_S:-300}" "$@" 2>&1 | \
  tee "$OUT/noise.log" | grep -E "^\[noise\]|Error|error" | tail -80
rm -rf "$OUT/noise/views" "$OUT/noise/results"/*/*/*/artifacts 2>/dev/null
tar -czf "$OUT/noise-runs.tgz" -C "$OUT/noise" results 2>/dev/null && rm -rf "$OUT/noise/results"
