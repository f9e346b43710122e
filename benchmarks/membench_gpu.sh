#!/usr/bin/env bash
# Reproduce the GPU figures of docs/benchmarks/membench.md on a node with a CUDA GPU:
# every membench variant (copy: h2d/d2h/bidir x pageable/pinned; alloc: device/pinned/managed/
# host) at scale `full`, run in this process through the workload and a real Recorder (no
# Snakemake, no submitit), then a short table.
#
#   benchmarks/membench_gpu.sh [OUT_DIR]        # OUT_DIR defaults to $OUT, else results/membench_gpu
#
# Needs python3 with torch (CUDA build) and numpy. Extra arguments after OUT_DIR go to
# `benchmarks/membench_sweep.py` (e.g. --only copy-h2d-pinned --repeats 5).
# OUT_DIR receives: log.txt (everything printed), table.txt, fingerprint.json, nvidia-smi.txt and
# membench_runs.tar.gz (one run directory per variant: steps.jsonl, metrics.json, artifacts/).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-results/membench_gpu}}"
shift || true
mkdir -p "$out"
runs="$(mktemp -d /tmp/membench_runs.XXXXXX)"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
python="${PYTHON:-python3}"

{
  echo "== $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=index,uuid,name,memory.total,driver_version,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max --format=csv,noheader || true
    nvidia-smi -q | grep -A 12 -i "GPU Link Info" || true
  fi
  "$python" - <<'PY' || true
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "device", torch.cuda.get_device_name(0))
torch.cuda.init()
from hopperlab.cuda.runtime import CudaRuntime
rt = CudaRuntime()
print("cudart", rt.path, "version", rt.version, "prefetch via", rt.prefetch_api,
      "exports _v2:", hasattr(rt.lib, "cudaMemPrefetchAsync_v2"))
free, total = torch.cuda.mem_get_info()
print(f"GPU memory free {free/1e9:.1f} GB of {total/1e9:.1f} GB")
PY
} 2>&1 | tee "$out/nvidia-smi.txt"

set +e
"$python" benchmarks/membench_sweep.py --out "$runs" --scale full --budget-s "${MEMBENCH_BUDGET_S:-480}" "$@" 2>&1 | tee "$out/log.txt"
rc=${PIPESTATUS[0]}
set -e
cp "$runs/table.txt" "$runs/fingerprint.json" "$out/" 2>/dev/null || true
tar -czf "$out/membench_runs.tar.gz" -C "$runs" .
echo "run directories: $out/membench_runs.tar.gz (exit $rc)"
exit "$rc"
