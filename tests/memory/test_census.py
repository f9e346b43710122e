"""The saved-tensor census (issue 19): it counts what forward saves, as an independent count in
the test does; its classes hold at their edges; it composes with the activation offloads and
checkpointing without changing the loss or a gradient; a finetune run with ``census: true``
through the runner writes the census_* metrics and the artifact; the report shows the table."""

from __future__ import annotations

import csv
import json
from dataclasses import replace
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from hopperlab.core.rundir import load_record, write_json_atomic  # noqa: E402
from hopperlab.memory.activation_offload import (  # noqa: E402
    ActivationOffload, save_on_cpu_reference)
from hopperlab.memory.checkpointing import checkpoint_layers  # noqa: E402
from hopperlab.memory.layers import decoder_layers  # noqa: E402
from hopperlab.memory.saved_tensor_census import (  # noqa: E402
    SIZE_CLASSES, CensusTable, SavedTensor, SavedTensorCensus, kind_of, size_class)

from tests.memory_helpers import assert_exact, batch, step, tiny_lora_llama, twin  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
MB = 1e6


# ----------------------------------------------------------------------------- the count
class _Independent:
    """The test's own count: a plain pair of saved-tensor hooks listing each save, and the
    unique bytes by marking each storage's bytes in a mask (no interval arithmetic)."""

    def __init__(self, model: torch.nn.Module):
        self.params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self.saves: list[tuple[tuple[int, ...], torch.dtype, int]] = []
        self.masks: dict[int, bytearray] = {}
        self.unique = 0
        self.param_saves = 0

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        nbytes = t.numel() * t.element_size()
        self.saves.append((tuple(t.shape), t.dtype, nbytes))
        storage = t.untyped_storage()
        if storage.data_ptr() in self.params:
            self.param_saves += 1
            return t
        mask = self.masks.setdefault(storage.data_ptr(), bytearray(storage.nbytes()))
        size, offset = t.element_size(), t.storage_offset()
        for index in torch.cartesian_prod(*[torch.arange(n) for n in t.shape]).reshape(
                -1, t.dim()).tolist() if t.dim() else [[]]:
            start = (offset + sum(i * s for i, s in zip(index, t.stride()))) * size
            for b in range(start, start + size):
                if not mask[b]:
                    mask[b] = 1
                    self.unique += 1
        return t

    def context(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t)


def _tiny_full(layers: int = 2) -> torch.nn.Module:
    return tiny_lora_llama(layers=layers, full=True)


def test_the_census_equals_an_independent_count_of_a_tiny_llama():
    """The census's hooks hand every tensor on to the test's: both see the same saves."""
    model = _tiny_full()
    data = batch(b=1, s=8)
    base = step(model, data)
    mine = _Independent(model)
    census = SavedTensorCensus(model)
    assert_exact(base, step(model, data, census.observe(mine.context)))
    table = census.table()
    rows = table.tensors
    assert [(r.shape, r.dtype, r.nbytes) for r in rows] == \
        [(s, str(d).removeprefix("torch."), n) for s, d, n in mine.saves]
    assert sum(r.parameter for r in rows) == mine.param_saves > 0
    assert table.total_bytes() == mine.unique
    m = table.metrics()
    assert m["census_tensors_total"] == sum(r.counted for r in rows)
    assert m["census_gb_total"] == pytest.approx(mine.unique / 1e9)
    assert m["census_layers"] == 2
    assert {r.layer for r in rows} == {None, 0, 1}
    kinds = {r.kind for r in rows}
    assert {"attention", "ffn", "norm", "embedding", "loss"} <= kinds


def test_a_known_function_saves_what_it_says_and_shared_memory_counts_once():
    """An autograd.Function that saves ``a``, ``a`` again, half of ``a`` and ``b``: two
    tensors counted (a's and b's bytes), two aliases."""

    class Saver(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, b):
            ctx.save_for_backward(a, a, a[:2], b)
            return a.sum() + b.sum()

        @staticmethod
        def backward(ctx, grad):
            a, _, _, b = ctx.saved_tensors
            return grad.expand_as(a), grad.expand_as(b)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList([torch.nn.Identity()])

        def forward(self, a, b):
            return Saver.apply(self.layers[0](a), b)

    net = Net()
    a = torch.randn(4, 8, requires_grad=True)      # 128 bytes
    b = torch.randn(3, dtype=torch.float64, requires_grad=True)
    census = SavedTensorCensus(net)
    with census:
        out = net(a * 1, b * 1)
    out.backward()
    rows = census.table().tensors
    assert [(r.nbytes, r.new_bytes, r.alias) for r in rows] == \
        [(128, 128, False), (128, 0, True), (64, 0, True), (24, 24, False)]
    assert census.table().metrics()["census_alias_tensors"] == 2


