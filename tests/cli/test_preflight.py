"""Issue 37, item 6: one preflight per workflow. A Slurm partition the cluster lacks, a missing
nsys for a profiled run, an unreachable Hub for an asset to fetch: one line with the way out and
exit status 2 before any job, and the runs' finished files left in place (a refused job's
output is deleted by Snakemake)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from hopperlab.cli import workflow
from hopperlab.config.matrix import load_matrix
from hopperlab.core.errors import NoNetworkError
from tests.helpers import copy_project, snakemake

pytestmark = pytest.mark.timeout(900)

SELECT = ["families=selftest", "only=selftest/faults/ok,selftest/faults/skipped"]


def _site(project: Path, name: str, partition: str) -> None:
    site = {"description": "a Slurm site of the tests", "executor": "slurm",
            "poll_interval_s": 1, "slurm": {"partition": partition},
            "resources": {"smoke": {"gpus": 0, "cpus": 1, "mem_gb": 1, "time_min": 5},
                          "full": {"gpus": 0, "cpus": 1, "mem_gb": 1, "time_min": 5}}}
    (project / f"configs/sites/{name}.yaml").write_text(yaml.safe_dump(site))


def _finished_files(project: Path) -> dict[str, bytes]:
    results = project / "results"
    return {str(p.relative_to(results)): p.read_bytes() for p in sorted(results.rglob("*"))
            if p.is_file() and p.parent.name != "submitit" and ".lock" not in p.name}


@pytest.mark.slurm
def test_a_partition_the_cluster_lacks_is_one_line_exit_2_and_deletes_nothing(tmp_path,
                                                                              slurm_cluster):
    project = copy_project(tmp_path / "project")
    first = snakemake(["--cores", "2", "--config", *SELECT], project)
    assert first.returncode == 0, first.stderr[-3000:]
    before = _finished_files(project)
    assert "selftest/faults/ok/metrics.json" in before

    _site(project, "slurm-nopart", "no-such-partition")
    out = snakemake(["--profile", "profiles/slurm", "--config", "site=slurm-nopart", *SELECT],
                    project, env=slurm_cluster.env)
    text = out.stdout + out.stderr
    assert out.returncode == 2, text[-3000:]
    said = [ln for ln in text.splitlines() if "no-such-partition" in ln]
    assert len(said) == 1, text[-3000:]
    assert "configs/sites/slurm-nopart.yaml: slurm.partition" in said[0], said
    assert slurm_cluster.partition in said[0]            # the way out: the partitions there are
    assert "Traceback" not in text and "Error in rule" not in text, text[-3000:]
    assert _finished_files(project) == before            # nothing deleted, moved or added
    assert slurm_cluster.run(["squeue", "-h"]).stdout.strip() == ""


@pytest.mark.integration
def test_a_missing_nsys_is_one_line_exit_2_before_any_job(tmp_path):
    project = copy_project(tmp_path / "project")
    select = ["families=membench", "only=membench/copy/h2d-pinned"]
    first = snakemake(["--cores", "2", "--config", *select], project)
    assert first.returncode == 0, first.stderr[-3000:]
    before = _finished_files(project)
    env = {"PATH": os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep)
                                   if not (Path(p) / "nsys").exists())}
    out = snakemake(["--cores", "2", "--config", *select, "profiler=nsys"], project, env=env)
    text = out.stdout + out.stderr
    assert out.returncode == 2, text[-3000:]
    said = [ln for ln in text.splitlines() if "no nsys" in ln]
    assert len(said) == 1 and said[0].startswith("hopperlab: "), text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    assert _finished_files(project) == before


def test_an_unreachable_hub_for_an_asset_to_fetch_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    matrix = load_matrix(copy_project(tmp_path / "p"), {"scale": "full", "site": "gpu-node"})
    from hopperlab.assets.registry import load_assets

    specs = load_assets(matrix.root)
    hub_assets = [n for n, s in specs.items() if workflow.hub.needs_hub(s)]
    assert hub_assets
    with pytest.raises(NoNetworkError) as err:
        workflow.preflight(matrix, [], hub_assets[:1], specs)
    text = str(err.value)
    assert "\n" not in text and "HF_HUB_OFFLINE is set" in text and "asset_substitutes" in text
    workflow.preflight(matrix, [], [], specs)            # nothing to fetch: nothing to check


def test_a_refused_submissions_kept_attempt_gets_its_metrics_back(tmp_path):
    """Snakemake deletes the output of a job that failed; when the job was a submission the
    scheduler refused, the earlier attempt (a result) was kept: its metrics.json comes back."""
    project = copy_project(tmp_path / "project")
    matrix = load_matrix(project, {"families": "selftest"})
    run_dir = project / matrix.get("selftest/faults/ok").run_dir
    run_dir.mkdir(parents=True)
    rec = {"key": "selftest/faults/ok", "status": "ok", "attempt": 1}
    (run_dir / "record.json").write_text(json.dumps(rec))
    events = [{"attempt": 1, "event": "end"}, {"attempt": 2, "event": "not-submitted"}]
    (run_dir / "history.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    assert workflow.keep_finished_outputs(matrix) == ["selftest/faults/ok"]
    assert json.loads((run_dir / "metrics.json").read_text()) == rec
    (run_dir / "metrics.json").unlink()
    rec["status"] = "failed"
    (run_dir / "record.json").write_text(json.dumps(rec))
    assert workflow.keep_finished_outputs(matrix) == []   # a failure is never a done output
