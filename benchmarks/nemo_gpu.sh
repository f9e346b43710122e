#!/usr/bin/env bash
# backend: nemo (megatron-core) beside the torch backend on the lent GPU, through the workflow
# with profiler nsys (docs/benchmarks/finetune.md, "The NeMo backend"). From the repository root:
#   bash benchmarks/nemo_gpu.sh OUT
# Needs .whl-nemo/ (scripts/nemo_wheels.sh: the pins of requirements-nemo.txt), .whl-wf/ (the
# workflow's wheels, benchmarks/workflow_gpu.sh) and .device-libs/ (nsys). First it installs
# megatron-core and imports it: where that fails it writes the exact failure (package, version,
# Python, the import's traceback) to $OUT/stack-check.txt and stops before the workflow. Then it
# tries Megatron-Bridge's LoRA import (the issue's first choice; $OUT/bridge-probe.txt), and runs
# the LoRA-7B rows of both backends (RUNS, overridable; the torch offload-activations row is left
# out: its nemo peer is skipped without TransformerEngine), SNAKEMAKE_TIMEOUT_S (300) bounding
# the workflow. After it: each nemo run's log as $OUT/mcore_lora_<variant>_<gpu>.log with the
# command that made it (for tests/data/finetune), every run's nsys summaries
# ($OUT/profiles/<variant>/), and workflow_gpu.sh's table ($OUT/table.txt) and read-back.
set -uo pipefail
OUT=${1:?OUT}
NEMO_WHEELS=${NEMO_WHEELS:-.whl-nemo}
# NEMO_SITE: a folder that already holds megatron-core (no install; e.g. a CPU rehearsal)
SITE=${NEMO_SITE:-/tmp/site-nemo}
E=finetune/lora-llama2-7b
RUNS=${RUNS:-$E/nemo-baseline,$E/nemo-checkpointing,$E/nemo-offload-activations,$E/baseline,$E/checkpointing}
mkdir -p "$OUT"
CHECK="$OUT/stack-check.txt"
{
  echo "date: $(date -u +%FT%TZ)"
  nvidia-smi -L 2>&1
  python3 -c "import sys, torch, transformers, numpy; print('python', sys.version.split()[0], '| torch', torch.__version__, '| transformers', transformers.__version__, '| numpy', numpy.__version__)" 2>&1
  ls -l "$NEMO_WHEELS"/*.whl 2>&1
} >"$CHECK"
if [ -z "${NEMO_SITE:-}" ] && ! python3 -m pip install -q --no-index --no-deps --no-compile \
    --no-cache-dir --upgrade --target "$SITE" "$NEMO_WHEELS"/megatron_core-*.whl >>"$CHECK" 2>&1; then
  echo "stack: FAILED: pip install of $(ls "$NEMO_WHEELS"/megatron_core-*.whl 2>&1)" | tee -a "$CHECK"
  exit 1
fi
if ! PYTHONPATH=$SITE python3 - >>"$CHECK" 2>&1 <<'PY'
import importlib.metadata as md, sys, torch
import megatron.core
from megatron.core.models.gpt import GPTModel  # noqa: F401
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec  # noqa: F401
from megatron.core.pipeline_parallel import get_forward_backward_func  # noqa: F401
print("stack: ok: megatron-core", megatron.core.__version__, "| python", sys.version.split()[0],
      "| torch", torch.__version__)
try:
    print("transformer-engine:", md.version("transformer-engine"))
except md.PackageNotFoundError:
    print("transformer-engine: not installed (offload and fp8 variants are skipped)")
PY
then
  echo "stack: FAILED: import megatron.core (megatron-core from $NEMO_WHEELS, traceback above)" \
    | tee -a "$CHECK"
  tail -25 "$CHECK"
  exit 1
fi
tail -2 "$CHECK"
# Megatron-Bridge's own LoRA (the issue's first choice): does it import in this image?
if compgen -G "$NEMO_WHEELS/megatron_bridge-*.whl" >/dev/null; then
  { echo "\$ pip install --no-deps --target /tmp/site-bridge megatron-core megatron-bridge"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --target /tmp/site-bridge "$NEMO_WHEELS"/megatron_core-*.whl "$NEMO_WHEELS"/megatron_bridge-*.whl
    echo "\$ PYTHONPATH=/tmp/site-bridge python3 -c 'import megatron.bridge.peft.lora'"
    PYTHONPATH=/tmp/site-bridge timeout 60 python3 -c "import megatron.bridge.peft.lora" \
      && echo "bridge: import ok"; } >"$OUT/bridge-probe.txt" 2>&1
  echo "[nemo_gpu] megatron-bridge probe: $(tail -1 "$OUT/bridge-probe.txt")"
fi
export PYTHONPATH=$SITE:$PWD/src
SNAKEMAKE_TIMEOUT_S=${SNAKEMAKE_TIMEOUT_S:-300} RESULTS=${RESULTS:-results-nemo} \
  bash benchmarks/workflow_gpu.sh "$OUT" "$RUNS" \
  "${SUBSTITUTES:-dolly-15k:dolly-synthetic,llama-2-tokenizer:tiny-tokenizer}"
R=${RESULTS:-results-nemo}/$E
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | tr -cd 'A-Za-z0-9' | tr 'A-Z' 'a-z')
for d in "$R"/*/; do
  v=$(basename "$d")
  mkdir -p "$OUT/profiles/$v"
  cp "$d"artifacts/profile/*.csv "$d"artifacts/profile/summary.json "$OUT/profiles/$v/" 2>/dev/null
  cp "$d"metrics.json "$OUT/profiles/$v/" 2>/dev/null
  if [ -f "$d"artifacts/nemo.log ]; then
    cp "$d"artifacts/nemo.log "$OUT/mcore_lora_${v#nemo-}_${GPU:-gpu}.log"
    python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['tags'].get('nemo.command', ''))" \
      "$d"metrics.json >"$OUT/mcore_lora_${v#nemo-}_${GPU:-gpu}.command" 2>/dev/null
  fi
done
python3 - "$R" <<'PY'
import json, pathlib, sys
for f in sorted(pathlib.Path(sys.argv[1]).glob("*/metrics.json")):
    d = json.load(open(f))
    m = d.get("metrics", {})
    print(f"[nemo_gpu] {f.parent.name:26s} {d.get('status')}: tokens/s {m.get('tokens_per_s', '-')}, "
          f"step p50 {m.get('step_time_p50_s', '-')} s, peak {m.get('peak_gpu_allocated_gib', '-')} GiB"
          + (f" | {d['reason'][:300]}" if d.get("reason") else ""))
PY
ls "$OUT"
