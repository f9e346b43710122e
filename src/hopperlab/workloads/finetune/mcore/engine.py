"""``backend: nemo``: the LoRA fine-tuning run by NVIDIA's training stack (megatron-core).

NeMo's LLM recipes moved to Megatron-Bridge over megatron-core; Megatron-Bridge 0.6.2 pins
transformers <= 5.12.1 (the GPU image has 5.17) and TransformerEngine is 264 MiB (over the
carry), so this backend builds megatron-core's own ``GPTModel`` with its non-TransformerEngine
layer spec (``get_gpt_layer_local_spec``), the Llama shape of the run's model asset with random
weights, and a LoRA on NeMo's targets for the torch backend's (q/k/v -> ``linear_qkv``, o ->
``linear_proj``, same rank and alpha). One step is megatron-core's schedule
(``get_forward_backward_func``). Megatron-core is a library with no trainer log, so the runner
(``mcore_lora.py``, a child process: megatron's global parallel state stays out of the job)
prints Megatron-LM's training-log lines (``iteration N/M | ... elapsed time per iteration (ms)``
and ``memory (MB) | ... max allocated``), and ``parse_log`` reads them back into the torch
backend's metrics; its markers around the measured steps open the measured window here, where
the energy meter listens (``run_logged``); under ``profiler: nsys`` the child is traced too and
opens the capture (``measured_region``) as the torch backend does. The knobs become megatron-core's settings (``mcore_settings``): checkpointing
is its full uniform recompute (with the block's input made to require grad: see
``mcore_lora``); bf16 its ``bf16``/``params_dtype``; its CPU offloading of
activations (``cpu_offloading`` and ``fine_grained_activation_offloading`` alike) and FP8 need
TransformerEngine and are skipped, with that reason, where it is missing. Cheap to import (no
torch, no megatron): the CPU tests (Python 3.11, no megatron-core) check the settings and the
parser.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from hopperlab.core.rundir import SkipRun
from hopperlab.core.window import MEASURED, announce
from hopperlab.core.stats import percentile
from hopperlab.workloads.base import Recording, RunView, spec_params
from hopperlab.workloads.finetune import data
from hopperlab.workloads.finetune.mcore.params import McoreParams

RUNNER = "hopperlab.workloads.finetune.mcore.runner"
#: megatron-core's submodules that offload activations import TransformerEngine's cpu_offload
TE_MODULE = "transformer_engine"
MIB_PER_GIB = 1024.0
#: the runner's lines around its measured steps (after the device is synchronised)
WINDOW_START = "window: measured start"
WINDOW_END = "window: measured end"

# Megatron-LM's training log: " [time] iteration    3/   13 | consumed samples: ... |
# elapsed time per iteration (ms): 702.3 | ... | lm loss: 2.1E+00 | ..."
_ITER_RE = re.compile(r"iteration\s+(?P<it>\d+)\s*/\s*(?P<of>\d+)\s*\|")
_TIME_RE = re.compile(r"elapsed time per iteration \(ms\):\s*(?P<ms>[0-9.]+(?:[eE][-+]?\d+)?)")
_LOSS_RE = re.compile(r"lm loss:\s*(?P<loss>[-0-9.]+(?:[eE][-+]?\d+)?)")
_GRAD_NORM_RE = re.compile(r"grad norm:\s*(?P<g>[-0-9.]+(?:[eE][-+]?\d+)?)")
# Megatron-LM's report_memory: "[Rank 0] (after 13 iterations) memory (MB) | allocated: ... |
# max allocated: 35123.4 | reserved: ... | max reserved: ..."
_MEM_RE = re.compile(r"memory \(MB\).*?\|\s*max allocated:\s*(?P<max>[0-9.]+)")
_MAX_RESERVED_RE = re.compile(r"max reserved:\s*(?P<max>[0-9.]+)")

#: peft module names -> megatron-core's (NeMo's LoRA target names)
_TARGETS = {"q_proj": "linear_qkv", "k_proj": "linear_qkv", "v_proj": "linear_qkv",
            "o_proj": "linear_proj", "gate_proj": "linear_fc1", "up_proj": "linear_fc1",
            "down_proj": "linear_fc2"}


@dataclass(frozen=True)
class MegatronStep:
    step: int
    step_s: float
    loss: float | None
    #: the adapters' gradient norm (runners before it was printed: None)
    grad_norm: float | None = None


def mcore_targets(targets: Iterable[str]) -> list[str]:
    """peft module names -> megatron-core's: q/k/v are one fused ``linear_qkv``, o is
    ``linear_proj``, gate/up are ``linear_fc1``, down is ``linear_fc2``."""
    out: list[str] = []
    for t in targets:
        if t not in _TARGETS:
            raise ValueError(f"lora_targets: {t!r} has no megatron-core equivalent "
                             f"(known: {', '.join(_TARGETS)})")
        if _TARGETS[t] not in out:
            out.append(_TARGETS[t])
    return out


def model_shape(config: dict[str, Any]) -> dict[str, Any]:
    """The Llama shape of a Hugging Face ``config.json`` in megatron-core's terms."""
    try:
        heads = int(config["num_attention_heads"])
        return {"num_layers": int(config["num_hidden_layers"]),
                "hidden_size": int(config["hidden_size"]),
                "num_attention_heads": heads,
                "num_query_groups": int(config.get("num_key_value_heads") or heads),
                "ffn_hidden_size": int(config["intermediate_size"]),
                "vocab_size": int(config["vocab_size"]),
                "layernorm_epsilon": float(config.get("rms_norm_eps", 1e-5)),
                "rotary_base": float(config.get("rope_theta", 10000.0))}
    except KeyError as exc:
        raise ValueError(f"model config.json: key {exc.args[0]!r} missing") from None


