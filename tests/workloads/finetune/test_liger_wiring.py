"""The ``liger`` param of the torch engine: which forwards Liger Kernel's kernels replace on
the model (checked on the CPU without running a Triton kernel: the technique is told it has
CUDA), that transformers' module is left as it was after the run, that a CPU run is skipped
with the reason instead of training without them, and what it is refused with at load.
The kernels' losses against the unfused model: test_liger_cuda.py (on a GPU)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from hopperlab.core.errors import SpecError
from hopperlab.core.rundir import Recorder, SkipRun
from hopperlab.core.schema import typed_from_mapping
from hopperlab.memory.layers import decoder_layers
from hopperlab.workloads.base import Contradiction, Knobs, fake_run
from hopperlab.workloads.finetune import LIGER_KERNELS, FinetuneParams, check
from hopperlab.workloads.finetune.torch import model as model_mod
from hopperlab.workloads.finetune.torch.techniques import Techniques
from hopperlab.workloads.finetune.torch.workload import prepare

from tests.memory_helpers import architecture_dir

liger = pytest.importorskip("liger_kernel.transformers", reason="liger-kernel (the test extra)")
from liger_kernel.transformers import LigerRMSNorm, LigerSwiGLUMLP  # noqa: E402
from liger_kernel.transformers.model.llama import lce_forward  # noqa: E402
from liger_kernel.transformers.rope import liger_rotary_pos_emb  # noqa: E402
from transformers.models.llama import modeling_llama  # noqa: E402

CONFIG = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
          "vocab_size": 256, "max_position_embeddings": 64, "tie_word_embeddings": False}
PARAMS = FinetuneParams(weights="random", dtype="float32", seq_len=32, micro_batch=2,
                        lora_targets=("q_proj", "v_proj", "gate_proj", "up_proj"))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return architecture_dir(tmp_path_factory.mktemp("tiny-llama-arch"), CONFIG)


def bound(module, name="forward"):
    """The function an instance's own method is bound to (None when the class's is used)."""
    method = module.__dict__.get(name)
    return getattr(method, "__func__", None)


def wired(model_dir, kernels):
    params = replace(PARAMS, liger=kernels)
    model, _ = model_mod.load_base_model(model_dir, params, "cpu")
    model = model_mod.make_trainable(model, params)
    tech = Techniques(Knobs(), params, torch.device("cpu"), cuda=True)  # wiring only: no kernel runs
    return tech.prepare_model(model, decoder_layers(model)), tech


def test_every_kernel_replaces_its_forward_on_the_model_and_rope_is_put_back(model_dir):
    rope, norm_cls, mlp_cls = (modeling_llama.apply_rotary_pos_emb, modeling_llama.LlamaRMSNorm,
                               modeling_llama.LlamaMLP)
    model, tech = wired(model_dir, LIGER_KERNELS)
    llama = model.get_base_model()
    norms = [m for m in llama.modules() if isinstance(m, norm_cls)]
    assert len(norms) == 2 * CONFIG["num_hidden_layers"] + 1
    assert all(bound(n) is LigerRMSNorm.forward for n in norms)
    mlps = [layer.mlp for layer in llama.model.layers]
    assert all(bound(m) is LigerSwiGLUMLP.forward for m in mlps)
    # the adapters stay in the MLP Liger's forward calls: peft's LoRA layers
    assert all(type(m.gate_proj).__module__.startswith("peft") for m in mlps)
    assert bound(llama) is lce_forward
    assert modeling_llama.apply_rotary_pos_emb is liger_rotary_pos_emb
    assert (modeling_llama.LlamaRMSNorm, modeling_llama.LlamaMLP) == (norm_cls, mlp_cls)
    assert tech.tags["finetune.liger"].startswith(
        "rms_norm,rope,swiglu,fused_linear_cross_entropy (liger-kernel ")
    tech.close()
    assert modeling_llama.apply_rotary_pos_emb is rope


def test_only_the_kernels_asked_for_are_applied(model_dir):
    rope = modeling_llama.apply_rotary_pos_emb
    model, tech = wired(model_dir, ("rms_norm",))
    llama = model.get_base_model()
    assert bound(llama.model.norm) is LigerRMSNorm.forward
    assert bound(llama.model.layers[0].mlp) is None and bound(llama) is None
    assert modeling_llama.apply_rotary_pos_emb is rope
    tech.close()
    assert tech.tags["finetune.liger"].startswith("rms_norm (liger-kernel ")


def test_a_run_without_cuda_is_skipped_with_the_reason(model_dir, tmp_path):
    params = replace(PARAMS, liger=("rope", "swiglu"))
    spec = fake_run(params, run_dir=tmp_path, assets={"model": model_dir})
    rope = modeling_llama.apply_rotary_pos_emb
    with pytest.raises(SkipRun, match="liger: Liger Kernel's Triton kernels need a CUDA device"):
        prepare(spec, params, Recorder(tmp_path))
    assert modeling_llama.apply_rotary_pos_emb is rope


@pytest.mark.parametrize("values, message", [
    ({"liger": ["rope", "rope"]}, "liger: rope named twice"),
    ({"liger": ["flash"]}, "liger"),
    ({"liger": ["rope"], "compile": True}, "liger: not with compile"),
    ({"liger": ["swiglu"], "recompute_elementwise": True}, "liger: swiglu not with recompute"),
    ({"liger": ["fused_linear_cross_entropy"], "loss_chunk_tokens": 1024},
     "liger: fused_linear_cross_entropy not with loss_chunk_tokens"),
])
def test_what_liger_cannot_go_with_is_refused_at_load_naming_the_file(values, message):
    where = "experiments/finetune.yaml: lora-llama2-7b.variants.x.params"
    with pytest.raises(SpecError, match=message) as err:
        typed_from_mapping(FinetuneParams, values, where, "parameter of the finetune family")
    assert str(err.value).startswith(where)
    assert "\n" not in str(err.value)


def test_fp8_refuses_liger():
    with pytest.raises(Contradiction, match="fp8, but liger"):
        check(Knobs(precision="fp8"), FinetuneParams(liger=("rope",)))
    check(Knobs(precision="fp8"), FinetuneParams())
    # rope with recompute_elementwise is fine: that technique leaves RoPE alone
    assert FinetuneParams(liger=("rope",), recompute_elementwise=True).liger == ("rope",)
