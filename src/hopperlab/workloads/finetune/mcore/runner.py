"""The megatron-core LoRA runner of ``backend: nemo``: ``python -m`` this module ``CONFIG.json``.

Builds megatron-core's ``GPTModel`` (Llama: RMSNorm, SwiGLU, RoPE, no biases, untied output)
from ``get_gpt_layer_local_spec`` with random weights, freezes it, wraps NeMo's LoRA targets
(``linear_qkv``, ``linear_proj``, ...) in adapters, and trains them with megatron-core's
no-pipelining schedule and AdamW, printing Megatron-LM's training-log lines that
``nemo.parse_log`` reads. Core attention is ``torch.nn.functional.scaled_dot_product_attention``
(flash attention on the GPU) put in the spec's ``core_attention`` slot: the local spec's
``DotProductAttention`` materialises the float scores of every head ([b, heads, s, s], 1 GiB a
layer at 4 x 2048), which NeMo never does (TransformerEngine's fused attention).

Full recompute with a frozen base (``require_block_input_grad``): megatron's reentrant
``CheckpointFunction`` only has a backward when one of its tensor inputs requires grad, and the
adapters are not inputs; with the embedding frozen the first layer's input does not, so no
layer's output does, the loss has no graph and megatron's ``backward_step`` skips backward
silently (``if output_tensor.requires_grad``): the adapters never train. The block's input is
made to require grad (Megatron-Bridge's PEFT does the same), and every step checks that each
adapter got a gradient (``adapter_grad_norm``), printed as Megatron-LM's ``grad norm``.

On a machine without CUDA (the CPU test) the same model and adapters run the forward step and
megatron's ``backward_step`` in place of the schedule, whose token counters live on ``cuda``;
megatron's CUDA RNG states are not saved around recompute there (dropout is 0: nothing random
is replayed). Figures from the CPU are bookkeeping, not timings.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import sys
import time
from typing import Any, Callable

from hopperlab.cuda.nvtx import BACKWARD, STEP, measured_region, nvtx_range
from hopperlab.workloads.finetune.mcore.engine import WINDOW_END, WINDOW_START

MIB = float(1 << 20)


def adapter_class() -> type:
    """``LoraAdapter(base, rank, alpha)``: ``base(x) + (alpha / r) * B(A(x))`` around a megatron
    parallel linear (which returns ``(output, bias)``). A and B are float32 master weights cast
    to the input's dtype in forward (as autocast does): the frozen base stays bf16, the adapter
    trains in float32."""
    import torch

    class LoraAdapter(torch.nn.Module):
        def __init__(self, base: Any, rank: int, alpha: int) -> None:
            super().__init__()
            self.base = base
            out_f, in_f = base.weight.shape
            dev = base.weight.device
            self.lora_a = torch.nn.Parameter(torch.empty(rank, in_f, device=dev))
            torch.nn.init.kaiming_uniform_(self.lora_a, a=math.sqrt(5))
            self.lora_b = torch.nn.Parameter(torch.zeros(out_f, rank, device=dev))
            self.scale = alpha / rank

        def forward(self, x: Any, *args: Any, **kwargs: Any) -> Any:
            out, bias = self.base(x, *args, **kwargs)
            f = torch.nn.functional
            delta = f.linear(f.linear(x, self.lora_a.to(x.dtype)), self.lora_b.to(x.dtype))
            return out + delta * self.scale, bias

    return LoraAdapter


def add_lora(model: Any, targets: list[str], rank: int, alpha: int) -> int:
    """Freeze ``model``, wrap every submodule attribute named in ``targets``; returns how
    many were wrapped."""
    adapter = adapter_class()
    for p in model.parameters():
        p.requires_grad_(False)
    wrapped = 0
    for _, module in list(model.named_modules()):
        for name in targets:
            child = getattr(module, name, None)
            if child is not None and hasattr(child, "weight") and \
                    not isinstance(child, adapter):
                setattr(module, name, adapter(child, rank, alpha))
                wrapped += 1
    return wrapped


def require_block_input_grad(model: Any) -> Any:
    """Make the embedding's output (the transformer block's input) require grad, so megatron's
    recompute of each layer has a backward with a frozen base; returns the hook's handle."""

    def hook(_module: Any, _inputs: Any, out: Any) -> Any:
        return out if out.requires_grad else out.detach().requires_grad_(True)

    return model.embedding.register_forward_hook(hook)


