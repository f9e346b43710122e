"""A results folder holding a run that reads DIFFERENT, written by hand the way the recorder
writes it: a finetune baseline, an honest variant (``offload-activations``: the same losses and
gradient norms, so ``same``) and the fault of issue 47, ``skipped-backward`` (the losses
recorded, its gradient norm 0 at every step: its backward never ran) that reads twice as fast.
Each run measured in three windows (``samples.jsonl``), as a reference needs. The tests of
where the verdict must reach (references, charts, pages, MLflow) read this folder; the real
fault, injected into a real training, is in test_correctness_faults.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from tests.results.run_dirs import write_run

EXPERIMENT = "finetune/lora-llama2-7b"
BASELINE, HONEST, WRONG = "baseline", "offload-activations", "skipped-backward"
LOSSES = (6.25, 6.11, 6.04, 5.98)
GRADS = (1.5, 1.4, 1.3, 1.2)
#: tokens/s of each window: the fault reads twice as fast as the baseline
SPEEDS = {BASELINE: (100.0, 101.0, 99.0), HONEST: (95.0, 96.0, 94.0),
          WRONG: (200.0, 202.0, 198.0)}


def write_finetune(results: Path, variant: str, speeds: Sequence[float],
                   grads: Sequence[float] = GRADS, offload: str = "none",
                   machine: str = "m1", memory_gib: float = 4.0,
                   params: dict | None = None) -> Path:
    """One finetune run with its spec, record, samples and steps (``params``: more params)."""
    median = sorted(speeds)[len(speeds) // 2]
    run_dir = write_run(
        results, f"{EXPERIMENT}/{variant}", samples=speeds, machine=machine,
        record={"metrics": {"tokens_per_s": median, "tokens_per_s_n": float(len(speeds)),
                            "peak_gpu_allocated_gib": memory_gib},
                "tags": {"repeats": str(len(speeds)), "repeat_unit": "windows",
                         "machine": machine}},
        spec={"baseline": BASELINE, "headline_metrics": ["tokens_per_s"],
              "params": {"dtype": "float32", "backend": "torch", **(params or {})},
              "knobs": {"offload": offload}})
    (run_dir / "samples.jsonl").write_text("".join(
        json.dumps({"repeat": i, "metrics": {"tokens_per_s": v}}) + "\n"
        for i, v in enumerate(speeds)))
    with open(run_dir / "steps.jsonl", "w") as fh:
        for i, loss in enumerate(LOSSES):
            fh.write(json.dumps({"step": i, "time": 0.0,
                                 "metrics": {"loss": loss, "grad_norm": grads[i]}}) + "\n")
    return run_dir


def write_folder(results: Path, machine: str = "m1", wrong: bool = True) -> Path:
    """``results`` with the baseline, the honest variant and (``wrong``) the fault."""
    write_finetune(results, BASELINE, SPEEDS[BASELINE], machine=machine)
    write_finetune(results, HONEST, SPEEDS[HONEST], offload="activations", machine=machine,
                   memory_gib=2.0)
    if wrong:
        write_finetune(results, WRONG, SPEEDS[WRONG], grads=(0.0,) * len(LOSSES),
                       offload="activations", machine=machine, memory_gib=1.0)
    return results
