#!/usr/bin/env bash
# References from repeats for the lent machine this runs on, then a fresh check against them
# (issue 36 item 4; docs/benchmarks/noise.md "References for every lent machine"). One GPU call,
# from the repository root:
#   bash benchmarks/references_gpu.sh OUT
# On a node of 2+ GPUs: first the multi-GPU rows ($MULTI, both GPUs, `--resources gpus=2`,
# machine 2x<gpu>-...), then the host-bound runs of the lanes alone on GPU 0 (phase `host`: the
# runs of $LANE0 and $LANE1 that match a pattern of $HOST_BOUND, whose judged figure is a host
# link or host CPU one; beside the other lane such a figure moves with what that lane does: the
# 2026-11-28 call's false bidir-pinned regression, docs/benchmarks/noise.md), then two lanes side
# by side, GPU 0 ($LANE0) and GPU 1 ($LANE1), of the rest: each 1-GPU job sees one GPU, so its
# machine is the 1-GPU name (h200-141g-pcie5-x86_64; the local executor takes a job's GPUs from
# the caller's CUDA_VISIBLE_DEVICES). On a 1-GPU node: one lane of $LANE0 then $LANE1 (nothing
# runs beside it). Each phase is two passes through the workflow (snakemake, the site's local
# executor, scale full, profiler none):
#   1. the references pass: each run $PROCESSES times (default 3), each time a new process (its
#      own snakemake call and job) of `--config repeats=$REPEATS` windows (multi:
#      $MULTI_REPEATS), into $WORK/<lane>-ref-1 ... -ref-$PROCESSES. Windows of one process do
#      not sample what changes between processes (2026-11-28: TPC-H host-pinned q6 within 0.14 %
#      in three windows, +5.5 % in the next process; h2d-pageable -17 %), so the reference is
#      made from the processes' medians (`hopperlab references update A B C`). PROCESSES=1 is the
#      old way: one process, its REPEATS (>= 3) windows as the samples. The runs that ended ok
#      with REPEATS samples in every process (tag `repeats` and samples.jsonl, read back:
#      benchmarks/references_gpu.py measured) go on to
#   2. a fresh run of each, `repeats=1` (what `hopperlab check` runs on a new node), into
#      $WORK/<lane>-fresh.
# Each run is its own snakemake call (the run's metrics.json as the target), in the listed order
# (a run's processes back to back): the lists are priorities, and the deadline leaves the last
# ones unstarted. Then `hopperlab references update` over each phase's -ref-* folders into a copy
# of configs/references ($WORK/references), and `hopperlab check` of every -fresh folder against
# that copy.
# Time: the host phase gets $HOST_SHARE % of what the multi phase leaves (all of it when the
# lanes keep no run); $REF_SHARE % of a phase for the references pass, the rest for the fresh
# runs (`run_bounded`, benchmarks/bounded.sh, stops a run and its jobs at its pass's deadline;
# a later run is not started): what did not finish makes no reference and says so; everything ends by $BUDGET_S seconds after the start. Energy probes
# first (PROBE=1, the default where nvidia-smi lists a GPU): benchmarks/energy_probe.py on GPU 0,
# bf16 and fp8, whose TFLOP per joule is the ceiling energy.txt judges each run's work per joule
# by. Six files come back in OUT, eight with the probes:
#   script.log       the timeline, the node, each pass's exit, why a run made no reference
#   check.txt        each fresh folder's `hopperlab check` (verdicts, exit code) and the
#                    references written (value, spread, n, min_effect per run and metric)
#   references.diff  `diff -u configs/references $WORK/references` (what to commit)
#   references.tgz   the updated reference files
#   energy.txt       benchmarks/energy_table.py of every fresh and -ref folder (2-GPU rows: the
#                    "N GPUs summed" label, counter vs trace)
#   runs.tgz         every run's small files (records, samples, steps; no profiles), the
#                    snakemake logs, the JUnit files
#   probe-bf16.json  PROBE=1: benchmarks/energy_probe.py --seconds 3 on GPU 0 (its JSON; absent
#   probe-fp8.json   or empty: the probe failed, script.log says its exit); --dtype fp8
# FAMILIES: the config's families (e.g. with selftest). Rehearsal on a CPU machine:
#   SITE=local SCALE=smoke NGPU=2 SUBS= FAMILIES=selftest,membench,inference LANE0=... LANE1=...
#   MULTI=inference/tp-long-context/prompt-3k-c8 (2 processes over gloo)
# (tests/platform/test_references_gpu_script.py).
set -uo pipefail
OUT=${1:?OUT}
T0=$SECONDS
WHEELS=${WHEELS:-.whl-wf}
SITE=${SITE:-gpu-node}; SCALE=${SCALE:-full}
SUBS=${SUBS-dolly-15k:dolly-synthetic,llama-2-tokenizer:tiny-tokenizer}
PROCESSES=${PROCESSES:-3}    # independent processes per run in the references pass
REPEATS=${REPEATS:-2}; MULTI_REPEATS=${MULTI_REPEATS:-2}  # windows per process
BUDGET_S=${BUDGET_S:-500}     # the script's end (the call's limit: 540 s)
MULTI_S=${MULTI_S:-330}       # the multi-GPU phase's share of it (2+ GPUs)
REF_SHARE=${REF_SHARE:-60}    # % of a lane's time for the repeats pass
MULTI_REF_SHARE=${MULTI_REF_SHARE:-68}  # the same for the multi-GPU phase (the 13B's windows)
TAIL_S=${TAIL_S:-30}          # kept for references update, check and the tarballs
MULTI=${MULTI-finetune/full-llama2-13b-sharded/fsdp2,inference/tp-long-context/prompt-3k-c8-2gpu}
LANE0=${LANE0-membench/copy/h2d-pinned,membench/copy/d2h-pinned,membench/copy/bidir-pinned,membench/copy/h2d-pageable,finetune/lora-llama2-7b/baseline,finetune/lora-llama2-7b/fp8}
LANE1=${LANE1-recommender/latency/gpu,recommender/latency/cpu-only,finetune/lora-llama2-7b/recompute-elementwise,inference/weight-streaming/resident,finetune/full-1b/bf16-compile}
# runs judged on a host link or host CPU figure (shell patterns): alone on the node, never
# beside a lane
# (weight streaming: its decode is launch-bound on the host CPU, 2026-11-28 11:25 UTC: 19.4 vs
# 50.7 tokens/s with and without the other lane's compile beside it)
# the 13B rows with a CPU optimizer: AdamW on the host's cores and memory bandwidth (torchao's
# row read +12 % on a host of 64 against 95 GB/s triad, docs/benchmarks/distributed.md round 5)
HOST_BOUND=${HOST_BOUND-membench/copy/*,recommender/*,database/tpch/host-*,inference/kv-cache/offload,inference/weight-streaming/*,finetune/full-llama2-13b-sharded/*offload*}
HOST_SHARE=${HOST_SHARE:-60}  # % of the time after the multi phase for the host-bound phase
W=${WORK:-/tmp/refs}
# a reference needs 3 independent processes (the spread between them), or one process of 3+
# windows (PROCESSES=1: the spread between its windows)
case "$PROCESSES" in
  1) [ "$REPEATS" -ge 3 ] && { [ -z "$MULTI" ] || [ "$MULTI_REPEATS" -ge 3 ]; } || {
       echo "[references] PROCESSES=1 needs REPEATS (and with MULTI, MULTI_REPEATS) of 3 or more (one process's windows are its samples)" >&2; exit 2; } ;;
  ''|0|2|*[!0-9]*)
     echo "[references] PROCESSES=$PROCESSES: 1 (the windows of one process) or 3 or more (independent processes)" >&2; exit 2 ;;
esac
rm -rf "$W"; mkdir -p "$OUT" "$W"
LOG=$W/script.log
say() { echo "[references $((SECONDS - T0))s] $*" | tee -a "$LOG"; }

if compgen -G "$WHEELS/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$WHEELS"/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD/src
else
  export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
NGPU=${NGPU:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')}
# the energy probes: on by default where nvidia-smi itself lists a GPU (not $NGPU, which a CPU
# rehearsal sets); PROBE_S bounds each
PROBE=${PROBE:-$( [ "$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')" -gt 0 ] && echo 1 || echo 0)}
PROBE_S=${PROBE_S:-60}
{ date -u; git log -1 --format='commit %h %s' 2>/dev/null; lscpu | grep -E 'Model name|^CPU\(s\)'
  nvidia-smi --query-gpu=index,name,memory.total,driver_version,power.limit \
    --format=csv,noheader 2>&1; } >>"$LOG"
say "GPUs $NGPU; site $SITE, scale $SCALE; $PROCESSES processes of $REPEATS repeats a run (multi $MULTI_REPEATS); budget ${BUDGET_S}s"
cp -r configs/references "$W/references"

# shellcheck source=benchmarks/bounded.sh
. "$(dirname "$0")/bounded.sh"  # run_bounded: a pass's deadline ends its jobs too
SERVER=
# the site's tracking server (uploads go to it as runs settle); a carry without MLflow (WHEELS=
# .whl-tpch: DuckDB in place of MLflow's 20 MB, the 64 MiB carry holds one or the other) has
# none: each run's upload says so in one line and leaves the run on disk for `hopperlab sync`
if [ "$SITE" = gpu-node ] && ! python3 -c 'import mlflow' 2>/dev/null; then
  say "no mlflow in this python: no tracking server, the runs stay on disk (hopperlab sync)"
elif [ "$SITE" = gpu-node ]; then
  # shellcheck source=benchmarks/mlflow_server.sh
  . "$(dirname "$0")/mlflow_server.sh"
  start_mlflow_server "$W/mlflow" "$W/mlflow-server.log" 90
  say "mlflow server up"
fi

# the node's matmul probes before any run (GPU 0 alone): the ceiling of work per joule that
# energy.txt judges the runs by (benchmarks/energy_table.py --probe, --probe-fp8 for fp8 runs)
PROBE_ARGS=()
if [ "$PROBE" = 1 ]; then
  for dtype in bf16 fp8; do
    CUDA_VISIBLE_DEVICES=0 timeout "$PROBE_S" python3 benchmarks/energy_probe.py --seconds 3 \
      --dtype "$dtype" >"$W/probe-$dtype.json" 2>>"$LOG"
    say "energy probe $dtype: exit $?"
    if [ -s "$W/probe-$dtype.json" ] && python3 -c 'import json, sys; json.load(open(sys.argv[1]))' \
        "$W/probe-$dtype.json" 2>>"$LOG"; then  # a probe cut short is no ceiling
      cp "$W/probe-$dtype.json" "$OUT/"
      [ "$dtype" = bf16 ] && PROBE_ARGS+=(--probe "$W/probe-bf16.json")
      [ "$dtype" = fp8 ] && PROBE_ARGS+=(--probe-fp8 "$W/probe-fp8.json")
    fi
  done
fi

# one run through the workflow: FOLDER CUDA_VISIBLE_DEVICES GPUS RUN REPEATS UNTIL_S (its own
# snakemake, the run's metrics.json as the target: runs start in the listed order, and the
# deadline leaves the later ones unstarted instead of cutting a pass anywhere)
pass() {
  local name=$1 cvd=$2 gpus=$3 run=$4 repeats=$5 until=$6
  local left=$((until - (SECONDS - T0)))
  if [ "$left" -lt 15 ]; then
    say "$name $run: not started (${left}s left)"; return 1
  fi
  say "$name $run: start (GPUs $cvd, repeats $repeats, ${left}s left)"
  local t=$SECONDS
  run_bounded "$left" env CUDA_VISIBLE_DEVICES="$cvd" python3 -m snakemake --cores all \
    --resources "gpus=$gpus" --scheduler greedy --nolock \
    --config "site=$SITE" "scale=$SCALE" profiler=none "results_dir=$W/$name" "only=$run" \
    "repeats=$repeats" ${SUBS:+"asset_substitutes=$SUBS"} ${FAMILIES:+"families=$FAMILIES"} \
    -- "$W/$name/$run/metrics.json" >>"$W/$name.snakemake.log" 2>&1
  local rc=$?
  say "$name $run: snakemake exit $rc after $((SECONDS - t))s$([ $rc = 124 ] && echo ' (stopped at its deadline)')"
}

# a phase: the references pass ($PROCESSES processes a run), then the fresh pass of what it
# measured. NAME CUDA_VISIBLE_DEVICES GPUS RUNS REPEATS REF_UNTIL FRESH_UNTIL
phase() {
  local name=$1 cvd=$2 gpus=$3 runs=$4 repeats=$5 ref_until=$6 fresh_until=$7 run good p
  local refs=()
  [ -n "$runs" ] || return 0
  for p in $(seq 1 "$PROCESSES"); do refs+=("$W/$name-ref-$p"); done
  for run in ${runs//,/ }; do
    for p in $(seq 1 "$PROCESSES"); do  # a process not started: no later run starts either
      pass "$name-ref-$p" "$cvd" "$gpus" "$run" "$repeats" "$ref_until" || break 2
    done
  done
  good=$(python3 benchmarks/references_gpu.py measured "${refs[@]}" --repeats "$repeats" \
    2>>"$LOG")
  say "$name: measured (processes $PROCESSES, repeats $repeats each): ${good:-none}"
  for run in ${good//,/ }; do
    pass "$name-fresh" "$cvd" "$gpus" "$run" 1 "$fresh_until" || break
  done
}

# the runs of a comma list that match (host) or do not match (lane) a $HOST_BOUND pattern
IFS=, read -ra HOST_PATS <<<"$HOST_BOUND"
pick() {
  local want=$1 run pat hit out=
  for run in ${2//,/ }; do
    hit=lane
    for pat in "${HOST_PATS[@]}"; do case $run in $pat) hit=host; break;; esac; done
    [ "$hit" = "$want" ] && out=$out,$run
  done
  echo "${out#,}"
}

now() { echo $((SECONDS - T0)); }
END=$((BUDGET_S - TAIL_S))
if [ "$NGPU" -ge 2 ] && [ -n "$MULTI" ]; then
  M_END=$(( $(now) + MULTI_S )); [ "$M_END" -gt "$END" ] && M_END=$END
  phase multi 0,1 2 "$MULTI" "$MULTI_REPEATS" \
    $(( $(now) + (M_END - $(now)) * MULTI_REF_SHARE / 100 )) "$M_END"
fi
if [ "$NGPU" -ge 2 ]; then
  HOST=$(pick host "$LANE0,$LANE1"); LANE0=$(pick lane "$LANE0"); LANE1=$(pick lane "$LANE1")
  say "host-bound, alone on GPU 0 first: ${HOST:-none}; then lanes gpu0: ${LANE0:-none}; gpu1: ${LANE1:-none}"
  if [ -n "$HOST" ]; then
    H_END=$END
    [ -n "$LANE0$LANE1" ] && H_END=$(( $(now) + (END - $(now)) * HOST_SHARE / 100 ))
    phase host 0 1 "$HOST" "$REPEATS" $(( $(now) + (H_END - $(now)) * REF_SHARE / 100 )) "$H_END"
  fi
fi
REF_END=$(( $(now) + (END - $(now)) * REF_SHARE / 100 ))
if [ "$NGPU" -ge 2 ]; then
  phase gpu0 0 1 "$LANE0" "$REPEATS" "$REF_END" "$END" &
  L0=$!
  sleep 3   # the first lane's snakemake takes the asset locks first
  phase gpu1 1 1 "$LANE1" "$REPEATS" "$REF_END" "$END" &
  L1=$!
  wait $L0; wait $L1
else
  phase gpu0 0 1 "$(echo "$LANE0,$LANE1" | sed 's/^,//; s/,$//')" "$REPEATS" "$REF_END" "$END"
fi

# references from each phase's -ref-* folders (one independent process each) into the copy,
# then every fresh folder checked against it
for name in multi host gpu0 gpu1; do
  refs=(); for ref in "$W/$name"-ref-*; do [ -d "$ref" ] && refs+=("$ref"); done
  [ "${#refs[@]}" -gt 0 ] || continue
  python3 -m hopperlab.cli references update "${refs[@]}" --references "$W/references" \
    --config "site=$SITE" "scale=$SCALE" ${FAMILIES:+"families=$FAMILIES"} >>"$LOG" 2>&1
  say "references update $name (${#refs[@]} processes): exit $?"
done
{
  for fresh in "$W"/*-fresh; do
    [ -d "$fresh" ] || continue
    echo "== hopperlab check $(basename "$fresh") --references <the updated copy>"
    python3 -m hopperlab.cli check "$fresh" --references "$W/references" \
      --config "site=$SITE" "scale=$SCALE" ${FAMILIES:+"families=$FAMILIES"} --junit "$W/$(basename "$fresh").junit.xml" 2>&1
    echo "exit $?"
  done
  echo "== references written from repeats (machine, run, metric: value, spread, n, min_effect)"
  python3 benchmarks/references_gpu.py coverage --references "$W/references" --ref "$W"/*-ref-*
} >"$OUT/check.txt" 2>&1
say "checked: $(grep -c '^exit 0' "$OUT/check.txt") of $(grep -c '^exit' "$OUT/check.txt") fresh folders exit 0"
diff -ru configs/references "$W/references" >"$OUT/references.diff"
tar -czf "$OUT/references.tgz" -C "$W" references
for dir in "$W"/*-ref-* "$W"/*-fresh; do
  [ -d "$dir" ] || continue
  echo "== $(basename "$dir")"; python3 benchmarks/energy_table.py "$dir" ${PROBE_ARGS[@]+"${PROBE_ARGS[@]}"} 2>&1
done >"$OUT/energy.txt"
[ -n "$SERVER" ] && kill "$SERVER" 2>/dev/null
tar -czf "$OUT/runs.tgz" -C "$W" --exclude='artifacts' --exclude='attempts' --exclude='submitit' \
  --exclude='mlflow*' --exclude='*.pt' --exclude='references' . 2>/dev/null
say "done"
cp "$LOG" "$OUT/script.log"
grep -E "^exit|REGRESSION|regression" "$OUT/check.txt" | head -20
ls "$OUT"
