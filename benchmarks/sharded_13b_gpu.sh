#!/usr/bin/env bash
# The 13B sharded fine-tuning rows of issue 27 on one multi-GPU node, through the workflow
# (benchmarks/workflow_gpu.sh), one run at a time, then the figures the issue judges them by:
# set-up (job start to the first step), the step, its floor and the step over the floor.
#   bash benchmarks/sharded_13b_gpu.sh OUT [RUNS]
# RUNS: comma-separated variants of finetune/full-llama2-13b-sharded (default: the two 2-GPU
# rows; `1gpu` for the two one-GPU rows, `all` for the four). GPUS defaults to the node's count.
set -uo pipefail
OUT=${1:?OUT}
E=finetune/full-llama2-13b-sharded
case "${2:-2gpu}" in
  2gpu) RUNS="$E/fsdp2,$E/fsdp2-offload" ;;
  1gpu) RUNS="$E/fsdp2-offload-1gpu,$E/torchao-offload-1gpu" ;;
  all) RUNS="$E/fsdp2,$E/fsdp2-offload,$E/fsdp2-offload-1gpu,$E/torchao-offload-1gpu" ;;
  *) RUNS=$2 ;;
esac
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export GPUS=${GPUS:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')} CORES=${CORES:-1}
export PROFILER=${PROFILER:-none} RESULTS=${RESULTS:-results-13b} SNAKEMAKE_TIMEOUT_S=${SNAKEMAKE_TIMEOUT_S:-540}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpus.txt"
free -g | tee "$OUT/host-memory.txt"
bash benchmarks/workflow_gpu.sh "$OUT" "$RUNS"
python3 benchmarks/sharded_table.py "$RESULTS" | tee "$OUT/sharded-13b.txt"
