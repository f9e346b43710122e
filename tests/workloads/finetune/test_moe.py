"""The MoE decoder of the finetune family (issue 19) on CPU: routing and dispatch against
dense references, exact gradients under the memory techniques, a falling loss, the workload's
counts, and bad model configs or params refused when the matrix is loaded (file and key named)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from hopperlab.assets import materialize  # noqa: E402
from hopperlab.config.matrix import load_matrix  # noqa: E402
from hopperlab.core.errors import SpecError  # noqa: E402
from hopperlab.core.rundir import Recorder  # noqa: E402
from hopperlab.memory.activation_offload import (  # noqa: E402
    ActivationOffload, save_on_cpu_reference)
from hopperlab.memory.checkpointing import checkpoint_layers  # noqa: E402
from hopperlab.memory.layers import decoder_layers  # noqa: E402
from hopperlab.workloads.base import fake_run  # noqa: E402
from hopperlab.workloads.finetune import FinetuneParams  # noqa: E402
from hopperlab.workloads.finetune.torch import moe  # noqa: E402
from hopperlab.workloads.finetune.torch.moe_config import read_moe_config  # noqa: E402
from hopperlab.workloads.finetune.torch.workload import run  # noqa: E402

from tests.helpers import copy_project, edit_yaml, hopperlab  # noqa: E402
from tests.memory_helpers import assert_exact, step, twin  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
TINY = read_moe_config(ROOT / "models" / "moe-tiny")


def tiny_model(**changes) -> moe.MoeForCausalLM:
    return moe.build(replace(TINY, **changes), "cpu", torch.float32, seed=0)


def tokens(seed: int = 0, b: int = 2, s: int = 32) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, TINY.vocab_size, (b, s), generator=torch.Generator().manual_seed(seed))
    return {"input_ids": ids, "labels": ids.clone()}


# ----------------------------------------------------------------------------- routing
def test_all_tokens_to_one_expert_equal_that_expert_as_a_dense_ffn():
    torch.manual_seed(0)
    ffn = moe.MoeFFN(replace(TINY, top_k=1))
    x = torch.randn(40, TINY.hidden_size)
    x[:, 0] = x[:, 0].abs() + 1.0           # a feature that is positive for every token
    with torch.no_grad():
        ffn.router.weight.zero_()
        ffn.router.weight[2, 0] = 5.0        # expert 2's logit > 0 = every other's: it wins
    y, _ = ffn(x)
    assert torch.equal(y, ffn.experts[2](x))


def test_sorted_dispatch_equals_a_token_by_token_mixture():
    torch.manual_seed(1)
    ffn = moe.MoeFFN(TINY)                  # 4 experts, top_k 2: uneven segments
    x = torch.randn(50, TINY.hidden_size)
    y, aux = ffn(x)
    probs = torch.softmax(ffn.router(x), dim=-1)
    expected = torch.zeros_like(x)
    for t in range(x.shape[0]):
        w, e = probs[t].topk(TINY.top_k)
        for weight, expert in zip(w / w.sum(), e.tolist()):
            expected[t] += weight * ffn.experts[expert](x[t:t + 1])[0]
    torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-6)
    assert aux.item() >= 1.0 - 1e-6          # E * sum f_e P_e is at least 1 (even load: 1)


def test_expert_counts_equal_bincount():
    """The sync-free count (scatter_add_) is bincount's, empty experts included."""
    torch.manual_seed(0)
    ids = torch.randint(0, 5, (257,))
    ids[ids == 3] = 4                        # expert 3 gets no token
    counts = moe.expert_counts(ids, 6)
    assert counts.tolist() == torch.bincount(ids, minlength=6).tolist()
    assert counts[3] == 0 and counts[5] == 0 and counts.dtype == torch.int64


def test_active_parameters_count_top_k_experts():
    model = tiny_model()
    expert = sum(p.numel() for p in model.layers[0].mlp.experts[0].parameters())
    assert model.inactive_parameters() == (TINY.num_experts - TINY.top_k) * expert * \
        TINY.num_hidden_layers


# ----------------------------------------------------------------------------- techniques
@pytest.fixture(scope="module")
def plain():
    model = tiny_model()
    return model, step(model, tokens())


def _offload(model, min_bytes: int) -> ActivationOffload:
    return ActivationOffload("cpu", min_bytes=min_bytes).wrap_layers(
        decoder_layers(model)).track_parameters(model)


@pytest.mark.parametrize("min_bytes", [0, 16384])
def test_async_offload_gradients_are_exact(plain, min_bytes):
    base_model, base = plain
    model = twin(base_model)
    off = _offload(model, min_bytes)
    assert_exact(base, step(model, tokens(), lambda: off))
    stats = off.stats()
    assert stats.tensors_offloaded > 0 and stats.bytes_offloaded == stats.bytes_reloaded
    if min_bytes:
        assert stats.tensors_kept > 0        # the small ones (router probs, indices) stayed


