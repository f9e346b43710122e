#!/usr/bin/env bash
# Issue 36's one GPU call, on a node of 2 GPUs, from the repository root:
#   bash benchmarks/yardsticks_gpu.sh OUT
# GPU $NOISE_GPU (1): the noise measurement (benchmarks/noise_gpu.sh: healthy checks, the
# co-runner tuned to a 10 % slowdown, detections). GPU 0, at the same time: the node's matmul
# probes (bf16, fp8) and docs/benchmarks/energy.md's command, shrunk to the runs issue 36 found
# implausible ($ENERGY_RUNS), then the energy table against the probes. The energy part is on
# GPU 0 (the workflow's local executor now takes a job's GPUs from the caller's
# CUDA_VISIBLE_DEVICES; it once gave every job GPU 0); the noise runs and the co-runner run as
# plain processes.
# Wheels missing from the node's image: in $WHEELS (.whl-wf). Eight files come back in OUT:
#   noise.json noise.log noise-references.yaml noise-runs.tgz
#   probe-bf16.json probe-fp8.json energy.txt energy-runs.tgz
# NOISE_ARGS: extra arguments of noise_gpu.py; ENERGY_SITE/ENERGY_SCALE/ENERGY_SUBS: the energy
# runs' site, scale and asset substitutes (a CPU rehearsal: local, smoke, selftest runs).
set -uo pipefail
OUT=${1:?OUT}
WHEELS=${WHEELS:-.whl-wf}
NOISE_GPU=${NOISE_GPU:-1}; ENERGY_GPU=0
ENERGY_RUNS=${ENERGY_RUNS:-finetune/full-1b/bf16-compile,finetune/full-1b/fp8}
ENERGY_SUBS=${ENERGY_SUBS-dolly-15k:dolly-synthetic,llama-2-tokenizer:tiny-tokenizer}
W=${WORK:-/tmp/yardsticks}
rm -rf "$W"; mkdir -p "$OUT" "$W"
if compgen -G "$WHEELS/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$WHEELS"/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD/src
else
  export PYTHONPATH=$PWD/src
fi
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
{ date -u; nvidia-smi --query-gpu=index,name,memory.total,driver_version,power.limit \
    --format=csv,noheader 2>&1; } >"$W/gpu.txt"

# the noise measurement on its GPU, in the background (its own log)
( export CUDA_VISIBLE_DEVICES=$NOISE_GPU WHEELS=/nonexistent
  # shellcheck disable=SC2086
  bash benchmarks/noise_gpu.sh "$W/nz" ${NOISE_ARGS:-} >"$W/noise-tail.log" 2>&1 ) &
NOISE=$!
sleep "${STAGGER_S:-5}"  # the noise run first (assets are locked per asset: no clash)

# the energy part on the other GPU
( export CUDA_VISIBLE_DEVICES=$ENERGY_GPU
  python3 benchmarks/energy_probe.py --seconds 3 >"$OUT/probe-bf16.json" 2>"$W/probe.err"
  python3 benchmarks/energy_probe.py --seconds 3 --dtype fp8 >"$OUT/probe-fp8.json" \
    2>>"$W/probe.err"
  SITE=${ENERGY_SITE:-gpu-node} SCALE=${ENERGY_SCALE:-full} PROFILER=none \
    SNAKEMAKE_TIMEOUT_S=${ENERGY_TIMEOUT_S:-200} RESULTS="$W/results-energy" WHEELS=/nonexistent \
    bash benchmarks/workflow_gpu.sh "$W/energy" "$ENERGY_RUNS" "$ENERGY_SUBS" \
    >"$W/energy-workflow.log" 2>&1
  python3 benchmarks/energy_table.py "$W/results-energy" --probe "$OUT/probe-bf16.json" \
    --probe-fp8 "$OUT/probe-fp8.json" >"$OUT/energy.txt" 2>&1
  tar -czf "$OUT/energy-runs.tgz" -C "$W" --exclude='*.pt' --exclude='*nsys*' \
    results-energy energy-workflow.log probe.err energy/snakemake.log 2>/dev/null
) &
ENERGY=$!
wait $ENERGY
wait $NOISE

cp "$W/nz/noise/noise.json" "$OUT/noise.json" 2>/dev/null
cp "$W"/nz/noise/references/*.yaml "$OUT/noise-references.yaml" 2>/dev/null
cp "$W/nz/noise-runs.tgz" "$OUT/noise-runs.tgz" 2>/dev/null
{ cat "$W/gpu.txt"; grep -E "^\[noise\]|Error|error" "$W/nz/noise.log" | tail -120; } \
  >"$OUT/noise.log" 2>&1
grep -E "^\[noise\] (run|healthy)" "$OUT/noise.log"
tail -3 "$OUT/energy.txt"
ls "$OUT"