def adapter_grad_norm(trainable: list[Any], step: int) -> float:
    """The adapters' gradient norm; RuntimeError where backward left one without a gradient
    (the loss was cut from the adapters: see ``require_block_input_grad``)."""
    import torch

    missing = sum(p.grad is None for p in trainable)
    if missing:
        raise RuntimeError(f"iteration {step}: {missing} of {len(trainable)} adapter tensors got "
                           f"no gradient (backward did not reach them)")
    return float(torch.nn.utils.get_total_norm([p.grad for p in trainable]))


def sdpa_attention_class() -> type:
    """A ``core_attention`` module for megatron's spec: [s, b, heads, d] in, [s, b, h] out."""
    import torch
    from megatron.core.transformer.module import MegatronModule

    class SdpaCoreAttention(MegatronModule):
        def __init__(self, config: Any, layer_number: int, attn_mask_type: Any,
                     attention_type: str, attention_dropout: float | None = None,
                     softmax_scale: float | None = None, **_: Any) -> None:
            super().__init__(config=config)
            self.softmax_scale = softmax_scale
            self.gqa = config.num_query_groups != config.num_attention_heads

        def forward(self, query: Any, key: Any, value: Any, attention_mask: Any,
                    attn_mask_type: Any = None, attention_bias: Any = None,
                    packed_seq_params: Any = None) -> Any:
            q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
            o = torch.nn.functional.scaled_dot_product_attention(
                q, k, v, is_causal=True, scale=self.softmax_scale, enable_gqa=self.gqa)
            return o.permute(2, 0, 1, 3).reshape(query.shape[0], query.shape[1], -1)

    return SdpaCoreAttention


def build_model(cfg: dict[str, Any], cuda: bool) -> Any:
    import torch
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    shape = dict(cfg["shape"])
    settings = dict(cfg["settings"])
    settings["params_dtype"] = getattr(torch, settings["params_dtype"])
    vocab = shape.pop("vocab_size")
    rotary_base = int(shape.pop("rotary_base"))
    tc = TransformerConfig(**shape, **settings, normalization="RMSNorm", gated_linear_unit=True,
                           activation_func=torch.nn.functional.silu, add_bias_linear=False,
                           use_cpu_initialization=not cuda)
    spec = get_gpt_layer_local_spec(normalization="RMSNorm")
    spec.submodules.self_attention.submodules.core_attention = sdpa_attention_class()
    model = GPTModel(config=tc, transformer_layer_spec=spec, vocab_size=vocab,
                     max_sequence_length=cfg["seq_len"], position_embedding_type="rope",
                     rotary_base=rotary_base, share_embeddings_and_output_weights=False)
    return model.cuda() if cuda else model


def init_megatron(seed: int, cuda: bool) -> None:
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state, tensor_parallel

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    if cuda:
        torch.cuda.set_device(0)
    dist.init_process_group("nccl" if cuda else "gloo", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    torch.manual_seed(seed)
    if cuda:
        tensor_parallel.model_parallel_cuda_manual_seed(seed)
    else:
        from megatron.core.tensor_parallel import random as mrandom

        # megatron's RoPE moves its frequencies to torch.cuda.current_device() in forward
        torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment]
        # recompute saves and restores the CUDA RNG state around each layer: none here
        mrandom._get_cuda_rng_state = lambda *_a, **_k: None
        mrandom._set_cuda_rng_state = lambda *_a, **_k: None


def forward_step(mask_by: Callable[[Any], Any]) -> Callable[..., Any]:
    """megatron-core's forward_step_func: the model's per-token loss, summed over labelled
    tokens, with the token count (megatron divides by it)."""
    import torch

    def step(data_iterator: Any, model: Any) -> Any:
        ids, labels = next(data_iterator)
        pos = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0).expand_as(ids)
        mask = mask_by(labels)
        out = model(input_ids=ids, position_ids=pos, attention_mask=None,
                    labels=labels.clamp(min=0))

        def loss_func(per_token: Any) -> Any:
            loss = (per_token.float() * mask).sum()
            n = mask.sum().to(torch.int)
            return loss, n, {"lm loss": torch.stack([loss.detach(), n.detach().float()])}
        return out, loss_func
    return step


