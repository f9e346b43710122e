"""``backend: nemo``: the same experiment run by NVIDIA NeMo 2 in the site's ``nemo`` image.

``nemo_command`` builds the NeMo-Run CLI call of a LoRA fine-tuning of Llama-2-7B on Dolly
(``nemo llm finetune --factory llama2_7b`` with ``data=dolly``), the run's knobs mapped onto
NeMo's own settings (the table: docs/benchmarks/finetune.md, "The NeMo backend"); ``memory:
managed`` has no NeMo setting and is skipped. ``run_nemo`` runs it (in the image, or through the
site's container runtime and ``containers/nemo.sif``), keeps the log, and ``parse_log`` turns its
per-step lines into the torch backend's metrics (NeMo logs no data-loader waits). It cannot run
on a machine without the image; tests check the command and the parser. Cheap to import (no
torch): the nemo tests run without it.
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from hopperlab.core.rundir import SkipRun
from hopperlab.core.stats import percentile
from hopperlab.node.containers import find_runtime, image_path, job_exec_prefix
from hopperlab.workloads.base import Recording, RunView
from hopperlab.workloads.finetune import FinetuneParams

NEMO_IMAGE = "nemo"
#: Megatron needs cpu_offloading_num_layers < num_layers; Llama-2-7B has 32
LLAMA2_7B_LAYERS = 32

_STEP_RE = re.compile(r"global_step[:=]\s*(?P<step>\d+(?:\.\d+)?)")
_TIME_RE = re.compile(r"train_step_timing in s[:=]\s*(?P<t>\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)")
_LOSS_RE = re.compile(r"reduced_train_loss[:=]\s*(?P<loss>\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)")


@dataclass(frozen=True)
class NemoStep:
    step: int
    step_s: float
    loss: float | None


def nemo_command(params: FinetuneParams, knobs: Any, *, experiment_dir: str,
                 restore_path: str | None = None, num_layers: int = LLAMA2_7B_LAYERS
                 ) -> list[str]:
    """The NeMo fine-tuning command for the run, as an argument list (no shell)."""
    if params.method != "lora":
        raise ValueError("backend nemo: only method: lora (NeMo's LoRA recipe) is built")
    if knobs.memory == "managed":
        raise ValueError("backend nemo: memory: managed has no NeMo setting")
    steps = params.warmup_steps + params.measured_steps
    cmd = ["nemo", "llm", "finetune", "--factory", f"{params.nemo_recipe}", "--yes",
           "trainer.devices=1", "trainer.num_nodes=1",
           f"trainer.max_steps={steps}", "trainer.limit_val_batches=0",
           f"trainer.val_check_interval={steps + 1}", "trainer.log_every_n_steps=1",
           f"log.log_dir={experiment_dir}",
           "data=dolly", f"data.seq_length={params.seq_len}",
           f"data.micro_batch_size={params.micro_batch}",
           f"data.global_batch_size={params.micro_batch}",
           f"data.num_workers={int(knobs.num_workers)}",
           f"data.seed={params.seed}",
           f"peft.dim={params.lora_rank}", f"peft.alpha={params.lora_alpha}",
           f"peft.dropout={params.lora_dropout}",
           "peft.target_modules=[" + ",".join(_nemo_targets(params.lora_targets)) + "]",
           f"optim.config.lr={params.learning_rate}",
           "model.config.tensor_model_parallel_size=1",
           "model.config.pipeline_model_parallel_size=1"]
    if restore_path:
        cmd.append(f"resume.restore_config.path={restore_path}")
    offload = knobs.offload
    if offload != "none":
        cmd += ["model.config.cpu_offloading=True",
                f"model.config.cpu_offloading_num_layers={num_layers - 1}",
                f"model.config.cpu_offloading_activations="
                f"{offload in ('activations', 'both')}",
                f"model.config.cpu_offloading_weights={offload in ('parameters', 'both')}"]
    if params.checkpointing:
        cmd += ["model.config.recompute_granularity=full",
                "model.config.recompute_method=uniform", "model.config.recompute_num_layers=1"]
    if knobs.precision == "fp8":
        cmd.append("trainer.plugins=bf16_with_fp8_mixed")
    else:
        cmd.append("trainer.plugins=bf16_mixed")
    return cmd + list(params.nemo_extra)


def _nemo_targets(targets: Iterable[str]) -> list[str]:
    """peft module names -> NeMo's: q/k/v are one fused ``linear_qkv``, o is ``linear_proj``,
    gate/up are ``linear_fc1``, down is ``linear_fc2``."""
    names = {"q_proj": "linear_qkv", "k_proj": "linear_qkv", "v_proj": "linear_qkv",
             "o_proj": "linear_proj", "gate_proj": "linear_fc1", "up_proj": "linear_fc1",
             "down_proj": "linear_fc2"}
    out: list[str] = []
    for t in targets:
        if t not in names:
            raise ValueError(f"lora_targets: {t!r} has no NeMo equivalent "
                             f"(known: {', '.join(names)})")
        if names[t] not in out:
            out.append(names[t])
    return out


def parse_log(lines: Iterable[str]) -> list[NemoStep]:
    """Per-step figures from a NeMo log (one entry per global step, the last line wins)."""
    steps: dict[int, NemoStep] = {}
    for line in lines:
        t = _TIME_RE.search(line)
        s = _STEP_RE.search(line)
        if not (t and s):
            continue
        loss = _LOSS_RE.search(line)
        step = int(float(s.group("step")))
        steps[step] = NemoStep(step=step, step_s=float(t.group("t")),
                               loss=float(loss.group("loss")) if loss else None)
    return [steps[k] for k in sorted(steps)]


def summarize_log(steps: Sequence[NemoStep], *, warmup_steps: int,
                  tokens_per_step: int) -> dict[str, float]:
    """The torch backend's figures from NeMo's steps (the first ``warmup_steps`` excluded)."""
    measured = list(steps[warmup_steps:])
    if not measured:
        raise ValueError(f"the NeMo log has {len(steps)} step line(s), none after the "
                         f"{warmup_steps} warm-up step(s)")
    times = [s.step_s for s in measured]
    out = {"tokens_per_s": statistics.median(tokens_per_step / t for t in times),
           "step_time_p50_s": percentile(times, 50), "step_time_p90_s": percentile(times, 90),
           "step_time_mean_s": statistics.fmean(times), "measured_steps": float(len(measured)),
           "tokens_per_step": float(tokens_per_step)}
    losses = [s.loss for s in steps if s.loss is not None]
    if len(losses) >= 2:
        out.update(first_loss=losses[0], final_loss=losses[-1], loss_drop=losses[0] - losses[-1])
    return out


def container_prefix(spec: RunView) -> list[str] | None:
    """What goes before the command: [] inside the nemo image already, the runtime's exec
    prefix for ``containers/nemo.sif`` otherwise, None when neither is possible."""
    if os.environ.get("HOPPERLAB_IMAGE") == NEMO_IMAGE:
        return []
    container = spec.site.container
    images_dir = Path(container.image_file).parent if container.image_file else Path("containers")
    image = image_path(NEMO_IMAGE, images_dir)
    runtime = find_runtime(container.runtime)  # the site's setting: auto, or a runtime's name
    if runtime is None or not image.is_file():
        return None
    return job_exec_prefix(runtime, image, [spec.run_dir, spec.site.assets_dir], container.binds,
                           gpus=True)


def run_nemo(spec: RunView, params: FinetuneParams, recorder: Recording) -> None:
    try:
        model_dir = spec.asset_path("model")
    except Exception:  # noqa: BLE001 - NeMo can fetch the model itself
        model_dir = None
    restore = str(model_dir) if model_dir and (Path(model_dir) / "context").is_dir() else None
    try:
        cmd = nemo_command(params, spec.knobs, experiment_dir=str(Path(spec.run_dir) / "nemo"),
                           restore_path=restore)
    except ValueError as exc:
        raise SkipRun(str(exc)) from None
    prefix = container_prefix(spec)
    if prefix is None:
        raise SkipRun("backend nemo: not inside the nemo image, and no container runtime with "
                      "containers/nemo.sif here (build it: hopperlab containers "
                      "build nemo)")
    full = prefix + cmd
    recorder.set_tag("nemo.command", " ".join(full))
    log_path = recorder.artifact_path("nemo.log")
    with open(log_path, "w") as log:
        proc = subprocess.run(full, stdout=log, stderr=subprocess.STDOUT, text=True)
    lines = log_path.read_text().splitlines()
    if proc.returncode != 0:
        tail = "\n".join(lines[-20:])
        raise RuntimeError(f"NeMo exited with status {proc.returncode}; log tail:\n{tail}")
    steps = parse_log(lines)
    for s in steps:
        figures = {"step_time_s": s.step_s,
                   "tokens_per_s": params.seq_len * params.micro_batch / s.step_s}
        if s.loss is not None:
            figures["loss"] = s.loss
        recorder.log_step(s.step, **figures)
    final = summarize_log(steps, warmup_steps=params.warmup_steps,
                          tokens_per_step=params.seq_len * params.micro_batch)
    recorder.log_metrics(final)
