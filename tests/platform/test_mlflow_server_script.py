"""benchmarks/mlflow_server.sh, the tracking server the GPU scripts start for the `gpu-node`
site: it answers /health on 127.0.0.1:5000 with its store in the folder given."""
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.integration, pytest.mark.mlflow_server]


def test_the_gpu_scripts_server_starts_answers_and_keeps_its_store_where_asked(tmp_path):
    script = (f'. "{REPO}/benchmarks/mlflow_server.sh"; '
              f'start_mlflow_server "{tmp_path}/ml" "{tmp_path}/server.log" 90; rc=$?; '
              'echo "rc=$rc pid=$SERVER"; kill "$SERVER"; wait "$SERVER" 2>/dev/null; exit $rc')
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, (done.stdout, done.stderr,
                                  (tmp_path / "server.log").read_text()[-2000:])
    assert "pid=" in done.stdout and "pid= " not in done.stdout
    assert (tmp_path / "ml" / "mlflow.db").is_file()
