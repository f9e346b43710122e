"""benchmarks/noise_gpu.py's CPU parts (issue 29): the samples split into references, healthy
and loaded checks, judged by the check's own code, with the loader switched on by the sample
count. The selftest run stands in for a GPU run: 2 % noise, 10 % lower while the flag exists."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from .helpers import REPO, copy_project, edit_yaml


@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
def test_noise_benchmark_counts_false_alarms_and_detections(tmp_path):
    project = copy_project(tmp_path / "proj")
    for name in ("benchmarks",):
        subprocess.run(["cp", "-r", str(REPO / name), str(project / name)], check=True)
    subprocess.run(["cp", "-r", str(REPO / "src"), str(project / "src")], check=True)
    out = tmp_path / "out"
    flag = out / "loader.on"
    edit_yaml(project / "experiments/selftest.yaml", lambda d: d["experiments"]["noise"][
        "scales"]["smoke"]["params"].update(slow_while=str(flag), sleep_s=0.05))
    loader = f"{sys.executable} -c 'import time; time.sleep(600)'"
    proc = subprocess.run(
        [sys.executable, "benchmarks/noise_gpu.py", str(out), "--runs",
         "selftest/noise/noisy:jitter=0.01", "--site", "local", "--scale", "smoke",
         "--substitutes", "", "--loader", loader],
        cwd=project, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "noise.json").read_text())
    assert summary["runs"] == ["selftest/noise/noisy"]
    assert [c["loaded"] for c in summary["checks"]] == [False] * 20 + [True] * 20
    assert summary["false_alarms"] <= 1 and summary["detected"] >= 19
    # higher is better: healthy over loaded, 1/0.9 - 1 = 11 %
    assert 0.08 < summary["slowdown"]["selftest/noise/noisy value"] < 0.14
    refs = list((out / "references").glob("*.yaml"))
    assert len(refs) == 1 and "n: 10" in refs[0].read_text()
    assert "healthy checks failing:" in proc.stdout
