"""benchmarks/references_gpu.sh, the one GPU call that writes references from independent
processes and checks a fresh set of runs against them, rehearsed on the CPU with selftest
stand-ins (a 2-rank run as the multi-GPU row, the noisy run declared host-bound), and its
deadline, which ends a stuck job with its workflow."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.helpers import REPO, copy_project, edit_yaml

RUNS = ("selftest/noise/noisy", "selftest/trivial/ok", "selftest/distributed/ok")


def _env(work: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO / "src"), "SITE": "local", "SCALE": "smoke",
            "NGPU": "2", "HOPPERLAB_GPU_SLOTS": "2", "HOPPERLAB_GPU_SLOTS_DIR": str(work.parent
                                                                                   / "slots"),
            "SUBS": "", "FAMILIES": "selftest", "WORK": str(work), "WHEELS": "/nonexistent",
            **extra}


@pytest.mark.integration
def test_the_script_writes_references_of_three_processes_and_checks_fresh_runs(tmp_path):
    project = copy_project(tmp_path / "project")
    shutil.copytree(REPO / "benchmarks", project / "benchmarks")
    edit_yaml(project / "experiments/selftest.yaml", lambda d: d["experiments"]["noise"].update(
        host_bound="the stand-in of a host-bound copy"))
    out, work = tmp_path / "out", tmp_path / "work"
    env = _env(work, PROCESSES="3", REPEATS="2", RUNS=",".join(RUNS),
               # deadlines far past what the runs need: this test is about what the script
               # writes; the deadline test below is about deadlines
               SNAKEMAKE_TIMEOUT_S="900", FRESH_TIMEOUT_S="600")
    done = subprocess.run(["bash", "benchmarks/references_gpu.sh", str(out)], cwd=project,
                          env=env, capture_output=True, text=True, timeout=1700)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["script.log", "check.txt", "references.diff", "references.tgz", "energy.txt",
         "runs.tgz"])
    assert (out / "energy.txt").read_text().startswith("| run | status | window s |")
    log = (out / "script.log").read_text()
    assert "ref: snakemake exit 0" in log and "fresh: snakemake exit 0" in log, log
    assert log.count("snakemake --config") == 2, log  # one call measures, one is checked
    check = (out / "check.txt").read_text()
    assert check.count("\nexit 0") == 2, check          # the update and the fresh check
    assert "one process per run" not in check and "no-reference" not in check, check
    written = yaml.safe_load((work / "references/cpu-x86_64.yaml").read_text())["references"]
    for key in RUNS:
        rec = json.loads((work / "ref" / key / "record.json").read_text())
        assert [p["status"] for p in rec["processes"]] == ["ok"] * 3, key
        for entry in written[key].values():
            assert entry["n"] == 3 and "3 independent processes" in entry["source"], entry
    host = json.loads((work / "ref/selftest/noise/noisy/record.json").read_text())
    assert host["isolation"]["isolated"] is True, host["isolation"]
    # the shipped files are untouched: the references went into the copy
    assert "Only in" in (out / "references.diff").read_text()
    assert not (project / "configs/references/cpu-x86_64.yaml").exists()


def _processes_naming(text: str) -> list[str]:
    """Command lines of live processes that contain ``text`` (zombies left out)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (proc / "stat").read_text().split(") ", 1)[1][0]
        except (OSError, IndexError):
            continue
        if text in cmd and state != "Z":
            found.append(cmd)
    return found


@pytest.mark.integration
def test_a_run_past_its_deadline_is_ended_with_its_job(tmp_path):
    """A job that outlives its pass's deadline and takes no SIGINT or SIGTERM (selftest's
    `stuck`: a job stuck in a driver call; submitit's tasks also bypass SIGTERM) is ended with
    its snakemake: the pass says it was stopped, the script goes on to its files, and no
    process of the run is left to hold the GPU (2026-11-28 11:34 UTC a call was lost after its
    `timeout` bound; what outlived it was not recorded, docs/benchmarks/distributed.md)."""
    project = copy_project(tmp_path / "project")
    shutil.copytree(REPO / "benchmarks", project / "benchmarks")
    edit_yaml(project / "experiments/selftest.yaml", lambda d: d["experiments"]["faults"][
        "variants"].update(stuck={"params": {"action": "stuck", "sleep_s": 300},
                                  "resources": {"time_min": 10}}))
    out, work = tmp_path / "out", tmp_path / "work"
    env = _env(work, PROCESSES="1", REPEATS="3", RUNS="selftest/faults/stuck",
               SNAKEMAKE_TIMEOUT_S="30", FRESH_TIMEOUT_S="10", GRACE_S="3",
               HOPPERLAB_WARM_START="0")  # the job through submitit, as on a GPU node
    done = subprocess.run(["bash", "benchmarks/references_gpu.sh", str(out)], cwd=project,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    log = (out / "script.log").read_text()
    assert "ref: snakemake exit 124" in log, log  # stopped at its deadline
    assert "references update, check: exit" in log, log  # and the script went on
    assert not _processes_naming(str(work)), _processes_naming(str(work))
