#!/usr/bin/env bash
# References that hold for the lent GPU machine this runs on, then a fresh check against them:
#   bash benchmarks/references_gpu.sh OUT          (from the repository root, on the GPU node)
# The method is the product's (docs/commands.md#references): ONE workflow call measures $RUNS
# with processes=$PROCESSES (each run in 3 independent jobs of $REPEATS windows), host-bound
# runs alone on the node, each 1-GPU job on a GPU of its own (--resources gpus=$NGPU: the local
# backend's slot pool), 2-GPU rows on both; `hopperlab references update` writes references
# from the spread between the processes into a copy of configs/references; then a fresh call
# (one process a run) is checked against that copy. What is here is what a lent machine needs
# and a cluster does not: wheels ($WHEELS), a tracking server on 127.0.0.1 (site gpu-node), a
# deadline (SNAKEMAKE_TIMEOUT_S, FRESH_TIMEOUT_S: bounded.sh ends the jobs with it), NVLink
# multicast off. OUT gets script.log, check.txt (references update, then the check: verdicts,
# exit codes), references.diff, references.tgz, energy.txt (`hopperlab table energy` of the
# references runs, judged against the matmul probe runs), runs.tgz (records, samples, logs);
# its CPU rehearsal: tests/platform/test_references_gpu_script.py.
set -uo pipefail
OUT=${1:?usage: bash benchmarks/references_gpu.sh OUT}
WHEELS=${WHEELS:-.whl-wf}; SITE=${SITE:-gpu-node}; SCALE=${SCALE:-full}
SUBS=${SUBS-dolly-15k:dolly-synthetic,llama-2-tokenizer:tiny-tokenizer}
PROCESSES=${PROCESSES:-3}; REPEATS=${REPEATS:-2}
RUNS=${RUNS-membench/matmul/bf16,membench/matmul/fp8,membench/copy/h2d-pinned,membench/copy/d2h-pinned,membench/copy/bidir-pinned,membench/copy/h2d-pageable,finetune/lora-llama2-7b/baseline,finetune/lora-llama2-7b/fp8,recommender/latency/gpu,recommender/latency/cpu-only,inference/weight-streaming/resident,inference/tp-long-context/prompt-3k-c8-2gpu}
SNAKEMAKE_TIMEOUT_S=${SNAKEMAKE_TIMEOUT_S:-400}; FRESH_TIMEOUT_S=${FRESH_TIMEOUT_S:-100}
W=${WORK:-/tmp/refs}; T0=$SECONDS; rm -rf "$W"; mkdir -p "$OUT" "$W"; LOG=$W/script.log
say() { echo "[references $((SECONDS - T0))s] $*" | tee -a "$LOG"; }
if compgen -G "$WHEELS/*.whl" >/dev/null; then  # once a warm machine: the next call skips it
  HAVE=$(ls "$WHEELS" | md5sum); [ "$(cat /tmp/site/.wheels 2>/dev/null)" = "$HAVE" ] || {
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$WHEELS"/*.whl && echo "$HAVE" >/tmp/site/.wheels || exit 1; }
  export PYTHONPATH=/tmp/site:$PWD/src
else export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}; fi
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
NGPU=${NGPU:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')}
{ date -u; git log -1 --format='commit %h %s' 2>/dev/null; nvidia-smi --query-gpu=index,name,\
memory.total,driver_version,power.limit --format=csv,noheader 2>&1; } >>"$LOG"
. "$(dirname "$0")/bounded.sh"; . "$(dirname "$0")/mlflow_server.sh"; SERVER=
if [ "$SITE" = gpu-node ] && python3 -c 'import mlflow' 2>/dev/null; then  # uploads go there
  start_mlflow_server "$W/mlflow" "$W/mlflow-server.log" 90 && say "mlflow server up"; fi
CONFIG=("site=$SITE" "scale=$SCALE" profiler=none "only=$RUNS" ${SUBS:+"asset_substitutes=$SUBS"}
        ${FAMILIES:+"families=$FAMILIES"})
workflow() {  # NAME SECONDS CONFIG...: one snakemake call into $W/NAME, bounded with its jobs
  local name=$1 s=$2; shift 2
  say "$name: snakemake --config ${CONFIG[*]} $* (${s}s)"
  run_bounded "$s" python3 -m snakemake --cores all --resources "gpus=$NGPU" --keep-going \
    --nolock --scheduler greedy --config "${CONFIG[@]}" "results_dir=$W/$name" "$@" >"$W/$name.snakemake.log" 2>&1
  say "$name: snakemake exit $?"
}
workflow ref "$SNAKEMAKE_TIMEOUT_S" "processes=$PROCESSES" "repeats=$REPEATS"
cp -r configs/references "$W/references"
workflow fresh "$FRESH_TIMEOUT_S" repeats=1
{ echo "== hopperlab references update ref"; python3 -m hopperlab.cli references update "$W/ref" \
    --references "$W/references" --config "${CONFIG[@]}"; echo "exit $?"
  echo "== hopperlab check fresh --references <the updated copy>"
  python3 -m hopperlab.cli check "$W/fresh" --references "$W/references" --config "${CONFIG[@]}" \
    --junit "$W/fresh.junit.xml"; echo "exit $?"; } >"$OUT/check.txt" 2>&1
say "references update, check: $(grep '^exit' "$OUT/check.txt" | tr '\n' ' ')"
diff -ru configs/references "$W/references" >"$OUT/references.diff"
tar -czf "$OUT/references.tgz" -C "$W" references
python3 -m hopperlab.cli table energy "$W/ref" >"$OUT/energy.txt" 2>&1  # against membench/matmul
[ -n "$SERVER" ] && kill "$SERVER" 2>/dev/null; tar -czf "$OUT/runs.tgz" -C "$W" --exclude=artifacts \
  --exclude=attempts --exclude=submitit --exclude='mlflow*' --exclude='*.pt' --exclude=references .
cp "$LOG" "$OUT/script.log"; ls "$OUT"
