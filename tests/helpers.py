"""Shared test helpers: a scratch copy of the project to break configs in, subprocess runners."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
PROJECT_PARTS = ("Snakefile", "configs", "experiments", "workflow", "profiles", "containers",
                 "models")
#: built images and build caches in the checkout (GBs): a copy builds or names its own
IMAGES = shutil.ignore_patterns("*.sif", "*.ch", "*.sqsh", ".cache", ".*.partial*")


def copy_project(dest: Path) -> Path:
    """Copy what a run needs (not results/) into ``dest``; return it."""
    dest.mkdir(parents=True, exist_ok=True)
    for part in PROJECT_PARTS:
        src = REPO / part
        if src.is_dir():
            shutil.copytree(src, dest / part, ignore=IMAGES)
        else:
            shutil.copy(src, dest / part)
    # a repository of its own, so that runs record a git commit as they do in a real checkout
    git = ["git", "-C", str(dest), "-c", "user.name=test", "-c", "user.email=test@localhost"]
    subprocess.run(git + ["init", "-q"], check=True)
    subprocess.run(git + ["add", "-A"], check=True)
    subprocess.run(git + ["commit", "-qm", "test project"], check=True)
    return dest


def edit_yaml(path: Path, change) -> None:
    data = yaml.safe_load(path.read_text())
    change(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


#: set by tests/conftest.py for each test: whether it is marked ``integration`` (None outside a test)
INTEGRATION_TEST: bool | None = None
#: `hopperlab` verbs that start a job (a subprocess running a family's workload)
JOB_VERBS = frozenset({"run", "submit"})


def needs_integration(what: str) -> None:
    """Refuse to start Snakemake or a job in a test not marked ``integration``: plain `pytest`
    is the quick unit run (pyproject.toml), and a test that starts one belongs to scripts/test.sh."""
    if INTEGRATION_TEST is False:
        raise AssertionError(f"this test starts {what}: mark it @pytest.mark.integration "
                             f"(or its module: pytestmark = pytest.mark.integration)")


def run(cmd: list[str], cwd: Path, env: dict | None = None, timeout: float = 900
        ) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(cmd, cwd=cwd, env=full_env, capture_output=True, text=True,
                          timeout=timeout)


def snakemake(args: list[str], cwd: Path, env: dict | None = None, timeout: float = 900
              ) -> subprocess.CompletedProcess:
    needs_integration("Snakemake")
    return run([sys.executable, "-m", "snakemake", *args], cwd, env, timeout)


def hopperlab(args: list[str], cwd: Path, env: dict | None = None, timeout: float = 600
              ) -> subprocess.CompletedProcess:
    words = list(args)
    while words[:1] == ["--root"]:  # the one option before the verb
        words = words[2:]
    if words and words[0] in JOB_VERBS:
        needs_integration(f"a job (hopperlab {words[0]})")
    return run([sys.executable, "-m", "hopperlab.cli", *args], cwd, env, timeout)


def default_signals() -> None:
    """``preexec_fn`` for a child a test will signal: SIGINT and SIGTERM at their defaults and
    unblocked, as a shell starts a command, whatever a test before left in pytest (an ignored
    or blocked signal is inherited across exec, and Python then installs no Ctrl-C handler)."""
    import signal

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT, signal.SIGTERM])


def run_noisy(project: Path, results: str, seed: int | None = None, steps: int | None = None,
              repeats: int | None = None) -> subprocess.CompletedProcess:
    """One real run of selftest/noise/noisy into ``project/results`` (`hopperlab run`, no
    upload), with the smoke scale's ``seed``/``steps`` and the experiment's ``repeats`` set
    where given; fails the test unless it ran."""
    def change(d):
        noise = d["experiments"]["noise"]
        noise["scales"]["smoke"]["params"].update(
            {k: v for k, v in (("seed", seed), ("steps", steps)) if v is not None})
        if repeats is not None:
            noise["repeats"] = repeats
    edit_yaml(project / "experiments/selftest.yaml", change)
    out = hopperlab(["run", "selftest/noise/noisy", "--no-upload", "--config",
                     "families=selftest", f"results_dir={results}"], project)
    assert out.returncode == 0, out.stderr[-2000:]
    return out


def project_with_noisy_run(dest: Path, results: str = "results-a", repeats: int = 5
                           ) -> tuple[Path, subprocess.CompletedProcess]:
    """A project copy with one real run of selftest/noise/noisy measured ``repeats`` times in
    ``results`` (what `hopperlab run` printed, too): a results folder to break in a test."""
    project = copy_project(dest)
    return project, run_noisy(project, results, repeats=repeats)


def reference_day(references_file: Path, key: str) -> str | None:
    """The day a run's entries in a references file say they were measured ("measured
    YYYY-MM-DD" in each source), when all of them say one day: a fixture's fresh runs are
    judged by the references their own calls wrote."""
    entries = yaml.safe_load(references_file.read_text())["references"]
    days = set()
    for entry in entries.get(key, {}).values():
        for e in entry if isinstance(entry, list) else [entry]:
            source = str(e.get("source", ""))
            days.add(source.split("measured ", 1)[1][:10] if "measured " in source else None)
    return days.pop() if len(days) == 1 else None
