"""Three deliberate faults, each injected into a real run on the CPU (issue 47): a backward that
does not run, a saved activation handed back wrong by the activation offload, and a KV cache
reloaded into the wrong layers. Each run reads DIFFERENT against its baseline, ``hopperlab
check`` exits 1 on the folder, and its speed is offered as no ratio; the same variants without
the fault read ``same``. The faults are test-only hooks (monkeypatch), never in the matrix."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hopperlab.cli.main import main  # noqa: E402
from hopperlab.core.rundir import Recorder  # noqa: E402
from hopperlab.results import correctness  # noqa: E402
from hopperlab.results.report.summary import summary_rows  # noqa: E402
from hopperlab.results.rows import read_runs  # noqa: E402
from hopperlab.workloads.base import fake_run  # noqa: E402
# the tiny Llama and the prepared Dolly rows, built once a module
from tests.workloads.finetune.test_finetune_workload import assets  # noqa: E402,F401

FT = "finetune/lora-llama2-7b"
KV = "inference/kv-cache"


def _record(results: Path, key: str, baseline: str, params: Any, knobs: dict[str, Any],
            roles: dict[str, Path], entry: Any, repeats: int = 1) -> None:
    """Run ``entry`` as ``key`` into ``results/<key>/`` with the spec.json a run has
    (``repeats``: measured windows, each a sample)."""
    family, experiment, variant = key.split("/")
    run_dir = results / key
    spec = fake_run(params, run_dir=run_dir, assets=roles, family=family,
                    experiment=experiment, variant=variant, repeats=repeats, **knobs)
    rec = Recorder(run_dir, identity={"key": key, "family": family, "experiment": experiment,
                                      "variant": variant})
    entry(spec, rec)
    rec.finish("ok")
    (run_dir / "spec.json").write_text(json.dumps({
        "key": key, "family": family, "experiment": experiment, "variant": variant,
        "scale": "smoke", "baseline": baseline, "params": dataclasses.asdict(params),
        "knobs": dataclasses.asdict(spec.knobs), "assets": {k: str(v) for k, v in roles.items()},
        "headline_metrics": ["tokens_per_s", "ttft_ms_p50"]}))


def _finetune(results: Path, built: Path, variant: str, repeats: int = 1, **knobs: Any) -> None:
    from hopperlab.workloads.finetune import FinetuneParams
    from hopperlab.workloads.finetune.torch.workload import run

    params = FinetuneParams(weights="pretrained", dtype="float32", seq_len=128, micro_batch=4,
                            lora_rank=8, lora_alpha=16, learning_rate=0.005, warmup_steps=1,
                            measured_steps=2, data="prepared", offload_min_bytes=0,
                            offload_budget_gib=None)
    _record(results, f"{FT}/{variant}", "baseline", params, knobs,
            {"model": built / "tiny-llama", "data": built / "dolly-smoke-prepared"}, run,
            repeats)


def _kv(results: Path, built: Path, variant: str, policy: str) -> None:
    from hopperlab.workloads.inference import InferenceParams
    from hopperlab.workloads.inference.workload import run

    params = InferenceParams(study="kv-cache", policy=policy, sessions=3, rounds=3,
                             context_tokens=40, turn_tokens=9, reply_tokens=6, gpu_sessions=1,
                             warmup=0, dtype="float32", seed=3)
    _record(results, f"{KV}/{variant}", "resident", params, {},
            {"model": built / "tiny-llama"}, run)


def _skip_backward(model: Any, inputs: Any, forward_context: Any, clock: Any = None) -> Any:
    """The fault of megatron-core's full recompute with a frozen base: the loss, no backward."""
    with forward_context():
        return model(**inputs).loss


