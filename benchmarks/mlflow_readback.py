"""Read back what a tracking server holds for a workflow's runs: status, headline and ``prof_``
metrics, and the profile artifacts, one block per run (docs/profiling.md's "done when" table).

    python benchmarks/mlflow_readback.py http://127.0.0.1:5000 [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import sys

SHOWN = ("tokens_per_s", "step_time_p50_s", "peak_gpu_allocated_gib", "gbps_peak",
         "data_wait_fraction", "bytes_to_host_per_step", "prof_capture_s", "prof_gpu_busy_frac",
         "prof_top_kernel_share", "prof_kernel_share", "prof_memops_share",
         "prof_memcpy_h2d_share", "prof_memcpy_d2h_share", "prof_memcpy_h2d_bytes",
         "prof_memcpy_d2h_bytes", "prof_um_share", "prof_um_bytes", "prof_um_gpu_faults",
         "prof_um_cpu_faults", "prof_gpu_idle_gaps", "prof_gpu_idle_gap_s",
         "prof_gpu_idle_gap_frac", "prof_nvtx_step_mean_ms", "prof_nvtx_data.wait_s")


def artifact_files(client, run_id: str, path: str) -> list[tuple[str, int]]:
    out = []
    for info in client.list_artifacts(run_id, path):
        if info.is_dir:
            out += artifact_files(client, run_id, info.path)
        else:
            out.append((info.path, int(info.file_size or 0)))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("uri")
    ap.add_argument("--json", dest="json_out")
    args = ap.parse_args()
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=args.uri)
    rows = []
    for exp in client.search_experiments():
        for run in client.search_runs([exp.experiment_id], max_results=500):
            key = run.data.tags.get("hopperlab.run_key")
            if not key:       # the experiment-level parent runs
                continue
            files = artifact_files(client, run.info.run_id, "artifacts/profile")
            rows.append({"key": key, "status": run.data.tags.get("hopperlab.status"),
                         "run_id": run.info.run_id,
                         "top_kernel": run.data.tags.get("prof.top_kernel", ""),
                         "reports_missing": run.data.tags.get("prof.reports_missing", ""),
                         "metrics": {k: v for k, v in run.data.metrics.items()
                                     if k in SHOWN or k.startswith("prof_nvtx_")},
                         "n_prof_metrics": sum(k.startswith("prof_") for k in run.data.metrics),
                         "profile_files": files})
    rows.sort(key=lambda r: r["key"])
    for r in rows:
        print(f"{r['key']}  status={r['status']}  prof_ metrics={r['n_prof_metrics']}  "
              f"run_id={r['run_id'][:8]}")
        print("    " + "  ".join(f"{k.removeprefix('prof_')}={v:.4g}" for k, v in
                                 sorted(r["metrics"].items()) if not k.startswith("prof_nvtx_")
                                 or k in SHOWN))
        nvtx = {k: v for k, v in r["metrics"].items() if k.startswith("prof_nvtx_")
                and k.endswith("_s") and k not in SHOWN}
        if nvtx:
            print("    nvtx s: " + "  ".join(f"{k[10:-2]}={v:.3g}" for k, v in
                                             sorted(nvtx.items(), key=lambda kv: -kv[1])[:8]))
        if r["top_kernel"]:
            print(f"    top kernel: {r['top_kernel'][:110]}")
        print("    artifacts/profile: " + ", ".join(
            f"{p.rsplit('/', 1)[-1]} ({s / 1e6:.2f} MB)" for p, s in r["profile_files"]))
    if args.json_out:
        with open(args.json_out, "w") as fh:
            json.dump(rows, fh, indent=1)
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