@pytest.mark.parametrize("nbytes,key", [
    (99.999 * MB, "lt100mb"), (100 * MB, "100_499mb"), (499.999 * MB, "100_499mb"),
    (500 * MB, "500_999mb"), (999.999 * MB, "500_999mb"), (1000 * MB, "1000_1999mb"),
    (1999.999 * MB, "1000_1999mb"), (2000 * MB, "ge2000mb"), (0, "lt100mb")])
def test_size_classes_at_their_edges(nbytes, key):
    assert size_class(nbytes).key == key


def _fake(index: int, nbytes: int, kind: str, layer: int | None = 0, **kw) -> SavedTensor:
    base = dict(index=index, name=f"layers.{layer}.x", kind=kind, layer=layer, dtype="bfloat16",
                shape=(nbytes // 2,), device="cuda", nbytes=nbytes, new_bytes=nbytes,
                parameter=False, alias=False, size_class=size_class(nbytes).key)
    return SavedTensor(**{**base, **kw})


def test_the_summary_of_fake_sizes():
    rows = [_fake(0, int(99.999 * MB), "norm"), _fake(1, int(100 * MB), "attention"),
            _fake(2, int(100 * MB), "ffn", layer=1), _fake(3, 2000 * int(MB), "ffn-expert"),
            _fake(4, int(100 * MB), "attention", new_bytes=0, alias=True),
            _fake(5, 50 * int(MB), "head", layer=None, parameter=True, new_bytes=0)]
    table = CensusTable(rows, num_layers=2)
    m = table.metrics()
    total = 99.999e6 + 100e6 + 100e6 + 2000e6
    assert m["census_tensors_total"] == 4 and m["census_gb_total"] == pytest.approx(total / 1e9)
    assert m["census_tensors_lt100mb"] == 1 and m["census_tensors_100_499mb"] == 2
    assert m["census_gb_ge2000mb"] == pytest.approx(2.0)
    assert m["census_share_ge2000mb"] == pytest.approx(2000e6 / total)
    assert sum(m[f"census_share_{c.key}"] for c in SIZE_CLASSES) == pytest.approx(1.0)
    assert m["census_param_tensors"] == 1 and m["census_param_gb"] == pytest.approx(0.05)
    assert m["census_gb_per_layer"] == pytest.approx(total / 2 / 1e9)
    assert table.kind_tags()["census.kinds_100_499mb"] == "attention 0.1 GB, ffn 0.1 GB"
    assert table.layers() == {"0": {"tensors": 3, "bytes": int(99.999e6) + int(2100e6)},
                              "1": {"tensors": 1, "bytes": int(100e6)}}
    assert len(list(csv.DictReader(table.to_csv().splitlines()))) == len(rows)
    assert json.loads(json.dumps(table.to_json()))["classes"][0]["key"] == "lt100mb"


@pytest.mark.parametrize("path,layer,after,kind", [
    ("model.layers.3.mlp.experts.0.up", 3, False, "ffn-expert"),
    ("model.layers.3.mlp.router", 3, False, "router"),
    ("model.layers.3.block_sparse_moe.gate", 3, False, "router"),
    ("model.layers.3.mlp.gate_proj", 3, False, "ffn"),
    ("model.layers.0.self_attn.q_proj.lora_A.default", 0, False, "attention"),
    ("model.layers.0.input_layernorm", 0, False, "norm"),
    ("model.embed_tokens", None, False, "embedding"),
    ("lm_head", None, True, "head"),
    ("model.layers.2", 2, False, "layer"),
    ("", None, True, "loss"), ("model.rotary_emb", None, False, "other")])
def test_kinds_from_module_paths(path, layer, after, kind):
    assert kind_of(path, layer, after) == kind


# ----------------------------------------------------------------------------- composing
def _offload(model: torch.nn.Module) -> ActivationOffload:
    return ActivationOffload("cpu", min_bytes=1024).wrap_layers(
        decoder_layers(model)).track_parameters(model)


def test_census_inside_async_offload_changes_nothing_and_the_offload_still_offloads():
    model = tiny_lora_llama(layers=2)
    plain = SavedTensorCensus(model)
    base = step(model, batch(), plain.observe(lambda: torch.autograd.graph.saved_tensors_hooks(
        lambda t: t, lambda t: t)))
    offloaded = twin(model)
    off = _offload(offloaded)
    without = step(offloaded, batch(), lambda: off)
    stats_without = off.stats()
    census = SavedTensorCensus(offloaded)
    with_census = step(offloaded, batch(), census.observe(lambda: off))
    assert_exact(base, without)
    assert_exact(without, with_census)
    stats = off.stats()
    assert stats.bytes_offloaded > 0 and stats.bytes_offloaded == stats_without.bytes_offloaded
    assert stats.bytes_reloaded == stats.bytes_offloaded
    assert census.table().metrics() == plain.table().metrics()


def test_census_inside_save_on_cpu_changes_nothing():
    model = tiny_lora_llama(layers=2)
    base = step(model, batch(), lambda: save_on_cpu_reference(pin_memory=False))
    census = SavedTensorCensus(model)
    assert_exact(base, step(model, batch(), census.observe(
        lambda: save_on_cpu_reference(pin_memory=False))))
    assert census.table().metrics()["census_tensors_total"] > 0


def test_census_without_a_technique_changes_nothing():
    model = _tiny_full()
    base = step(model, batch())
    census = SavedTensorCensus(model)
    assert_exact(base, step(model, batch(), lambda: census))


def test_with_checkpointing_the_census_sees_the_layer_inputs_not_the_recomputation():
    model = _tiny_full()
    base = step(model, batch())
    handle = checkpoint_layers(decoder_layers(model))
    try:
        census = SavedTensorCensus(model)
        with census:
            loss = model(**batch(), use_cache=False).loss
        before = len(census.table().tensors)
        loss.backward()
        assert len(census.table().tensors) == before     # backward's recompute is not counted
        checkpointed = step(model, batch(), lambda: census)
    finally:
        handle.remove()
    assert_exact(base, checkpointed)
    in_layers = [r for r in census.table().tensors if r.layer is not None]
    assert [(r.kind, r.layer) for r in in_layers] == [("layer", 0), ("layer", 1)]


# ----------------------------------------------------------------------------- a real run
@pytest.fixture(scope="module")
def census_run(tmp_path_factory) -> Path:
    """A finetune smoke run with ``census: true``, through the runner (``execute``)."""
    from hopperlab.assets import materialize
    from hopperlab.config.matrix import load_matrix
    from hopperlab.run.runner import execute

    tmp = tmp_path_factory.mktemp("census")
    spec = load_matrix(ROOT, {"families": ["finetune"], "scale": "smoke"}).runs[
        "finetune/lora-llama2-7b/baseline"]
    for name in spec.assets.values():
        materialize(name, ROOT, tmp / "assets", scale="smoke")
    run_dir = tmp / "results" / "finetune" / "lora-llama2-7b" / "census"
    spec = replace(spec, variant="census", run_dir=str(run_dir),
                   site=replace(spec.site, assets_dir=str(tmp / "assets")),
                   params=replace(spec.params, census=True, warmup_steps=1, measured_steps=2))
    data = spec.to_dict()
    data["attempt"] = 1
    write_json_atomic(run_dir / "spec.json", data)
    record = execute(str(run_dir / "spec.json"))
    assert record["status"] == "ok", record.get("reason")
    return run_dir


def test_a_finetune_run_with_census_records_metrics_and_the_artifact(census_run):
    record = load_record(census_run)
    m = record["metrics"]
    assert m["census_tensors_total"] > 0 and m["census_gb_total"] > 0
    assert m["census_step"] == 1                       # after the one warm-up step
    assert sum(m[f"census_share_{c.key}"] for c in SIZE_CLASSES) == pytest.approx(1.0)
    assert record["tags"]["census.kinds_lt100mb"]
    assert m["measured_steps"] == 2                    # the census step is not measured
    saved = json.loads((census_run / "artifacts" / "census.json").read_text())
    assert saved["metrics"]["census_tensors_total"] == m["census_tensors_total"]
    assert sum(c["tensors"] for c in saved["classes"]) == m["census_tensors_total"]
    rows = list(csv.DictReader((census_run / "artifacts" / "census.csv").open()))
    assert len(rows) == len(saved["tensors"])
    assert sum(r["alias"] == "False" and r["parameter"] == "False" for r in rows) == \
        m["census_tensors_total"]
    steps = [json.loads(line) for line in (census_run / "steps.jsonl").read_text().splitlines()]
    assert [s["metrics"].get("census", 0.0) for s in steps] == [0.0, 1.0, 0.0, 0.0]


def test_census_is_a_bool_for_the_torch_backend():
    from hopperlab.workloads.finetune import FinetuneParams

    with pytest.raises(ValueError, match="census: expected true or false"):
        FinetuneParams(census="yes")
    from dataclasses import fields

    from hopperlab.workloads.finetune import McoreParams, ShardedParams

    for other in (McoreParams, ShardedParams):  # the hooks run in the torch engine's process
        assert "census" not in {f.name for f in fields(other)}


def test_the_report_shows_the_census_table_and_chart(census_run):
    from hopperlab.results.report import build_report

    _summary, report = build_report(census_run.parents[2])
    page = report.read_text()
    assert '<table class="census">' in page
    assert "saved-tensor census" in page and 'alt="saved-tensor census"' in page
    for cls in SIZE_CLASSES:
        assert cls.label.replace(">", "&gt;").replace("<", "&lt;") in page
