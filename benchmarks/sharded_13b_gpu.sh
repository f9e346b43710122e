#!/usr/bin/env bash
# The 13B sharded fine-tuning rows of issues 27 and 35 on one multi-GPU node, through the
# workflow (benchmarks/workflow_gpu.sh), one run at a time, then the figures the issues judge
# them by: set-up (job start to the first step), the step, its floor from the hardware and
# the parts, the CPU optimizer against its floor and its exposed time.
#   bash benchmarks/sharded_13b_gpu.sh OUT [RUNS]
# RUNS: comma-separated variants of finetune/full-llama2-13b-sharded (default: the two 2-GPU
# rows; `1gpu` for the two one-GPU rows, `all` for the four). GPUS defaults to the node's count;
# SNAKEMAKE_TIMEOUT_S (default 450) stops the runs early enough that the table is still made
# inside a 9-minute call. OUT gets few files (a lent machine returns at most 8): node.txt,
# snakemake.log, sharded-13b.txt (the table), sharded-13b.json (every run's metrics, tags and
# thread plan), runs.tgz (each run's small files), workflow.txt (the workflow's own tables).
set -uo pipefail
OUT=${1:?OUT}
E=finetune/full-llama2-13b-sharded
# one workflow call per group, in this order (Snakemake orders the runs of one call itself):
# with `all`, torchao's row (the peer, not a goal of issue 35) comes last, where a time bound
# would stop it first
case "${2:-2gpu}" in
  2gpu) GROUPS_=("$E/fsdp2,$E/fsdp2-offload") ;;
  1gpu) GROUPS_=("$E/fsdp2-offload-1gpu,$E/torchao-offload-1gpu") ;;
  all) GROUPS_=("$E/fsdp2,$E/fsdp2-offload,$E/fsdp2-offload-1gpu" "$E/torchao-offload-1gpu") ;;
  *) GROUPS_=("$2") ;;
esac
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export GPUS=${GPUS:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')} CORES=${CORES:-1}
export PROFILER=${PROFILER:-none} RESULTS=${RESULTS:-results-13b} SNAKEMAKE_TIMEOUT_S=${SNAKEMAKE_TIMEOUT_S:-450}
mkdir -p "$OUT"
WF=$(mktemp -d)  # the workflow's many files; the few that matter are copied to OUT
{ date -u; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; free -g; nproc
  lscpu | grep -E 'Model name|Socket|NUMA node|Flags' | cut -c1-300; } >"$OUT/node.txt" 2>&1
END=$((SECONDS + SNAKEMAKE_TIMEOUT_S))  # one bound for all the groups together
: >"$OUT/snakemake.log"
for RUNS in "${GROUPS_[@]}"; do
  LEFT=$((END - SECONDS))
  if [ "$LEFT" -le 30 ]; then echo "[sharded_13b] no time left for $RUNS" | tee -a "$OUT/snakemake.log"; continue; fi
  SNAKEMAKE_TIMEOUT_S=$LEFT bash benchmarks/workflow_gpu.sh "$WF" "$RUNS"
  cat "$WF/snakemake.log" >>"$OUT/snakemake.log"
done
# workflow_gpu.sh sets PYTHONPATH for its own children only (the wheels and src/)
export PYTHONPATH=/tmp/site:$PWD/src${PYTHONPATH:+:$PYTHONPATH}
python3 benchmarks/sharded_table.py "$RESULTS" --json "$OUT/sharded-13b.json" | tee "$OUT/sharded-13b.txt"
cp "$WF/runs.tgz" "$WF/energy.tgz" "$OUT/" 2>/dev/null  # energy.tgz: power traces and windows (issue 36)
cat "$WF/table.txt" "$WF/check.txt" "$WF/energy.txt" >"$OUT/workflow.txt" 2>/dev/null
