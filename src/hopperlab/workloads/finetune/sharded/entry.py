"""The sharded engine's entry (``EngineInfo.entry``): the run's params as a ``Plan``, the node's
pinned link measured where the run offloads, then ``engine.run``."""

from __future__ import annotations

from hopperlab.cuda.link import pinned_copy_gbps
from hopperlab.node.threads import env_threads
from hopperlab.workloads.base import Recording, RunView, spec_params
from hopperlab.workloads.finetune.device import use_cuda
from hopperlab.workloads.finetune.sharded import engine as sharded
from hopperlab.workloads.finetune.sharded import llama
from hopperlab.workloads.finetune.sharded.params import SHAPES, ShardedParams


def run(spec: RunView[ShardedParams], recorder: Recording) -> None:
    params = spec_params(spec, ShardedParams)
    recorder.set_tag("finetune.backend", params.backend)
    run_sharded(spec, params, recorder)


def run_sharded(spec: RunView, params: ShardedParams, recorder: Recording) -> None:
    """Full fine-tuning sharded over the run's ranks (FSDP2, with CPU offload) or torchao's
    CPU-offloaded optimizer on one GPU (``sharded.py``); ``repeats`` are windows of measured
    steps after one build and warm-up (a 13B build takes longer than its steps)."""
    import torch
    import torch.distributed as dist

    cuda, why = use_cuda(spec)
    recorder.set_tag("finetune.sharding", params.sharding)
    recorder.set_tag("finetune.target", "cuda" if cuda else "host")
    if not cuda:
        recorder.set_tag("finetune.no_cuda_reason", why)
    hidden, heads, ffn, vocab, layers = SHAPES[params.model_shape]
    shape = llama.Shape(hidden, heads, ffn, vocab, params.num_layers or layers)
    world = dist.get_world_size() if dist.is_initialized() else 1
    pinned = None
    if cuda and params.sharding != "fsdp2":
        recorder.set_tag("finetune.pinned_alloc", sharded.fast_pinning())
        dev = torch.device("cuda", torch.cuda.current_device())
        pinned = (pinned_copy_gbps(dev, "h2d"), pinned_copy_gbps(dev, "d2h"))
        recorder.log_metrics(pinned_h2d_gbps=pinned[0], pinned_d2h_gbps=pinned[1])
    plan = sharded.Plan(
        mode=params.sharding, shape=shape, seq_len=params.seq_len, micro_batch=params.micro_batch,
        global_batch=params.global_batch or params.micro_batch * world,
        steps=params.measured_steps, warmup=params.warmup_steps,
        dtype=getattr(torch, params.dtype), lr=params.learning_rate,
        weight_decay=params.weight_decay, seed=params.seed, checkpointing=params.checkpointing,
        overlap_optimizer=params.overlap_optimizer and params.sharding == "fsdp2-cpu-offload",
        delayed_update=params.delayed_update, compile=params.compile,
        diagnose_step=params.diagnose_step, reshard_after_forward=params.reshard_after_forward,
        h2d_prefetch=params.h2d_prefetch, mlp_up_saved_layers=params.mlp_up_saved_layers,
        mlp_up_fit=params.mlp_up_fit, expandable_segments=params.expandable_segments,
        loss_chunk_tokens=params.loss_chunk_tokens,
        cpus=env_threads("OMP_NUM_THREADS"),  # what the runner's thread plan gave this rank
        windows=spec.repeats)  # repeat_unit "windows": the model built once, one warm-up
    recorder.set_tag("finetune.world_size", world)
    if params.sharding in ("fsdp2-cpu-offload", "torchao-cpu-offload"):
        recorder.set_tag("finetune.cpu_optimizer", (
            "per FSDP unit during backward" if plan.overlap_optimizer else "after backward") + (
            ", delayed by one step (ZeRO-Offload's: step t's gradients update the weights at "
            "step t+1)" if plan.delayed_update else
            (" (same update as after backward)" if plan.overlap_optimizer else "")))
    sharded.run(plan, recorder, cuda, pinned)
