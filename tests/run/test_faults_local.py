"""Faults of the submitting side on this machine (local executor): a time limit, a full disk."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import uuid
from pathlib import Path

import pytest

from hopperlab.config.matrix import load_matrix
from hopperlab.run import launch
from hopperlab.run import submit as submission
from tests.helpers import copy_project, hopperlab

pytestmark = pytest.mark.timeout(600)


def _history(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]


@pytest.mark.integration
def test_local_time_limit_is_recorded_as_timeout(tmp_path):
    project = copy_project(tmp_path / "project")
    out = hopperlab(["submit", "selftest/faults/overtime", "--no-upload", "--config",
                     "families=selftest"], project, timeout=400)
    assert out.returncode == 1, out.stdout[-2000:] + out.stderr[-3000:]
    run_dir = project / "results/selftest/faults/overtime"
    rec = json.loads((run_dir / "record.json").read_text())
    assert rec["status"] == "timeout", rec
    assert "time limit" in rec["reason"] and "1 min" in rec["reason"], rec["reason"]
    end = _history(run_dir)[-1]
    assert end["event"] == "end" and end["status"] == "timeout" and end["state"] == "TIMEOUT"


class TinyDisk:
    """A real filesystem that can be filled and freed: a small tmpfs mounted for one test."""

    def __init__(self, mountpoint: Path, size: str = "4m") -> None:
        self.mountpoint = mountpoint
        mountpoint.mkdir(parents=True)
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                               str(mountpoint)], capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here (root and CAP_SYS_ADMIN needed): "
                        f"{proc.stderr.strip()}")
        self.filler = mountpoint / "filler"

    def fill(self) -> None:
        """Write until the filesystem says ENOSPC."""
        with open(self.filler, "wb") as fh:
            try:
                while True:
                    fh.write(b"\0" * 65536)
                    fh.flush()
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)

    def unmount(self) -> None:
        subprocess.run(["umount", "-l", str(self.mountpoint)], check=False)


@pytest.fixture
def tiny_disk(tmp_path):
    disk = TinyDisk(tmp_path / f"disk-{uuid.uuid4().hex[:6]}")
    try:
        yield disk
    finally:
        disk.unmount()


@pytest.mark.integration
def test_full_disk_after_the_job_ends_failed_naming_the_device(tmp_path, tiny_disk,
                                                                monkeypatch):
    """The disk fills between the job's end and the copy of its logs; space comes back while
    the submitting side waits to write the record."""
    project = copy_project(tmp_path / "project")
    results = tiny_disk.mountpoint / "results"
    matrix = load_matrix(project, {"families": "selftest", "results_dir": str(results)})
    real_run_job = launch.run_job

    def run_job_then_fill_disk(*args, **kwargs):
        outcome = real_run_job(*args, **kwargs)
        tiny_disk.fill()
        return outcome

    monkeypatch.setattr(launch, "run_job", run_job_then_fill_disk)
    said: list[str] = []

    def log(line: str) -> None:
        said.append(line)
        if "no space left" in line:
            tiny_disk.free()  # someone cleans up, as a user would

    rc = submission.submit(matrix, "selftest/faults/ok", executor="local",
                           log=log)
    assert rc == 1, said
    run_dir = results / "selftest/faults/ok"
    rec = json.loads((run_dir / "record.json").read_text())
    assert rec["status"] == "failed", rec
    assert rec["reason"].startswith("no space left on "), rec["reason"]
    assert str(tiny_disk.mountpoint) in rec["reason"], rec["reason"]
    assert not (run_dir / "metrics.json").exists()  # a failed run leaves no Snakemake output
    end = _history(run_dir)[-1]
    assert end["event"] == "end" and end["status"] == "failed"
    assert any("no space left" in line for line in said), said


def test_disk_full_reason_names_device_and_mount(tmp_path, tiny_disk):
    tiny_disk.fill()
    with pytest.raises(OSError) as info:
        (tiny_disk.mountpoint / "x").write_bytes(b"x" * 65536)
    reason = submission.disk_full_reason(tiny_disk.mountpoint / "x", info.value)
    assert reason.startswith("no space left on tmpfs mounted at "), reason
    assert os.fspath(tiny_disk.mountpoint) in reason


def test_a_job_that_died_of_a_full_disk_is_recorded_as_such(tmp_path):
    """The job itself hit ENOSPC and could not write its record: the reason names the disk."""
    stderr = tmp_path / "job.err"
    stderr.write_text("Traceback (most recent call last):\n"
                      f"OSError: [Errno 28] No space left on device: '{tmp_path}/steps.jsonl'\n")
    outcome = launch.JobOutcome(job_id=None, state="FAILED", stderr=stderr)
    tail = submission._last_error_line(submission._job_output(outcome))
    reason = submission._died_reason(outcome, tail)
    assert reason.startswith("no space left on ") and f"{tmp_path}/steps.jsonl" in reason


# --------------------------------------------------------------------------- issue 28 item 9
ODD_VALUE = "two words; $(echo not-run) `x` 'q'"


def _env_variant(project: Path, site: str) -> None:
    from tests.helpers import edit_yaml

    edit_yaml(project / "experiments/selftest.yaml", lambda d: d["experiments"]["faults"][
        "variants"].__setitem__("env", {"params": {
            "env_names": "OMP_NUM_THREADS,HOPPERLAB_ODD,HF_TOKEN,MLFLOW_TRACKING_PASSWORD"}}))
    edit_yaml(project / f"configs/sites/{site}.yaml", lambda d: d.update(
        env={"OMP_NUM_THREADS": 1, "HOPPERLAB_ODD": ODD_VALUE}))


def check_job_environment(run_dir: Path) -> None:
    """What the job saw: the site's env, verbatim (no shell), and none of the secrets."""
    rec = json.loads((run_dir / "record.json").read_text())
    assert rec["status"] == "ok", rec
    tags = rec["tags"]
    assert tags["selftest.env.OMP_NUM_THREADS"] == "1", tags
    assert tags["selftest.env.HOPPERLAB_ODD"] == ODD_VALUE, tags
    assert tags["selftest.env.HF_TOKEN"] == "<unset>", tags
    assert tags["selftest.env.MLFLOW_TRACKING_PASSWORD"] == "<unset>", tags
    assert rec["hardware"]["threads"]["intra_op"] == 1, rec["hardware"]["threads"]


