"""The sharded backend measures ``repeats`` as windows (issue 36): a 13B rerun costs 40-70 s of
set-up, so the model is built once, warmed up once, and each window of ``measured_steps`` steps
is one sample; every window stays inside the one measured region, the work done is summed once
over the windows, and ``hopperlab references update`` takes such a run (n = windows)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import yaml

from hopperlab.core.rundir import Recorder, read_samples, read_steps
from hopperlab.results.machines.reference_update import update
from hopperlab.run import repeats
from hopperlab.workloads.finetune import FAMILY, HEADLINE_METRICS
from hopperlab.workloads.finetune.sharded import llama, engine as sharded
from tests.infra.mlflow_fixture import free_port

SHAPE = llama.Shape(hidden=32, heads=4, ffn=64, vocab=64, layers=2)
KEY = "finetune/full-llama2-13b-sharded/fsdp2"
STEPS, WARMUP, WINDOWS, SEQ, GLOBAL = 2, 1, 3, 8, 4
TOKENS = GLOBAL * SEQ  # one step's, every rank's


def _plan(mode: str = "fsdp2", windows: int = WINDOWS) -> sharded.Plan:
    return sharded.Plan(mode=mode, shape=SHAPE, seq_len=SEQ, micro_batch=2, global_batch=GLOBAL,
                        steps=STEPS, warmup=WARMUP, dtype=torch.float32, lr=1e-3,
                        weight_decay=0.0, seed=3, checkpointing=False, cpus=1, windows=windows)


def test_windows_are_samples_of_one_built_model_and_make_a_reference(tmp_path, monkeypatch):
    """One process (FSDP2 over a group of one): repeats=3 through the runner's ``measure``
    builds once, measures 3 windows after one warm-up, records 3 samples whose tokens sum to
    the run's (not 3 x the sum), and ``references update`` writes the judged figures, n=3."""
    builds = []
    real = sharded.build_sharded
    monkeypatch.setattr(sharded, "build_sharded",
                        lambda *a, **k: builds.append(1) or real(*a, **k))
    run_dir = tmp_path / "results" / KEY
    family, experiment, variant = KEY.split("/")
    rec = Recorder(run_dir, identity={"family": family, "experiment": experiment,
                                      "variant": variant, "machine": "cpu-test"})
    spec = SimpleNamespace(repeats=WINDOWS, headline_metrics=HEADLINE_METRICS)
    repeats.measure(lambda s, r: sharded.run(_plan(windows=s.repeats), r, False, None),
                    spec, rec, FAMILY)

    assert builds == [1]
    assert rec.tags["repeat_unit"] == "windows"
    samples = read_samples(run_dir)
    assert len(samples) == WINDOWS == len(rec.samples)
    for s in samples:
        assert s["measured_tokens"] == STEPS * TOKENS
        assert s["tokens_per_s"] == pytest.approx(TOKENS / s["step_time_p50_s"])
        assert s["s_per_iter"] == s["step_time_p50_s"] > 0
        assert s["optimizer_step_s"] > 0 and s["optimizer_exposed_s"] >= 0
    m = rec.metrics
    assert m["measured_tokens"] == WINDOWS * STEPS * TOKENS  # summed once over the windows
    assert m["step_time_p50_s_n"] == m["tokens_per_s_n"] == WINDOWS
    steps = read_steps(run_dir)
    assert [s["step"] for s in steps] == list(range(WARMUP + WINDOWS * STEPS))
    assert [s.get("repeat") for s in steps] == [None] * WARMUP + [
        w for w in range(WINDOWS) for _ in range(STEPS)]
    rec.finish("ok")
    (run_dir / "spec.json").write_text(json.dumps({
        "key": KEY, "family": family, "experiment": experiment, "variant": variant,
        "headline_metrics": list(HEADLINE_METRICS)}))

    report = update(tmp_path / "results", tmp_path / "refs", today="2026-12-01")
    assert sorted(report.updated) == [f"cpu-test {KEY} step_time_p50_s",
                                      f"cpu-test {KEY} tokens_per_s"], report.skipped
    written = yaml.safe_load((tmp_path / "refs" / "cpu-test.yaml").read_text())
    for metric in ("step_time_p50_s", "tokens_per_s"):
        entry = written["references"][KEY][metric]
        assert entry["n"] == WINDOWS and "(windows)" in entry["source"]


