#!/usr/bin/env bash
# The torch engine against megatron-core on the lent GPU (issue 51; docs/benchmarks/finetune-torch-engine.md).
# From the repository root, with the workflow's wheels and liger-kernel's
# in .whl-wf/, megatron-core's in .whl-nemo/ and nsys's libraries in .device-libs/ (carried):
#   bash benchmarks/fast_torch_gpu.sh OUT [PHASES]
# PHASES (comma-separated, in this order): check (the card, versions), sameness (Liger's losses
# and gradients against the unfused model, float32, tests/workloads/finetune/test_liger_cuda.py,
# and the attention-call test), ablation (benchmarks/finetune_gpu.py --suite liger: LoRA-7B
# with none, all and all-but-each of Liger's kernels; ABLATION names the variants), workflow
# (RUNS through benchmarks/nemo_gpu.sh with profiler nsys, SNAKEMAKE_TIMEOUT_S bounding it, then
# attention kernel time per step from each run's kernel summary). Everything lands in a work
# folder packed into $OUT/fast_torch.tgz (the device returns at most 8 files) beside the
# workflow's log ($OUT/workflow.log, written as it runs). Leave the command 90 s or more past
# SNAKEMAKE_TIMEOUT_S plus the phases before it: after a stop the read-back, report and tables
# of many runs still take a minute (a call of 2026-12-02 with 30 s to spare returned nothing).
set -uo pipefail
OUT=${1:?OUT}; PHASES=${2:-check,sameness,ablation,workflow}
W=${WORK:-/tmp/fast-torch}
mkdir -p "$W" "$OUT"
has() { [[ ",$PHASES," == *",$1,"* ]]; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl-wf/*.whl .whl-nemo/megatron_core-*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
if has check; then
  { date -u +%FT%TZ
    nvidia-smi --query-gpu=name,memory.total,driver_version,pcie.link.gen.current,pcie.link.width.current,power.limit --format=csv
    python3 -c "import sys, torch, transformers, peft, triton, importlib.metadata as md; print('python', sys.version.split()[0], '| torch', torch.__version__, '| transformers', transformers.__version__, '| peft', peft.__version__, '| triton', triton.__version__, '| liger-kernel', md.version('liger-kernel'))"
  } 2>&1 | tee "$W/stack.txt"
fi
if has sameness; then
  python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/workloads/finetune/test_liger_cuda.py \
    tests/workloads/finetune/test_attention_call.py 2>&1 | tee "$W/sameness.txt" | tail -25
fi
if has ablation; then
  python3 benchmarks/finetune_gpu.py --suite liger --out "$W/ablation" --steps "${STEPS:-5}" \
    --warmup 2 --variants "${ABLATION:-liger-none,liger-all,liger-all-but-rms_norm,liger-all-but-rope,liger-all-but-swiglu,liger-all-but-fused_linear_cross_entropy}" \
    2>&1 | grep -v Warning | tee "$W/ablation.txt" | tail -12
fi
if has workflow; then
  E=finetune/lora-llama2-7b
  NEMO_SITE=/tmp/site WHEELS=none RESULTS=${RESULTS:-results-51} \
    RUNS=${RUNS:-$E/baseline,$E/nemo-baseline} SNAKEMAKE_TIMEOUT_S=${SNAKEMAKE_TIMEOUT_S:-240} \
    bash benchmarks/nemo_gpu.sh "$W/wf" 2>&1 | tee "$OUT/workflow.log" | tail -30
  python3 benchmarks/attention_kernels.py --steps 10 "$W"/wf/profiles/*/ | tee "$W/attention.txt"
fi
tar -czf "$OUT/fast_torch.tgz" -C "$W" . && ls -la "$OUT"