SECRETS = {"HF_TOKEN": "hf_secret_token", "MLFLOW_TRACKING_PASSWORD": "pw-secret"}


@pytest.mark.integration
@pytest.mark.parametrize("how", ["submit", "run"])
def test_a_sites_env_reaches_the_job_without_a_shell_and_secrets_do_not(tmp_path, how):
    """Issue 28 items 9 and 10: a site's `env:` was recorded as applied but never applied
    (OMP_NUM_THREADS: 1, and the job ran 2 intra-op threads); the job inherited the
    submitting side's MLflow password and Hugging Face token."""
    project = copy_project(tmp_path / "project")
    _env_variant(project, "local")
    out = hopperlab([how, "selftest/faults/env", "--no-upload", "--config", "families=selftest"],
                    project, env=SECRETS)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    check_job_environment(project / "results/selftest/faults/env")


@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
@pytest.mark.parametrize("name", ["BAD-NAME", "1ST", "A B", "X=Y", ""])
def test_an_env_name_that_is_not_a_variable_name_is_refused_naming_the_key(tmp_path, name):
    from tests.helpers import edit_yaml

    project = copy_project(tmp_path / "project")
    edit_yaml(project / "configs/sites/local.yaml", lambda d: d.update(env={name: "1"}))
    out = hopperlab(["list", "--config", "families=selftest"], project)
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr
    assert f"local.yaml: env.{name}:" in out.stderr and "Traceback" not in out.stderr


def test_a_full_disk_the_job_reported_on_stdout_is_the_reason(tmp_path):
    """Issue 28 item 10: a disk filling during the job gave "ended FAILED before writing its
    record"; the "[Errno 28]" was only in job.out."""
    stdout, stderr = tmp_path / "job.out", tmp_path / "job.err"
    stdout.write_text("step 3\nsubmitit ERROR: job failed\nOSError: [Errno 28] No space left "
                      f"on device: '{tmp_path}/artifacts/table.csv'\n")
    stderr.write_text("srun: error: task 0: Exited with exit code 1\n")
    outcome = launch.JobOutcome(job_id=None, state="FAILED", stdout=stdout, stderr=stderr)
    tail = submission._last_error_line(submission._job_output(outcome))
    reason = submission._died_reason(outcome, tail)
    assert reason.startswith("no space left on ") and "table.csv" in reason, reason


@pytest.mark.integration
def test_a_full_disk_before_the_workflow_starts_is_one_line(tmp_path, tiny_disk):
    """Issue 28 item 10: a full disk before the workflow started gave a traceback."""
    from tests.helpers import snakemake

    project = copy_project(tmp_path / "project")
    results = tiny_disk.mountpoint / "results"
    tiny_disk.fill()
    out = snakemake(["--cores", "2", "--config", "families=selftest", "only=selftest/faults/ok",
                     f"results_dir={results}"], project)
    text = out.stdout + out.stderr
    assert out.returncode != 0
    assert "Traceback" not in text and '.py", line' not in text, text[-3000:]  # no stack
    said = [ln for ln in text.splitlines() if "no space left" in ln.lower()]
    assert said and str(tiny_disk.mountpoint) in said[0], text[-3000:]