def test_one_window_records_no_samples(tmp_path):
    """repeats=1 (the default): the run's figures only, as before."""
    rec = Recorder(tmp_path / "run")
    sharded.run(_plan(windows=1), rec, False, None)
    assert rec.samples == [] and rec.metrics["measured_tokens"] == STEPS * TOKENS
    assert all("repeat" not in s for s in read_steps(tmp_path / "run"))


def _ranks(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        rec = Recorder(Path(out) / str(rank))
        sharded.run(_plan("fsdp2-cpu-offload"), rec, False, None)
        (Path(out) / f"rank{rank}.json").write_text(json.dumps(
            {"samples": rec.samples, "metrics": rec.metrics}))
    finally:
        dist.destroy_process_group()


@pytest.mark.integration  # two gloo processes of FSDP2 + CPU offload, a few seconds
def test_every_rank_records_the_slowest_ranks_windows(tmp_path):
    """Two ranks: each records 3 samples; a window's step is the slower rank's p50 on both
    (one collective for the run's and the windows' p50s, the same call on every rank)."""
    mp.spawn(_ranks, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    got = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for r in got:
        assert len(r["samples"]) == WINDOWS
        assert r["metrics"]["measured_tokens"] == WINDOWS * STEPS * TOKENS
        assert sum(s["measured_tokens"] for s in r["samples"]) == r["metrics"]["measured_tokens"]
    for a, b in zip(got[0]["samples"], got[1]["samples"]):
        assert a["step_time_p50_s"] == b["step_time_p50_s"] == max(a["step_s"], b["step_s"])
    assert got[0]["metrics"]["s_per_iter"] == got[1]["metrics"]["s_per_iter"]


def test_the_runs_repeats_become_the_plans_windows(tmp_path, monkeypatch):
    """``run_sharded`` hands ``spec.repeats`` to the plan (and nothing else measures them)."""
    from hopperlab.workloads.base import fake_run
    from hopperlab.workloads.finetune import ShardedParams
    from hopperlab.workloads.finetune.sharded import entry

    plans = []
    monkeypatch.setattr(sharded, "run", lambda plan, *a: plans.append(plan))
    params = ShardedParams(sharding="fsdp2", model_shape="tiny", num_layers=2)
    rec = Recorder(tmp_path / "run")
    entry.run_sharded(fake_run(params, run_dir=tmp_path, repeats=4), params, rec)
    assert [p.windows for p in plans] == [4]


@pytest.mark.integration  # a 2-rank job through the runner (gloo), then the CLI, ~20 s
def test_a_two_rank_smoke_run_with_repeats_makes_a_reference(tmp_path):
    """The smoke row of the 13B experiment (2 ranks over gloo) with ``repeats=3``: one job, 3
    window samples in the run's record, its tokens counted once per measured step, and
    ``hopperlab references update`` writes its judged figures with n=3."""
    from tests.helpers import copy_project, hopperlab

    project = copy_project(tmp_path / "project")
    results = tmp_path / "r"
    out = hopperlab(["submit", KEY, "--no-upload", "--config", f"results_dir={results}",
                     "repeats=3"], project, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    rec = json.loads((results / KEY / "metrics.json").read_text())
    assert rec["status"] == "ok" and rec["world_size"] == 2, rec.get("reason")
    assert rec["tags"]["repeat_unit"] == "windows" and rec["tags"]["repeats"] == "3"
    assert len(read_samples(results / KEY)) == 3
    smoke_tokens = 4 * 16  # experiments/finetune.yaml smoke: global_batch 4, seq_len 16
    assert rec["metrics"]["measured_tokens"] == 3 * 2 * smoke_tokens
    refs = tmp_path / "refs"
    done = hopperlab(["--root", str(project), "references", "update", str(results),
                      "--references", str(refs), "--machine", "cpu-test"], project)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    written = yaml.safe_load((refs / "cpu-test.yaml").read_text())["references"][KEY]
    assert {m: e["n"] for m, e in written.items()} == {"step_time_p50_s": 3, "tokens_per_s": 3}
