#!/usr/bin/env bash
# The MoE offload measurements of docs/benchmarks/moe.md in one call on the lent GPU:
#   bash benchmarks/moe_gpu.sh OUT [RUNS] [NSYS_RUN]
# 1. benchmarks/sync_behind_copies.py: does a tiny device->host read wait behind big copies?
# 2. the workflow (PROFILER=none) over RUNS ("-": none) (default: no-offload, offload-64mib, offload-64mib-6l
#    of finetune/moe-sft), its table in OUT/table.txt and its runs in OUT/runs.tgz;
# 3. the workflow with nsys over NSYS_RUN (default offload-64mib; "": none), then the anatomy of a measured
#    forward and backward (benchmarks/phase_anatomy.py on the full SQLite export) in
#    OUT/anatomy.txt. Each part has its own time limit (PROBE_S, RUNS_S, NSYS_S).
set -uo pipefail
OUT=${1:?OUT}
E=finetune/moe-sft
RUNS=${2:-$E/no-offload,$E/offload-64mib,$E/offload-64mib-6l}
NSYS_RUN=${3-$E/offload-64mib}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
echo "== probe" | tee "$OUT/probe.txt"
timeout "${PROBE_S:-60}" python3 benchmarks/sync_behind_copies.py 2>&1 | tee -a "$OUT/probe.txt"
NSYS=${NSYS:-$(awk '/^nsys_path:/ {print $2}' configs/sites/gpu-node.yaml)}
if [ "$RUNS" != "-" ]; then
echo "== runs: $RUNS"
PROFILER=none SNAKEMAKE_TIMEOUT_S=${RUNS_S:-330} RESULTS=results-moe-a \
  bash benchmarks/workflow_gpu.sh /tmp/moe-a "$RUNS" >"$OUT/runs.log" 2>&1
cp /tmp/moe-a/table.txt "$OUT/table.txt" 2>/dev/null; cp /tmp/moe-a/runs.tgz "$OUT/runs.tgz"
cat "$OUT/table.txt"
fi
if [ -n "$NSYS_RUN" ]; then
  echo "== nsys: $NSYS_RUN"
  PROFILER=nsys SNAKEMAKE_TIMEOUT_S=${NSYS_S:-180} RESULTS=results-moe-n \
    bash benchmarks/workflow_gpu.sh /tmp/moe-n "$NSYS_RUN" >"$OUT/nsys.log" 2>&1
  cat /tmp/moe-n/table.txt | tee "$OUT/nsys-table.txt"
  rep=$(find results-moe-n -name '*.nsys-rep' | head -1)
  if [ -n "$rep" ]; then
    "$NSYS" export --type sqlite --force-overwrite true --output /tmp/full.sqlite "$rep" >/dev/null
    for r in forward backward; do
      PYTHONPATH=src python3 benchmarks/phase_anatomy.py /tmp/full.sqlite --range $r
    done 2>&1 | tee "$OUT/anatomy.txt"
  else
    echo "no nsys report under results-moe-n" | tee "$OUT/anatomy.txt"
  fi
fi
