"""benchmarks/references_gpu.sh, the one GPU call that writes references from repeats and checks
a fresh set of runs against them, rehearsed on the CPU with selftest stand-ins (a 2-rank run as
the multi-GPU row), and its bookkeeping (benchmarks/references_gpu.py) on made-up records."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hopperlab.core.rundir import write_json_atomic
from tests.helpers import REPO, copy_project

sys.path.insert(0, str(REPO / "benchmarks"))


def _run(results: Path, key: str, status: str = "ok", repeats: int = 1, samples: int = 0):
    run = results / key
    tags = {"repeats": str(repeats)} if repeats > 1 else {}
    family, experiment, variant = key.split("/")
    rec = {"key": key, "family": family, "experiment": experiment, "variant": variant,
           "status": status, "reason": None if status == "ok" else "it broke",
           "metrics": {"value": 1.0}, "tags": tags}
    write_json_atomic(run / "record.json", rec)
    write_json_atomic(run / "metrics.json", rec)
    (run / "samples.jsonl").write_text("".join(
        json.dumps({"repeat": i, "metrics": {"value": 1.0}}) + "\n" for i in range(samples)))


def test_only_runs_that_measured_the_repeats_asked_for_go_on(tmp_path):
    import references_gpu

    _run(tmp_path, "selftest/a/ok", repeats=3, samples=3)
    _run(tmp_path, "selftest/b/once")                         # repeats never reached the job
    _run(tmp_path, "selftest/c/short", repeats=3, samples=2)  # a window lost
    _run(tmp_path, "selftest/d/failed", status="failed", repeats=3, samples=3)
    good, why = references_gpu.measured(tmp_path, 3)
    assert good == ["selftest/a/ok"]
    text = "\n".join(why)
    assert "selftest/b/once: repeats did not reach the job (tag repeats=1, 0 samples" in text
    assert "selftest/c/short: repeats did not reach the job (tag repeats=3, 2 samples" in text
    assert "selftest/d/failed: failed (it broke)" in text
    assert references_gpu.measured(tmp_path, 1)[0] == sorted(
        ["selftest/a/ok", "selftest/b/once", "selftest/c/short"])


def test_a_reference_of_processes_needs_the_run_measured_in_every_process(tmp_path):
    """Each folder is one independent process of the runs: a run lost in one of them makes no
    reference (`references update` needs 3 process medians), and the reason names the folder."""
    import references_gpu

    folders = [tmp_path / f"gpu0-ref-{i}" for i in (1, 2, 3)]
    for folder in folders:
        _run(folder, "selftest/a/ok", repeats=2, samples=2)
    for folder in folders[:2]:
        _run(folder, "selftest/b/lost", repeats=2, samples=2)  # its third process never ran
    _run(folders[2], "selftest/c/late", repeats=2, samples=2)
    good, why = references_gpu.measured(folders, 2)
    assert good == ["selftest/a/ok"]
    text = "\n".join(why)
    assert "selftest/b/lost: not measured in 1 of 3 processes (gpu0-ref-3)" in text, text
    assert "selftest/c/late: not measured in 2 of 3 processes (gpu0-ref-1, gpu0-ref-2)" in text
    assert references_gpu.measured([tmp_path / "none-1", tmp_path / "none-2"], 2) == ([], [])


@pytest.mark.parametrize("processes, repeats, multi_repeats", [
    ("2", "2", "2"), ("0", "2", "2"), ("x", "2", "2"), ("1", "2", "3"), ("1", "3", "2")])
def test_the_script_refuses_a_number_of_processes_that_makes_no_reference(
        tmp_path, processes, repeats, multi_repeats):
    """Two processes have no spread worth the name and `references update` skips them; one
    process needs 3 windows (the multi-GPU rows' too, when there are some). Said before
    anything runs."""
    env = {**os.environ, "PROCESSES": processes, "REPEATS": repeats,
           "MULTI_REPEATS": multi_repeats, "WORK": str(tmp_path / "work")}
    done = subprocess.run(["bash", "benchmarks/references_gpu.sh", str(tmp_path / "out")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith("[references] PROCESSES="), done.stderr
    assert not (tmp_path / "work").exists() and not (tmp_path / "out").exists()


@pytest.mark.integration
def test_the_script_writes_references_from_repeats_and_checks_fresh_runs(tmp_path):
    project = copy_project(tmp_path / "project")
    shutil.copytree(REPO / "benchmarks", project / "benchmarks")
    out, work = tmp_path / "out", tmp_path / "work"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "SITE": "local", "SCALE": "smoke",
           "NGPU": "2", "SUBS": "", "FAMILIES": "selftest", "WORK": str(work), "PROCESSES": "3",
           "REPEATS": "2", "MULTI_REPEATS": "2",
           # deadlines far past what the runs need (about 400 s on 2 loaded cores): this test
           # is about what the script writes; the deadline test below is about deadlines
           "BUDGET_S": "1500", "MULTI_S": "600", "TAIL_S": "240",
           "WHEELS": "/nonexistent", "LANE0": "selftest/noise/noisy",
           "LANE1": "selftest/trivial/ok", "MULTI": "selftest/distributed/ok",
           "HOST_BOUND": "selftest/noise/*",  # the noisy stand-in plays a host-bound copy
           "PROBE": "1"}  # the energy probes (a CPU's matmul here: nothing to divide by)
    done = subprocess.run(["bash", "benchmarks/references_gpu.sh", str(out)], cwd=project,
                          env=env, capture_output=True, text=True, timeout=1700)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["script.log", "check.txt", "references.diff", "references.tgz", "energy.txt",
         "runs.tgz", "probe-bf16.json", "probe-fp8.json"])
    log = (out / "script.log").read_text()
    assert "energy probe bf16: exit 0" in log and "energy probe fp8: exit 0" in log, log
    assert all(json.loads((out / f"probe-{d}.json").read_text())["iters"] > 0
               for d in ("bf16", "fp8"))
    assert log.index("energy probe fp8") < log.index("multi-ref-1 ")  # before the phases
    energy = (out / "energy.txt").read_text()
    assert "== multi-ref" in energy and "usage:" not in energy, energy  # --probe taken
    for lane, key in (("multi", "selftest/distributed/ok"), ("host", "selftest/noise/noisy"),
                      ("gpu1", "selftest/trivial/ok")):
        assert f"{lane}: measured (processes 3, repeats 2 each): {key}" in log, log
        assert f"references update {lane} (3 processes): exit 0" in log, log
    # a host-bound run runs alone: after the multi-GPU phase, on GPU 0, and both of its passes
    # end before either lane starts (beside a lane its link or CPU figure moves with the lane)
    lines = log.splitlines()
    at = {phase: [i for i, line in enumerate(lines) if f"] {phase}-" in line]
          for phase in ("multi", "host", "gpu0", "gpu1")}
    assert at["host"] and not at["gpu0"], log        # LANE0's only run moved to the host phase
    assert max(at["multi"]) < min(at["host"]) and max(at["host"]) < min(at["gpu1"]), log
    assert all(f"host-ref-{i} selftest/noise/noisy: start (GPUs 0," in log for i in (1, 2, 3))
    assert "host-fresh selftest/noise/noisy: start (GPUs 0," in log, log
    check = (out / "check.txt").read_text()
    assert check.count("\nexit 0") == 3, check          # every fresh folder passes its check
    assert "check host-fresh" in check, check
    assert "no-reference" not in check, check
    for key in ("selftest/distributed/ok", "selftest/noise/noisy", "selftest/trivial/ok"):
        assert any(line.split()[1] == key and " n 3 " in line    # three process medians
                   for line in check.splitlines() if line.startswith("cpu-")), check
    written = (work / "references/cpu-x86_64.yaml").read_text()
    assert "median of 3 independent runs" in written and "repeats (windows)" not in written
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
    from tests.helpers import edit_yaml

    project = copy_project(tmp_path / "project")
    shutil.copytree(REPO / "benchmarks", project / "benchmarks")
    edit_yaml(project / "experiments/selftest.yaml", lambda d: d["experiments"]["faults"][
        "variants"].update(stuck={"params": {"action": "stuck", "sleep_s": 300},
                                  "resources": {"time_min": 10}}))
    out, work = tmp_path / "out", tmp_path / "work"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "SITE": "local", "SCALE": "smoke",
           "NGPU": "1", "SUBS": "", "FAMILIES": "selftest", "WORK": str(work), "PROCESSES": "1",
           "REPEATS": "3",
           "BUDGET_S": "60", "TAIL_S": "10", "REF_SHARE": "60", "GRACE_S": "3",
           "WHEELS": "/nonexistent", "LANE0": "selftest/faults/stuck", "LANE1": "",
           "MULTI": "", "PROBE": "0",
           "HOPPERLAB_WARM_START": "0"}  # the job through submitit, as on a GPU node
    done = subprocess.run(["bash", "benchmarks/references_gpu.sh", str(out)], cwd=project,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    log = (out / "script.log").read_text()
    assert "gpu0-ref-1 selftest/faults/stuck: snakemake exit 124" in log, log
    assert "(stopped at its deadline)" in log, log
    assert "gpu0: measured (processes 1, repeats 3 each): none" in log, log
    assert not _processes_naming(str(work)), _processes_naming(str(work))
