"""The issue 35 GPU call's CPU paths: the layer benchmark and the 13B script fail loudly on a
node without a GPU, and the layer benchmark runs end to end on a CPU when asked to."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.helpers import REPO


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO}", **extra}
    env.pop("GPUS", None)
    return env


@pytest.mark.integration  # a subprocess that imports torch, ~3 s
def test_the_layer_benchmark_refuses_a_node_without_cuda():
    proc = subprocess.run([sys.executable, "benchmarks/block_compile_gpu.py"], cwd=REPO,
                          env=_env(CUDA_VISIBLE_DEVICES=""), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and "no CUDA device" in proc.stderr


@pytest.mark.integration  # dynamo + AOTAutograd on one tiny layer, ~10 s
def test_the_layer_benchmark_on_a_cpu_times_eager_compiled_and_the_matmuls(tmp_path):
    out = tmp_path / "block.json"
    proc = subprocess.run([sys.executable, "benchmarks/block_compile_gpu.py", "--device", "cpu",
                           "--shape", "tiny", "--backend", "aot_eager", "--tokens", "64",
                           "--seq", "16", "--iters", "2", "--warmup", "1", "--json", str(out)],
                          cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(out.read_text())
    assert got["tokens"] == 64 and got["floor_ms"] > 0
    for key in ("eager", "compiled", "matmuls_only"):
        assert got[f"{key}_ms"] > 0
        assert got[f"{key}_over_floor"] == pytest.approx(got[f"{key}_ms"] / got["floor_ms"])
    assert got["output_rel_diff"] < 1e-6 and got["input_grad_rel_diff"] < 1e-6  # same graph
    assert "compiled (aot_eager)" in proc.stdout


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this node has nvidia-smi")
def test_the_13b_script_refuses_a_node_without_gpus(tmp_path):
    proc = subprocess.run(["bash", "benchmarks/sharded_13b_gpu.sh", str(tmp_path / "out"), "all"],
                          cwd=REPO, env=_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "no GPU on this node" in proc.stderr
    assert not (tmp_path / "out").exists()  # nothing started, nothing written
