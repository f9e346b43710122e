"""Per step: attention kernel time, all kernel time and launches, from each run's Nsight
Systems kernel summary (``cuda_gpu_kern_sum.csv``, the measured steps only: the workflow's
nsys capture is the measured region), for the torch-vs-megatron-core comparison of
docs/benchmarks/finetune-torch-engine.md (issue 51: attention within 1.3x of megatron-core's).

    python3 benchmarks/attention_kernels.py --steps 10 OUT/profiles/*/

A kernel is attention's when its name says so (cuDNN's ``sdpa``/``flash``/``fmha``, PyTorch's
flash and memory-efficient kernels); Liger's kernels are counted apart (``liger`` or Triton's
``_rms_norm``/``_triton_rope``/``_swiglu``/``cross_entropy`` kernels).
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
from pathlib import Path

ATTENTION = re.compile(r"sdpa|flash|fmha|attention|attn", re.I)
LIGER = re.compile(r"liger|_rms_norm_|_triton_rope|_swiglu_|cross_entropy_kernel|"
                   r"element_mul_kernel", re.I)
GEMM = re.compile(r"nvjet|gemm|cutlass|sm90_xmma", re.I)


def column(row: dict[str, str], prefix: str) -> float:
    return float(next(v for k, v in row.items() if k.startswith(prefix)).replace(",", ""))


def per_step(summary: Path, steps: int) -> dict[str, float]:
    out = {"kernel_ms": 0.0, "launches": 0.0, "attention_ms": 0.0, "attention_launches": 0.0,
           "gemm_ms": 0.0, "gemm_launches": 0.0, "liger_ms": 0.0}
    with summary.open() as fh:
        for row in csv.DictReader(fh):
            total, n, name = column(row, "Total Time"), column(row, "Instances"), row["Name"]
            out["kernel_ms"] += total / 1e6
            out["launches"] += n
            if ATTENTION.search(name):
                out["attention_ms"] += total / 1e6
                out["attention_launches"] += n
            elif LIGER.search(name):
                out["liger_ms"] += total / 1e6
            elif GEMM.search(name):
                out["gemm_ms"] += total / 1e6
                out["gemm_launches"] += n
    return {k: v / steps for k, v in out.items()}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10, help="measured steps in the capture")
    ap.add_argument("folders", nargs="+", type=Path)
    args = ap.parse_args(argv)
    cols = ("kernel_ms", "launches", "attention_ms", "attention_launches", "gemm_ms",
            "gemm_launches", "liger_ms")
    print(f"{'run':28} " + " ".join(f"{c:>18}" for c in cols))
    for folder in args.folders:
        summary = folder / "cuda_gpu_kern_sum.csv"
        if not summary.exists():
            print(f"{folder.name:28} (no cuda_gpu_kern_sum.csv)")
            continue
        fig = per_step(summary, args.steps)
        print(f"{folder.name:28} " + " ".join(f"{fig[c]:18.1f}" for c in cols))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