@pytest.mark.integration
@pytest.mark.parametrize("spec_text,record_text", [("[]", "null"), ('"x"', "[1]"),
                                                   ('{"attempt": "two"}', "{torn")])
def test_submit_goes_on_past_a_wrong_typed_spec_or_record(tmp_path, spec_text, record_text):
    """Issue 28 item 10: a wrong-typed spec.json/record.json made `hopperlab submit` crash on
    every call until the file was removed by hand."""
    project = copy_project(tmp_path / "project")
    run_dir = project / "results/selftest/faults/ok"
    run_dir.mkdir(parents=True)
    (run_dir / "spec.json").write_text(spec_text)
    (run_dir / "record.json").write_text(record_text)
    (run_dir / "history.jsonl").write_text('[1]\n"start"\n{"attempt": 1, "event": "start"}\n')
    out = hopperlab(["submit", "selftest/faults/ok", "--no-upload", "--config",
                     "families=selftest"], project)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    rec = json.loads((run_dir / "record.json").read_text())
    assert rec["status"] == "ok" and rec["attempt"] == 2, rec
    assert (run_dir / "attempts").is_dir()  # the broken files kept, out of the way


@pytest.mark.parametrize("state,said", [
    ("CANCELLED", "slurmstepd: error: Step 11.0 exceeded memory limit (2118524 > 1048576), "
                  "being killed\nslurmstepd: error: Exceeded job memory limit\n"),
    ("OUT_OF_MEMORY", "slurmstepd: error: Detected 1 oom_kill event in StepId=12.batch. Some "
                      "of the step tasks have been OOM Killed.\n"),
])
def test_a_job_slurm_killed_for_its_memory_is_oom(tmp_path, state, said):
    """Issue 28 item 10: a job killed by Slurm for exceeding --mem was `failed` "CANCELLED".
    The words are Slurm's (its launcher reads them): a local job that prints them is not
    classified by them."""
    project = copy_project(tmp_path / "project")
    matrix = load_matrix(project, {"families": "selftest", "site": "slurm"})
    spec = matrix.get("selftest/faults/ok")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (tmp_path / "job.err").write_text(said)
    (tmp_path / "job.out").write_text("")
    outcome = launch.JobOutcome(job_id=None, state=state, stderr=tmp_path / "job.err",
                                stdout=tmp_path / "job.out")
    rec = submission._settle_record(run_dir, spec, 1, outcome)
    assert rec["status"] == "oom", rec
    assert "memory" in rec["reason"] and "mem_gb" in rec["reason"], rec["reason"]
    local = load_matrix(project, {"families": "selftest"}).get("selftest/faults/ok")
    (run_dir / "record.json").unlink(missing_ok=True)
    assert submission._settle_record(run_dir, local, 1, outcome)["status"] == "failed"


@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
def test_a_killed_submitters_local_job_is_stopped_before_the_next_attempt(tmp_path):
    """Issue 28 item 4 on the local executor: never start attempt n+1 while attempt n's job
    still runs (its submitter was killed and could not stop it)."""
    import signal
    import sys
    import time

    from tests.helpers import edit_yaml

    project = copy_project(tmp_path / "project")

    def slow(seconds):
        edit_yaml(project / "experiments/selftest.yaml", lambda d: d["experiments"]["faults"][
            "variants"].__setitem__("slow", {"params": {"action": "sleep", "sleep_s": seconds}}))

    slow(120)
    run_dir = project / "results/selftest/faults/slow"
    cmd = [sys.executable, "-m", "hopperlab.cli", "submit", "selftest/faults/slow", "--no-upload",
           "--config", "families=selftest"]
    first = subprocess.Popen(cmd, cwd=project)
    deadline = time.monotonic() + 120
    while not ((run_dir / "hardware.json").exists() and '"submitted"' in (
            (run_dir / "history.jsonl").read_text() if (run_dir / "history.jsonl").exists()
            else "")):
        assert time.monotonic() < deadline, "the first job never started"
        time.sleep(0.2)
    entry = next(e for e in _history(run_dir) if e["event"] == "submitted")
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)
    (run_dir / ".writer.lock").unlink(missing_ok=True)
    os.kill(entry["pid"], 0)  # its job goes on without it
    slow(1)
    again = hopperlab(cmd[3:], project, timeout=300)
    text = again.stdout + again.stderr
    assert again.returncode == 0, text[-3000:]
    assert f"local job {entry['pid']} of attempt 1 still runs; stopping it" in text, text[-3000:]
    with pytest.raises(ProcessLookupError):
        os.kill(entry["pid"], 0)
    spec = json.loads((run_dir / "spec.json").read_text())
    rec = json.loads((run_dir / "record.json").read_text())
    assert spec["attempt"] == rec["attempt"] == 2 and rec["run_uid"] == spec["run_uid"], rec


