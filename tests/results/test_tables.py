"""``hopperlab table runs|sharded|energy RESULTS_DIR`` (results/tables): the columns the docs
cite, and the energy gate judged against the node's matmul probe read from its own
``membench/matmul`` runs in the same folder (results/machines/probes.py)."""

from __future__ import annotations

from pathlib import Path

from hopperlab.cli.main import main
from hopperlab.results.machines.descriptions import Figure, MatmulProbe
from hopperlab.results.machines.probes import probes_from_runs, with_measured
from hopperlab.results.rows import collect_runs

from tests.helpers import REPO
from tests.results.run_dirs import write_run

FINETUNE = "finetune/full-1b/bf16"


def _probe_run(results: Path, dtype: str, tflop_per_j: float, machine: str = "m1") -> None:
    write_run(results, f"membench/matmul/{dtype}", samples=(), machine=machine,
              record={"metrics": {"tflops": 700.0, "tflop_per_j": tflop_per_j},
                      "tags": {}})


def _finetune(results: Path, key: str = FINETUNE, tflop_per_j: float = 1.0) -> None:
    # model FLOP per joule = flops_per_token x train_tokens_per_j / 1e12
    write_run(results, key, samples=(), record={"metrics": {
        "flops_per_token": 1e10, "train_tokens_per_j": tflop_per_j * 100.0,
        "energy_gpu_j": 100.0, "energy_window_s": 3.0, "tokens_per_s": 1e4}, "tags": {}})


def _table(tmp_path: Path, capsys, *words: str) -> str:
    assert main(["--root", str(REPO), "table", *words]) == 0
    return capsys.readouterr().out


def test_the_probe_comes_from_the_folder_s_matmul_runs(tmp_path):
    _probe_run(tmp_path, "bf16", 0.5)
    _probe_run(tmp_path, "fp8", 0.9)
    _probe_run(tmp_path / "other", "bf16", 0.7, machine="m2")
    probes = probes_from_runs([*collect_runs(tmp_path), *collect_runs(tmp_path / "other")])
    assert probes["m1"].ceiling(False) == 0.5 and probes["m1"].ceiling(True) == 0.9
    assert probes["m2"].ceiling(True) == 0.7  # no fp8 run: the bf16 figure
    described = {"m1": MatmulProbe(Figure(0.1, "a description")),
                 "m3": MatmulProbe(Figure(0.3, "a description"))}
    merged = with_measured(described, collect_runs(tmp_path))
    assert merged["m1"].ceiling(False) == 0.5 and merged["m3"].ceiling(False) == 0.3


def test_the_energy_table_judges_runs_against_the_folder_s_probe(tmp_path, capsys):
    _finetune(tmp_path)
    out = _table(tmp_path, capsys, "energy", str(tmp_path))
    assert out.splitlines()[0].startswith("| run | status | window s | GPU J | host J |")
    assert "implausible" not in out and "(no matmul probe" in out
    _probe_run(tmp_path, "bf16", 0.5)  # the run's 1.0 TFLOP/J is 100 % above the ceiling
    out = _table(tmp_path, capsys, "energy", str(tmp_path))
    line = next(x for x in out.splitlines() if x.startswith(f"| {FINETUNE} "))
    assert "implausible: 1 TFLOP per joule" in line and "| 1 (0.5) |" in line, line
    assert f"implausible: {FINETUNE}" in out.splitlines()[-1]


def test_the_runs_and_sharded_tables_keep_their_columns(tmp_path, capsys):
    write_run(tmp_path)
    out = _table(tmp_path, capsys, "runs", str(tmp_path)).splitlines()
    assert out[0].split() == ["run", "status", "check", "cost", "headline"]
    assert out[1].startswith("selftest/noise/noisy") and " ok " in out[1]
    assert out[-1] == "machines: m1"
    write_run(tmp_path, "finetune/full-llama2-13b-sharded/fsdp2", samples=(),
              record={"metrics": {"s_per_iter": 2.5}, "tags": {}})
    out = _table(tmp_path, capsys, "sharded", str(tmp_path), "--json",
                 str(tmp_path / "s.json")).splitlines()
    assert out[0].startswith("run | status | set-up s | build s |")
    assert out[1].startswith("fsdp2 | ok |") and "| 2.5 |" in out[1]
    assert '"s_per_iter": 2.5' in (tmp_path / "s.json").read_text()
    assert main(["--root", str(REPO), "table", "runs", str(tmp_path / "none")]) == 2
    assert "none: not a results folder" in capsys.readouterr().err