def mcore_settings(params: McoreParams, knobs: Any, *, num_layers: int,
                   te_available: bool) -> dict[str, Any]:
    """The TransformerConfig settings the run's knobs and params map onto (ValueError: what
    megatron-core cannot do here, the reason)."""
    # method lora and weights random are McoreParams' types; the knobs the matrix refuses
    # (managed, fp8, offload with recompute) are refused here too, for a run built without it
    if knobs.memory == "managed":
        raise ValueError("engine mcore: memory: managed has no megatron-core setting")
    if knobs.precision == "fp8":
        raise ValueError("engine mcore: fp8 needs TransformerEngine's layer spec, and this "
                         "backend builds megatron-core's local one" + (
                             "" if te_available else " (TransformerEngine is not installed: "
                             "its CUDA 13 wheel is 264 MiB, over the device's carry)"))
    bf16 = params.dtype == "bfloat16"
    out: dict[str, Any] = {"bf16": bf16, "params_dtype": params.dtype,
                           "hidden_dropout": 0.0, "attention_dropout": 0.0}
    if params.checkpointing:
        out.update(recompute_granularity="full", recompute_method="uniform",
                   recompute_num_layers=1)
    if knobs.offload != "none":
        if not te_available:
            raise ValueError("engine mcore: megatron-core's CPU offloading of activations "
                             "(cpu_offloading and fine_grained_activation_offloading alike) "
                             "needs TransformerEngine's cpu_offload, which is not installed")
        if params.checkpointing:
            raise ValueError("engine mcore: megatron-core refuses CPU offloading with "
                             "activation recomputation")
        # megatron-core needs cpu_offloading_num_layers < num_layers
        out.update(cpu_offloading=True, cpu_offloading_num_layers=num_layers - 1,
                   cpu_offloading_activations=knobs.offload in ("activations", "both"),
                   cpu_offloading_weights=knobs.offload in ("parameters", "both"))
    return out


def runner_config(params: McoreParams, knobs: Any, shape: dict[str, Any], *,
                  tokens_path: str, te_available: bool) -> dict[str, Any]:
    """Everything the runner needs, as JSON-able values (ValueError: see ``mcore_settings``)."""
    return {"shape": shape,
            "settings": mcore_settings(params, knobs, num_layers=shape["num_layers"],
                                       te_available=te_available),
            "lora": {"targets": mcore_targets(params.lora_targets), "rank": params.lora_rank,
                     "alpha": params.lora_alpha},
            "seq_len": params.seq_len, "micro_batch": params.micro_batch,
            "warmup_steps": params.warmup_steps, "measured_steps": params.measured_steps,
            "learning_rate": params.learning_rate, "weight_decay": params.weight_decay,
            "seed": params.seed, "tokens": tokens_path}