def train(cfg: dict[str, Any]) -> None:
    import torch

    cuda = torch.cuda.is_available()
    init_megatron(cfg["seed"], cuda)
    import megatron.core
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.pipeline_parallel.schedules import backward_step

    print(f"versions: megatron-core {megatron.core.__version__}, torch {torch.__version__}, "
          f"python {sys.version.split()[0]}", flush=True)
    print("device: " + (f"cuda:0 {torch.cuda.get_device_name(0)}" if cuda else "cpu"), flush=True)
    model = build_model(cfg, cuda)
    lora = cfg["lora"]
    wrapped = add_lora(model, lora["targets"], lora["rank"], lora["alpha"])
    if cfg["settings"].get("recompute_granularity"):
        require_block_input_grad(model)
    trainable = [p for p in model.parameters() if p.requires_grad]
    print(f"model: {sum(p.numel() for p in model.parameters())} parameters, "
          f"{sum(p.numel() for p in trainable)} trainable in {wrapped} adapters "
          f"({','.join(lora['targets'])}, r={lora['rank']})", flush=True)
    opt = torch.optim.AdamW(trainable, lr=cfg["learning_rate"],
                            weight_decay=cfg["weight_decay"], fused=cuda)
    data = torch.load(cfg["tokens"])
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    fwd = forward_step(lambda labels: (labels >= 0).float())
    schedule = get_forward_backward_func() if cuda else None
    total = cfg["warmup_steps"] + cfg["measured_steps"]
    mb, seq = cfg["micro_batch"], cfg["seq_len"]

    def one(i: int) -> None:
        batch = (data["input_ids"][i].to(device, non_blocking=True),
                 data["labels"][i].to(device, non_blocking=True))
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with nvtx_range(STEP):
            if schedule is not None:
                losses = schedule(forward_step_func=fwd, data_iterator=iter([batch]),
                                  model=[model], num_microbatches=1, seq_length=seq,
                                  micro_batch_size=mb, forward_only=False)
                summed = losses[0]["lm loss"]
            else:
                out, loss_func = fwd(iter([batch]), model)
                loss, n, parts = loss_func(out)
                with nvtx_range(BACKWARD):
                    backward_step(None, loss / n, None, model.config)
                summed = parts["lm loss"]
            grad_norm = adapter_grad_norm(trainable, i + 1)
            opt.step()
            opt.zero_grad(set_to_none=True)
            lm_loss = float(summed[0] / summed[1])
        if cuda:
            torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) * 1000.0
        print(log_line(i + 1, total, mb, ms, cfg["learning_rate"], lm_loss, grad_norm),
              flush=True)

    for i in range(cfg["warmup_steps"]):
        one(i)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    with measured_region():
        print(WINDOW_START, flush=True)
        for i in range(cfg["warmup_steps"], total):
            one(i)
    print(WINDOW_END, flush=True)
    if cuda:
        print(memory_line(total), flush=True)


def log_line(it: int, total: int, mb: int, ms: float, lr: float, loss: float,
             grad_norm: float) -> str:
    """One line of Megatron-LM's training log."""
    now = _dt.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    return (f" [{now}] iteration {it:8d}/{total:8d} | consumed samples: {it * mb:12d} | "
            f"elapsed time per iteration (ms): {ms:.1f} | learning rate: {lr:.6E} | "
            f"global batch size: {mb:5d} | lm loss: {loss:.6E} | loss scale: 1.0 | "
            f"grad norm: {grad_norm:.3f} | number of skipped iterations:   0 | number of nan iterations:   0 |")


def memory_line(it: int) -> str:
    """Megatron-LM's ``report_memory`` line (MB), over the measured steps."""
    import torch

    c = torch.cuda
    return (f"[Rank 0] (after {it} iterations) memory (MB) | allocated: "
            f"{c.memory_allocated() / MIB:.1f} | max allocated: {c.max_memory_allocated() / MIB:.1f}"
            f" | reserved: {c.memory_reserved() / MIB:.1f} | max reserved: "
            f"{c.max_memory_reserved() / MIB:.1f}")


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m hopperlab.workloads.finetune.mcore.runner CONFIG.json",
              file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        train(json.load(f))
    import torch.distributed as dist
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