@pytest.mark.integration  # runs for seconds: five small trainings and four dialogues
def test_three_injected_faults_read_different_and_fail_check(assets, tmp_path,  # noqa: F811
                                                              monkeypatch, capsys):
    from hopperlab.memory import activation_offload
    from hopperlab.workloads.finetune.torch import loop
    from hopperlab.workloads.inference import layered_reload

    results = tmp_path / "results"
    _finetune(results, assets, "baseline")
    _finetune(results, assets, "offload-activations", offload="activations")
    with monkeypatch.context() as m:
        m.setattr(loop, "forward_backward", _skip_backward)
        _finetune(results, assets, "skipped-backward")
    unpack = activation_offload.ActivationOffload._unpack

    def stale(self: Any, packed: Any) -> Any:  # a reload that hands back a buffer not refilled
        t = unpack(self, packed)
        return torch.zeros_like(t) if isinstance(packed, activation_offload._Offloaded) else t

    with monkeypatch.context() as m:
        m.setattr(activation_offload.ActivationOffload, "_unpack", stale)
        _finetune(results, assets, "corrupt-offload", offload="activations")
    _kv(results, assets, "resident", "resident")
    _kv(results, assets, "offload", "offload")
    load = layered_reload.PinnedHostStore.load

    def shifted(self: Any, copy: Any, layered: bool, release: bool = True) -> Any:
        copy.layers = copy.layers[1:] + copy.layers[:1]  # layer i gets layer i+1's K and V
        return load(self, copy, layered, release)

    with monkeypatch.context() as m:
        m.setattr(layered_reload.PinnedHostStore, "load", shifted)
        _kv(results, assets, "wrong-kv-layer", "offload")

    runs, refused = read_runs(results)
    assert not refused
    found = {r.key: r.correctness for r in runs}
    assert found[f"{FT}/offload-activations"].state == correctness.SAME
    assert found[f"{KV}/offload"].state == correctness.SAME
    for key, first in ((f"{FT}/skipped-backward", "step 0: gradient norm 0 against"),
                       (f"{FT}/corrupt-offload", "step 0: gradient norm"),
                       (f"{KV}/wrong-kv-layer", "")):
        v = found[key]
        assert v.state == correctness.DIFFERENT, (key, v)
        assert v.detail.startswith(first), v.detail
    assert "the first token's logits of reply 0/1 differ" in found[f"{KV}/wrong-kv-layer"].detail

    header, rows = summary_rows(runs)
    by = {"/".join(row[:3]): dict(zip(header, row)) for row in rows}
    for key in (f"{FT}/skipped-backward", f"{FT}/corrupt-offload"):
        assert by[key]["tokens_per_s"] and by[key]["tokens_per_s_vs_baseline"] == "", key
    assert by[f"{FT}/offload-activations"]["tokens_per_s_vs_baseline"] != ""
    assert by[f"{KV}/wrong-kv-layer"]["ttft_ms_p50"]
    assert by[f"{KV}/wrong-kv-layer"]["ttft_ms_p50_vs_baseline"] == ""

    capsys.readouterr()
    assert main(["--root", str(tmp_path), "check", str(results), "--references",
                 str(tmp_path / "refs")]) == 1
    out = capsys.readouterr().out
    for key in ("skipped-backward", "corrupt-offload", "wrong-kv-layer"):
        assert f"/{key} against " in out, out
    assert "DIFFERENT 3" in out


@pytest.mark.integration  # runs for seconds: two small trainings of three windows each
def test_the_injected_skipped_backward_reaches_references_report_and_mlflow(
        assets, tmp_path, monkeypatch, capsys):  # noqa: F811
    """The fault of a real training through the real commands: ``references update`` takes no
    reference from it (exit 1, the line, the honest run written), the report's bar is marked,
    and its MLflow tag, uploaded while the baseline had not run, follows ``check``."""
    from hopperlab.results.tracking import upload_run
    from hopperlab.workloads.finetune.torch import loop

    from tests.helpers import copy_project

    project = copy_project(tmp_path / "proj")
    results = project / "results"
    uri = f"sqlite:///{(results / 'mlflow.db').resolve()}"   # the local site's store
    with monkeypatch.context() as m:
        m.setattr(loop, "forward_backward", _skip_backward)
        _finetune(results, assets, "skipped-backward", repeats=3)
    wrong = results / FT / "skipped-backward"
    upload_run(wrong, uri)                        # its baseline has not run yet
    _finetune(results, assets, "baseline", repeats=3)
    runs, _ = read_runs(results)
    assert {r.variant: r.correctness for r in runs}["skipped-backward"].state \
        == correctness.DIFFERENT

    refs = tmp_path / "refs"
    capsys.readouterr()
    assert main(["--root", str(project), "references", "update", str(results),
                 "--references", str(refs)]) == 1
    out = capsys.readouterr().out
    assert f"refused {FT}/skipped-backward in {results}: DIFFERENT against baseline" in out, out
    written = (refs / "unknown.yaml").read_text()
    assert f"{FT}/baseline" in written and "skipped-backward" not in written

    import mlflow

    run_id = json.loads((wrong / "mlflow.json").read_text())["run_id"]
    tags = mlflow.MlflowClient(uri).get_run(run_id).data.tags
    assert tags[correctness.MLFLOW_TAG] == correctness.NOT_COMPARED
    assert main(["--root", str(project), "check", str(results), "--references",
                 str(refs)]) == 1
    tags = mlflow.MlflowClient(uri).get_run(run_id).data.tags
    assert tags[correctness.MLFLOW_TAG] == correctness.DIFFERENT, tags

    assert main(["--root", str(project), "report"]) == 0
    page = (results / "report.html").read_text()
    assert "grey cross-hatched bars, DIFFERENT: not a finding: skipped-backward" in page