def parse_log(lines: Iterable[str]) -> list[MegatronStep]:
    """Per-step figures from a Megatron-LM training log (iteration N is step N-1; the last line
    of an iteration wins)."""
    steps: dict[int, MegatronStep] = {}
    for line in lines:
        it, t = _ITER_RE.search(line), _TIME_RE.search(line)
        if not (it and t):
            continue
        loss, grad = _LOSS_RE.search(line), _GRAD_NORM_RE.search(line)
        step = int(it.group("it")) - 1
        steps[step] = MegatronStep(step=step, step_s=float(t.group("ms")) / 1000.0,
                                   loss=float(loss.group("loss")) if loss else None,
                                   grad_norm=float(grad.group("g")) if grad else None)
    return [steps[k] for k in sorted(steps)]


def parse_peak_gib(lines: Iterable[str]) -> dict[str, float]:
    """The last ``memory (MB)`` line's max allocated (and max reserved), GiB; {} without one."""
    out: dict[str, float] = {}
    for line in lines:
        m = _MEM_RE.search(line)
        if m:
            out["peak_gpu_allocated_gib"] = float(m.group("max")) / MIB_PER_GIB
            r = _MAX_RESERVED_RE.search(line)
            if r:
                out["peak_gpu_reserved_gib"] = float(r.group("max")) / MIB_PER_GIB
    return out


def summarize_log(steps: Sequence[MegatronStep], *, warmup_steps: int,
                  tokens_per_step: int) -> dict[str, float]:
    """The torch backend's figures from the log's steps (the first ``warmup_steps`` excluded)."""
    measured = list(steps[warmup_steps:])
    if not measured:
        raise ValueError(f"the megatron log has {len(steps)} step line(s), none after the "
                         f"{warmup_steps} warm-up step(s)")
    times = [s.step_s for s in measured]
    out = {"tokens_per_s": statistics.median(tokens_per_step / t for t in times),
           "step_time_p50_s": percentile(times, 50), "step_time_p90_s": percentile(times, 90),
           "step_time_mean_s": statistics.fmean(times), "measured_steps": float(len(measured)),
           # the steps between the runner's window markers: what the window's joules paid for
           "measured_tokens": float(len(measured) * tokens_per_step),
           "tokens_per_step": float(tokens_per_step)}
    losses = [s.loss for s in steps if s.loss is not None]
    if len(losses) >= 2:
        out.update(first_loss=losses[0], final_loss=losses[-1], loss_drop=losses[0] - losses[-1])
    return out


def missing_stack() -> str | None:
    """Why megatron-core cannot run in this Python (None: it can be imported)."""
    if _importable("megatron.core"):
        return None
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    return (f"megatron-core is not importable in Python {py} (its releases since 0.17 need "
            f"Python >= 3.12; the pinned wheel: requirements-nemo.txt)")


def _importable(module: str) -> bool:
    """Whether ``module`` imports here (the family registry alone uses importlib)."""
    try:
        __import__(module)
    except ImportError:
        return False
    return True


def _child_env() -> dict[str, str]:
    """The job's environment with hopperlab's source folder first on PYTHONPATH."""
    src = str(Path(__file__).resolve().parents[4])  # src/hopperlab/workloads/finetune/mcore
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH", "")) if p)
    env.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")  # megatron-core's advice for overlap
    return env


def run(spec: RunView[McoreParams], recorder: Recording) -> None:
    """The mcore engine's entry (``EngineInfo.entry``)."""
    params = spec_params(spec, McoreParams)
    recorder.set_tag("finetune.backend", params.backend)
    run_nemo(spec, params, recorder)


