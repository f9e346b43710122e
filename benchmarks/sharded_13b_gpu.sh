#!/usr/bin/env bash
# The 13B sharded fine-tuning rows of issues 27 and 35 on one multi-GPU node, through the
# workflow (benchmarks/workflow_gpu.sh), one run at a time, then the figures the issues judge
# them by: set-up (job start to the first step), the step, its floor from the hardware and
# the parts, the CPU optimizer against its floor and its exposed time.
#   bash benchmarks/sharded_13b_gpu.sh OUT [RUNS]
# RUNS: comma-separated variants of finetune/full-llama2-13b-sharded (default: the two 2-GPU
# rows; `1gpu` for the two one-GPU rows, `all` for the four). GPUS defaults to the node's count;
# SNAKEMAKE_TIMEOUT_S (default 450) stops the runs early enough that the table is still made
# inside a 9-minute call; it bounds the layer benchmark and the runs together. BLOCK_BENCH=1
# (default) first times one 13B decoder layer eager and compiled at the 2-GPU rows' 32,768
# tokens per rank (benchmarks/block_compile_gpu.py, at most BLOCK_BENCH_TIMEOUT_S, 150 s; it also
# fills the inductor cache those rows read). OUT gets few files (a lent machine returns at most
# 8): node.txt, block-bench.txt, snakemake.log, sharded-13b.txt (the tables), sharded-13b.json
# (every run's metrics, tags and thread plan), runs.tgz (each run's small files), energy.tgz,
# workflow.txt (the workflow's own tables; with REPEATS=N, N >= 3, the runs measure N windows
# each and `hopperlab references update` writes references from them into a copy of
# configs/references, whose diff ends workflow.txt).
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
if [ "${GPUS:-0}" -lt 1 ]; then  # full-scale 13B runs on a CPU would only fill the host
  echo "[sharded_13b] no GPU on this node (nvidia-smi -L lists none): nothing run" >&2; exit 2
fi
export PROFILER=${PROFILER:-none} RESULTS=${RESULTS:-results-13b} SNAKEMAKE_TIMEOUT_S=${SNAKEMAKE_TIMEOUT_S:-450}
mkdir -p "$OUT"
WF=$(mktemp -d)  # the workflow's many files; the few that matter are copied to OUT
{ date -u; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; free -g; nproc
  lscpu | grep -E 'Model name|Socket|NUMA node|Flags' | cut -c1-300; } >"$OUT/node.txt" 2>&1
END=$((SECONDS + SNAKEMAKE_TIMEOUT_S))  # one bound for the benchmark and all the groups together
if [ "${BLOCK_BENCH:-1}" = 1 ]; then
  PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} timeout "${BLOCK_BENCH_TIMEOUT_S:-150}" \
    python3 benchmarks/block_compile_gpu.py >"$OUT/block-bench.txt" 2>&1
  echo "[sharded_13b] block_compile_gpu.py exit $? after ${SECONDS}s" | tee -a "$OUT/block-bench.txt"
fi
: >"$OUT/snakemake.log"
for RUNS in "${GROUPS_[@]}"; do
  LEFT=$((END - SECONDS))
  if [ "$LEFT" -le 30 ]; then echo "[sharded_13b] no time left for $RUNS" | tee -a "$OUT/snakemake.log"; continue; fi
  SNAKEMAKE_TIMEOUT_S=$LEFT bash benchmarks/workflow_gpu.sh "$WF" "$RUNS"
  cat "$WF/snakemake.log" >>"$OUT/snakemake.log"
done
# workflow_gpu.sh sets PYTHONPATH for its own children only (the wheels and src/)
export PYTHONPATH=/tmp/site:$PWD/src${PYTHONPATH:+:$PYTHONPATH}
python3 -m hopperlab.cli table sharded "$RESULTS" --json "$OUT/sharded-13b.json" | tee "$OUT/sharded-13b.txt"
cp "$WF/runs.tgz" "$WF/energy.tgz" "$OUT/" 2>/dev/null  # energy.tgz: power traces and windows (issue 36)
cat "$WF/table.txt" "$WF/check.txt" "$WF/energy.txt" >"$OUT/workflow.txt" 2>/dev/null
if [ "${REPEATS:-1}" -ge 3 ]; then  # references from the windows, into a copy: the diff to commit
  cp -r configs/references "$WF/references"
  { echo "== hopperlab references update $RESULTS (REPEATS=$REPEATS)"
    python3 -m hopperlab.cli references update "$RESULTS" --references "$WF/references" \
      --config site=gpu-node scale=full 2>&1; echo "exit $?"
    diff -ru configs/references "$WF/references"; } >>"$OUT/workflow.txt"
fi
# the exit status says whether every run asked for is in the table with status ok
python3 - "$OUT/sharded-13b.json" "${GROUPS_[*]}" <<'PY'
import json, sys
runs = json.load(open(sys.argv[1])) if sys.argv[1] else {}
asked = [k.rsplit("/", 1)[-1] for g in sys.argv[2].split() for k in g.split(",")]
bad = [f"{v}: {runs[v]['status'] if v in runs else 'no record'}" for v in asked
       if runs.get(v, {}).get("status") != "ok"]
print("[sharded_13b] " + ("every run ok" if not bad else "not ok: " + "; ".join(bad)))
sys.exit(1 if bad else 0)
PY