@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
def test_a_job_never_writes_its_record_over_a_later_attempts(tmp_path):
    """Issue 28 item 4: a job that outlived its submitter wrote `record.json`/`metrics.json`
    saying attempt 1 under attempt 2's spec. A job writes only while spec.json is its own."""
    import threading
    import time

    from hopperlab.core import rundir
    from hopperlab.run import runner
    from tests.helpers import edit_yaml

    project = copy_project(tmp_path / "project")
    edit_yaml(project / "experiments/selftest.yaml", lambda d: d["experiments"]["faults"][
        "variants"].__setitem__("slow", {"params": {"action": "sleep", "sleep_s": 3}}))
    spec = load_matrix(project, {"families": "selftest"}).get("selftest/faults/slow")
    run_dir = project / spec.run_dir
    spec_file = run_dir / "spec.json"
    rundir.write_json_atomic(spec_file, {**spec.to_dict(), "attempt": 1, "run_uid": "first"})
    job = threading.Thread(target=runner.execute, args=(str(spec_file),))
    job.start()
    deadline = time.monotonic() + 60
    while not (run_dir / "hardware.json").exists():  # the job has read its spec and runs
        assert time.monotonic() < deadline, "the job never started"
        time.sleep(0.05)
    # while it sleeps, a later submission takes the directory for attempt 2
    rundir.write_json_atomic(spec_file, {**spec.to_dict(), "attempt": 2, "run_uid": "second"})
    job.join(timeout=60)
    assert not (run_dir / "record.json").exists() and not (run_dir / "metrics.json").exists()


def test_an_in_process_run_puts_the_environment_back(tmp_path, monkeypatch):
    """A census run in pytest left OMP_NUM_THREADS=1 behind (threads.apply and the site's
    env), and the Slurm cluster a later test started counted one CPU a node (nproc obeys it):
    two-task jobs were refused. ``execute`` restores what it changed."""
    from hopperlab.core import rundir
    from hopperlab.run import runner
    from tests.helpers import edit_yaml

    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "HOPPERLAB_ODD"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOPPERLAB_KEPT", "as before")
    project = copy_project(tmp_path / "project")
    edit_yaml(project / "configs/sites/local.yaml", lambda d: d.update(
        env={"OMP_NUM_THREADS": 1, "HOPPERLAB_ODD": ODD_VALUE, "HOPPERLAB_KEPT": "changed"}))
    spec = load_matrix(project, {"families": "selftest"}).get("selftest/faults/ok")
    spec_file = project / spec.run_dir / "spec.json"
    rundir.write_json_atomic(spec_file, {**spec.to_dict(), "attempt": 1})
    before = dict(os.environ)
    rec = runner.execute(str(spec_file))
    assert rec["status"] == "ok", rec
    assert rec["hardware"]["threads"]["intra_op"] == 1  # the job did see the site's env
    assert dict(os.environ) == before


def test_a_job_that_died_inside_a_damaged_image_names_the_image(tmp_path):
    """Issue 37 (minor): a corrupted container image gave a reason naming nothing (the last
    line its python said); it names the image and says: check the digest, rebuild."""
    project = copy_project(tmp_path / "project")
    spec = load_matrix(project, {"families": "selftest", "site": "local-charliecloud"}).get(
        "selftest/faults/ok")
    assert spec.site.container.image
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (tmp_path / "job.err").write_text(
        "python: error while loading shared libraries: libpython3.11.so.1.0: invalid ELF header\n")
    (tmp_path / "job.out").write_text("")
    outcome = launch.JobOutcome(job_id=None, state="FINISHED", stderr=tmp_path / "job.err",
                                stdout=tmp_path / "job.out")
    rec = submission._settle_record(run_dir, spec, 1, outcome)
    reason = rec["reason"]
    assert rec["status"] == "failed" and "invalid ELF header" in reason, reason
    assert str(spec.site.container.image_file) in reason, reason
    assert "check its digest" in reason and "rebuild it" in reason, reason