def test_checkpointing_gradients_are_exact(plain):
    base_model, base = plain
    model = twin(base_model)
    assert len(checkpoint_layers(decoder_layers(model))) == TINY.num_hidden_layers
    assert_exact(base, step(model, tokens()))


def test_save_on_cpu_gradients_are_exact(plain):
    base_model, base = plain
    assert_exact(base, step(twin(base_model), tokens(), lambda: save_on_cpu_reference(False)))


def test_the_loss_falls():
    model = tiny_model()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    data = tokens(seed=3)
    losses = []
    for _ in range(8):
        loss = model(**data).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.5, losses


# ----------------------------------------------------------------------------- the workload
def test_the_workload_trains_the_tiny_moe_and_counts_active_flops(tmp_path):
    adir = tmp_path / "assets"
    materialize("moe-tiny-random", ROOT, adir, scale="smoke")
    params = FinetuneParams(method="full", weights="random", dtype="float32", data="synthetic",
                            seq_len=32, micro_batch=2, warmup_steps=1, measured_steps=2,
                            offload_min_bytes=0)
    spec = fake_run(params, run_dir=tmp_path / "run", assets={"model": adir / "moe-tiny-random"},
                    offload="activations")
    rec = Recorder(tmp_path / "run")
    run(spec, rec)
    rec.finish("ok")
    final = json.loads((tmp_path / "run" / "metrics.json").read_text())
    figures = final.get("metrics", final)
    model = tiny_model()
    active = sum(p.numel() for p in model.parameters()) - model.embed_tokens.weight.numel() \
        - model.inactive_parameters()
    attention = 12 * TINY.num_hidden_layers * TINY.hidden_size * 32 // 2  # the causal half
    assert figures["flops_per_token"] == 6 * active + attention
    assert figures["act_bytes_offloaded_per_step"] > 0


def test_pretrained_weights_are_refused_in_the_job(tmp_path):
    from hopperlab.workloads.finetune.torch.model import load_base_model

    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text((ROOT / "models/moe-tiny/config.json").read_text())
    with pytest.raises(ValueError, match="weights: pretrained"):
        load_base_model(folder, FinetuneParams(method="full", weights="pretrained"), "cpu")


# ----------------------------------------------------------------------------- bad input
@pytest.fixture
def project(tmp_path) -> Path:
    return copy_project(tmp_path / "project")


def _edit_config(project: Path, change) -> None:
    path = project / "models" / "moe-tiny" / "config.json"
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def _refused(project: Path) -> str:
    with pytest.raises(SpecError) as info:
        load_matrix(project, {"families": ["finetune"]})
    return str(info.value)


@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
def test_top_k_over_num_experts_is_refused_at_matrix_load(project):
    _edit_config(project, lambda d: d.update(top_k=5))
    message = _refused(project)
    assert "models/moe-tiny/config.json" in message and "top_k" in message
    assert "experiments/finetune.yaml" in message
    out = hopperlab(["list"], project)       # what a user sees: before anything is submitted
    assert out.returncode != 0 and "top_k" in out.stderr + out.stdout


def test_an_unknown_model_config_key_is_refused_at_matrix_load(project):
    _edit_config(project, lambda d: d.update(num_expert=2))
    message = _refused(project)
    assert "models/moe-tiny/config.json" in message and "num_expert" in message


def test_a_negative_offload_threshold_is_refused_at_matrix_load(project):
    def change(data):
        data["experiments"]["moe-sft"]["variants"]["offload-all"]["params"][
            "offload_min_bytes"] = -1
    edit_yaml(project / "experiments" / "finetune.yaml", change)
    message = _refused(project)
    assert message.startswith("experiments/finetune.yaml: ")
    assert "moe-sft.variants.offload-all.params" in message and "offload_min_bytes" in message


def test_pretrained_weights_of_an_moe_are_refused_at_matrix_load(project):
    def change(data):
        data["experiments"]["moe-sft"]["params"]["weights"] = "pretrained"
    edit_yaml(project / "experiments" / "finetune.yaml", change)
    message = _refused(project)
    assert "params.weights" in message and "models/moe-tiny/config.json" in message


def test_chunked_loss_equals_the_whole_loss_and_its_gradients():
    """``loss_chunk_tokens``: the norm, head and cross entropy in checkpointed chunks give the
    loss and gradients of the whole computation (to float rounding: sums in another order)."""
    config = replace(TINY, num_hidden_layers=2)
    ids = torch.randint(0, config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(1))
    grads = []
    for chunk in (None, 7):
        model = moe.build(config, "cpu", torch.float64, seed=4)
        if chunk:
            model.use_chunked_loss(chunk)
        out = model(ids, labels=ids)
        out.loss.backward()
        grads.append((out.loss.detach(), {n: p.grad for n, p in model.named_parameters()}))
    (whole, g_whole), (chunked, g_chunked) = grads
    torch.testing.assert_close(chunked, whole, rtol=1e-12, atol=1e-12)
    for name, g in g_whole.items():
        torch.testing.assert_close(g_chunked[name], g, rtol=1e-9, atol=1e-12, msg=name)
