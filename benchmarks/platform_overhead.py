"""The platform's own cost: per run (local executor and local Slurm), dry run of a large matrix,
and the upload of one run with many step metrics.

    python benchmarks/platform_overhead.py [--runs 20] [--slurm] [--out results-bench.json]

Each figure is measured on a scratch copy of the project with the `selftest` family, whose runs
do nothing, so what is timed is hopperlab + submitit + Snakemake + MLflow alone:
- per run: the wall time of the rule's command (`hopperlab submit KEY`: resolve the matrix,
  submit, wait, settle the record, upload to MLflow), median over ``--runs`` runs one at a time;
  and the whole `snakemake --cores 1` of those runs divided by their number;
- `snakemake -n` on a generated matrix of 500 runs;
- `tracking.upload_run` of one run directory holding 10,000 step metrics.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.helpers import copy_project  # noqa: E402


def _timed(cmd: list[str], cwd: Path, env: dict | None = None) -> float:
    t0 = time.perf_counter()
    out = subprocess.run(cmd, cwd=cwd, env={**os.environ, **(env or {})}, capture_output=True,
                         text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}")
    return time.perf_counter() - t0


def _selftest_matrix(project: Path, experiments: int, variants: int) -> list[str]:
    data = {"family": "selftest", "experiments": {}}
    for e in range(experiments):
        data["experiments"][f"bench{e}"] = {
            "baseline": "v0",
            "scales": {"smoke": {"params": {"steps": 3}, "resources": {"time_min": 5}},
                       "full": {"params": {"steps": 3}, "resources": {"time_min": 5}}},
            "variants": {f"v{v}": {} for v in range(variants)},
        }
    (project / "experiments/selftest.yaml").write_text(yaml.safe_dump(data))
    return [f"selftest/bench{e}/v{v}" for e in range(experiments) for v in range(variants)]


def per_run(project: Path, runs: int, site: str, env: dict | None = None) -> dict:
    keys = _selftest_matrix(project, 1, runs)
    cfg = ["--config", f"site={site}", "families=selftest"]
    py = [sys.executable, "-m", "hopperlab.cli"]
    _timed(py + ["prepare-tracking"] + cfg, project, env)
    submit = [_timed(py + ["submit", key] + cfg, project, env) for key in keys]
    shutil.rmtree(project / "results" / "selftest")
    total = _timed([sys.executable, "-m", "snakemake", "--cores", "1"]
                   + [f"results/{k}/metrics.json" for k in keys]
                   + ["--config", f"site={site}", "families=selftest", f"only={','.join(keys)}"],
                   project, env)
    return {"site": site, "runs": runs, "submit_median_s": statistics.median(submit),
            "submit_max_s": max(submit), "snakemake_per_run_s": total / runs}


def dry_run(project: Path, size: int) -> dict:
    keys = _selftest_matrix(project, size // 50, 50)
    seconds = _timed([sys.executable, "-m", "snakemake", "-n", "--cores", "2", "--config",
                      "families=selftest"], project)
    return {"runs": len(keys), "dry_run_s": seconds}


def upload(project: Path, n_metrics: int, tracking_uri: str) -> dict:
    from hopperlab.config.matrix import load_matrix
    from hopperlab.core.rundir import Recorder, write_json_atomic
    from hopperlab.results import tracking

    spec = load_matrix(project, {"families": "selftest"}).runs["selftest/bench0/v0"]
    run_dir = project / "bench-upload" / str(time.time_ns())
    data = spec.to_dict()
    data["attempt"] = 1
    write_json_atomic(run_dir / "spec.json", data)
    rec = Recorder(run_dir, identity={k: data[k] for k in ("key", "family", "experiment",
                                                            "variant")})
    for step in range(n_metrics):
        rec.log_step(step, loss=1.0 / (step + 1))
    rec.log_metric("value", 1.0)
    rec.finish("ok")
    t0 = time.perf_counter()
    tracking.upload_run(run_dir, tracking_uri)
    return {"metrics": n_metrics, "uri": tracking.redact_uri(tracking_uri),
            "upload_s": time.perf_counter() - t0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--dry-run-size", type=int, default=500)
    ap.add_argument("--metrics", type=int, default=10_000)
    ap.add_argument("--slurm", action="store_true", help="also on a local one-node Slurm cluster")
    ap.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = ap.parse_args()
    results: dict = {"machine": {"cores": os.cpu_count()}}
    with tempfile.TemporaryDirectory(prefix="hopperlab-bench-") as tmp:
        tmp_path = Path(tmp)
        tmp_path.chmod(0o755)  # the Slurm cluster's munged runs as the munge user
        project = copy_project(tmp_path / "local")
        results["local"] = per_run(project, args.runs, "local")
        print(json.dumps(results["local"]), flush=True)
        results["dry_run"] = dry_run(copy_project(tmp_path / "dry"), args.dry_run_size)
        print(json.dumps(results["dry_run"]), flush=True)
        results["upload_sqlite"] = upload(project, args.metrics,
                                          f"sqlite:///{project / 'results' / 'mlflow.db'}")
        print(json.dumps(results["upload_sqlite"]), flush=True)
        from tests.infra.mlflow_fixture import MlflowServer

        server = MlflowServer(tmp_path / "mlflow")
        server.start()
        try:
            results["upload_server"] = upload(project, args.metrics, server.uri)
            print(json.dumps(results["upload_server"]), flush=True)
            if args.slurm:
                results["slurm"] = slurm_per_run(tmp_path, args.runs, server.uri)
                print(json.dumps(results["slurm"]), flush=True)
        finally:
            server.stop()
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


def slurm_per_run(tmp_path: Path, runs: int, tracking_uri: str) -> dict:
    script = REPO / "tests/infra/slurm_cluster.sh"
    cluster_dir = tmp_path / "slurm"
    subprocess.run(["bash", str(script), "install"], check=True)
    started = subprocess.run(["bash", str(script), "start", str(cluster_dir)],
                             capture_output=True, text=True)
    if started.returncode != 0:
        raise RuntimeError(f"slurm_cluster.sh start failed:\n{started.stderr[-3000:]}")
    try:
        project = copy_project(tmp_path / "slurm-project")
        site = {"executor": "slurm", "poll_interval_s": 1, "slurm": {"partition": "debug"},
                "resources": {"smoke": {"gpus": 0, "cpus": 1, "mem_gb": 1, "time_min": 5}},
                "tracking": {"uri": tracking_uri}}
        (project / "configs/sites/bench-slurm.yaml").write_text(yaml.safe_dump(site))
        return per_run(project, runs, "bench-slurm")
    finally:
        subprocess.run(["bash", str(script), "stop", str(cluster_dir)], check=False)


if __name__ == "__main__":
    sys.exit(main())