def run_nemo(spec: RunView, params: McoreParams, recorder: Recording) -> None:
    why = missing_stack()
    if why is not None:
        raise SkipRun(f"engine mcore: {why}")
    te = _importable(TE_MODULE)
    config_json = Path(spec.asset_path("model")) / "config.json"
    try:
        shape = model_shape(json.loads(config_json.read_text()))
    except (OSError, ValueError) as exc:
        raise ValueError(f"{config_json}: {exc}") from None
    work = Path(spec.run_dir) / "nemo"
    work.mkdir(parents=True, exist_ok=True)
    try:
        config = runner_config(params, spec.knobs, shape, tokens_path=str(work / "tokens.pt"),
                               te_available=te)
    except ValueError as exc:
        raise SkipRun(str(exc)) from None
    source = write_tokens(spec, params, shape["vocab_size"], Path(config["tokens"]))
    recorder.set_tag("data.source", source)
    (work / "config.json").write_text(json.dumps(config, indent=1))
    cmd = [sys.executable, "-m", RUNNER, str(work / "config.json")]
    recorder.set_tag("nemo.command", " ".join(cmd))
    recorder.set_tag("nemo.stack", "megatron-core GPTModel, local (non-TE) layer spec")
    log_path = recorder.artifact_path("nemo.log")
    returncode = run_logged(cmd, log_path)
    lines = log_path.read_text().splitlines()
    if returncode != 0:
        tail = "\n".join(lines[-20:])
        raise RuntimeError(f"megatron-core runner exited with status {returncode}; "
                           f"log tail:\n{tail}")
    for line in lines:
        for key in ("versions", "device", "model"):
            if line.startswith(f"{key}: "):
                recorder.set_tag(f"nemo.{key}", line.split(": ", 1)[1].strip())
        if line.startswith("device: "):
            recorder.set_tag("finetune.gpu_measured", str(line.startswith("device: cuda")).lower())
    steps = parse_log(lines)
    tokens_per_step = params.seq_len * params.micro_batch
    for s in steps:
        figures = {"step_time_s": s.step_s, "tokens_per_s": tokens_per_step / s.step_s}
        if s.loss is not None:
            figures["loss"] = s.loss
        if s.grad_norm is not None:
            figures["grad_norm"] = s.grad_norm
        recorder.log_step(s.step, **figures)
    final = summarize_log(steps, warmup_steps=params.warmup_steps,
                          tokens_per_step=tokens_per_step)
    final.update(parse_peak_gib(lines))
    recorder.log_metrics(final)


def run_logged(cmd: list[str], log_path: Path) -> int:
    """Run the runner with its output copied to ``log_path``; its window markers (``WINDOW_START``
    / ``WINDOW_END``, printed around the measured steps) open and close the measured window in
    this process, where the runner's energy meter listens. Returns the exit status."""
    opened = False
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=_child_env())
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            if line.startswith(WINDOW_START) and not opened:
                announce("start", MEASURED)
                opened = True
            elif line.startswith(WINDOW_END) and opened:
                announce("end", MEASURED)
                opened = False
        returncode = proc.wait()
    if opened:
        announce("end", MEASURED)
    return returncode


def write_tokens(spec: RunView, params: McoreParams, vocab_size: int, path: Path) -> str:
    """The run's batches (the torch backend's data source and loader, one worker-less pass),
    shifted for megatron (labels are the next token; -100 where no loss), saved for the runner;
    returns the source's description."""
    import torch

    source = data.open_source(spec, params, vocab_size)
    loader = data.make_loader(source, params, 0, pin_memory=False)
    it = data.batches(loader)
    ids, labels = [], []
    for _ in range(params.warmup_steps + params.measured_steps):
        batch = next(it)
        x = torch.as_tensor(batch["input_ids"])
        y = torch.as_tensor(batch.get("labels", x)).clone()
        shifted = torch.full_like(y, -100)
        shifted[:, :-1] = y[:, 1:]
        ids.append(x)
        labels.append(shifted)
    torch.save({"input_ids": torch.stack(ids), "labels": torch.stack(labels)}, path)
    return source.description
