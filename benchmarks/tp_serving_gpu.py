"""The tensor-parallel serving run without the workflow, for quick looks at the floors on a lent
multi-GPU machine: ``torchrun --nproc-per-node N benchmarks/tp_serving_gpu.py ROW [ROW ...]``,
ROW = prompt_tokens:decode_tokens:concurrency[:num_layers]. Prints rank 0's figures as JSON
lines (the workflow's runs record the same figures: tp_serving.run). Keep NCCL_NVLS_ENABLE=0,
TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and NVSHMEM_DISABLE_NVLS=1 on the lent machines."""

from __future__ import annotations

import json
import os
import sys
import time

import torch
import torch.distributed as dist

from hopperlab.workloads.base import fake_run
from hopperlab.workloads.inference import InferenceParams, tp_serving


class Printer:
    def __init__(self, row: str) -> None:
        self.row, self.tags = row, {}

    def set_tag(self, key: str, value: str) -> None:
        self.tags[key] = value

    def log_step(self, step: int, **figures: float) -> None:
        pass

    def log_metrics(self, figures: dict) -> None:
        if dist.get_rank() == 0:
            print(json.dumps({"row": self.row, **self.tags, **{k: round(v, 4) for k, v in
                                                               figures.items()}}), flush=True)


def main() -> None:
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    spec = fake_run(gpus=1, family="inference")
    for row in sys.argv[1:]:
        prompt, new, batch, *layers = (int(x) for x in row.split(":"))
        params = InferenceParams(study="tensor-parallel", model_shape="llama-2-70b",
                                 compile_kernels=os.environ.get("TP_COMPILE", "1") == "1",
                                 dtype="bfloat16", prompt_tokens=prompt, decode_tokens=new,
                                 concurrency=batch, requests=3, warmup=1,
                                 num_layers=layers[0] if layers else 0)
        t0 = time.perf_counter()
        tp_serving.run(spec, Printer(row), params)
        torch.cuda.empty_cache()
        if dist.get_rank() == 0:
            print(f"[tp_serving_gpu] {row}: {time.perf_counter() - t0:.1f} s in all", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
