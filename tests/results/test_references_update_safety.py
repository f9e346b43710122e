"""``hopperlab references update`` is as safe as ``check`` (issue 37, items 3 and 4): it never
writes outside the references folder (a machine is a name, never a path), it refuses samples
that would make a file that does not load (or fails forever) and keeps the good file, and
concurrent updates of one file keep every run (a lock, an atomic replace)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hopperlab.cli.main import main
from hopperlab.results.machines import references as R

from tests.helpers import project_with_noisy_run

# every test here judges real runs that a module fixture starts as jobs
pytestmark = pytest.mark.integration

NOISY = "selftest/noise/noisy"
MACHINE = "cpu-x86_64"


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A real run measured with 5 repeats in results-a."""
    return project_with_noisy_run(tmp_path_factory.mktemp("refs") / "proj")[0]


def _copy(project: Path, name: str, variant: str = "noisy", **record) -> Path:
    """results-a copied to ``name``, its run renamed to ``variant``, record keys changed."""
    dest = project / name
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(project / "results-a" / NOISY, dest / "selftest/noise" / variant)
    path = dest / "selftest/noise" / variant / "record.json"
    data = json.loads(path.read_text())
    data.update(variant=variant, key=f"selftest/noise/{variant}", **record)
    path.write_text(json.dumps(data))
    return dest


def _yaml_files(top: Path) -> set[Path]:
    return {p for p in top.rglob("*.yaml") if ".git" not in p.parts}


def _update(project: Path, results: Path, refs: Path, *extra: str) -> int:
    return main(["--root", str(project), "references", "update", str(results),
                 "--references", str(refs), *extra])


@pytest.mark.parametrize("machine", ["../x", "../../x", "{tmp}/abs/x", "a/b", ".."])
def test_a_machine_option_that_is_a_path_is_refused(project, tmp_path, capsys, machine):
    machine = machine.replace("{tmp}", str(tmp_path))   # an absolute path, inside the test's
    refs = tmp_path / "top" / "a" / "refs"
    before = _yaml_files(project) | _yaml_files(tmp_path)
    assert _update(project, project / "results-a", refs, "--machine", machine) == 2
    err = capsys.readouterr().err
    assert f"--machine {machine!r}: not a machine name" in err
    assert _yaml_files(project) | _yaml_files(tmp_path) == before


def test_a_record_whose_machine_is_a_path_is_skipped(project, tmp_path, capsys):
    results = _copy(project, "results-evil", machine="../../evil")
    refs = tmp_path / "deep" / "er" / "refs"
    before = _yaml_files(project) | _yaml_files(tmp_path)
    assert _update(project, results, refs) == 2
    captured = capsys.readouterr()
    assert "its record's machine '../../evil' is not a machine name" in captured.out
    assert "no reference written" in captured.err
    assert _yaml_files(project) | _yaml_files(tmp_path) == before
    # --machine names it instead: written inside the folder
    assert _update(project, results, refs, "--machine", "good-1") == 0
    assert _yaml_files(tmp_path) - before == {refs / "good-1.yaml"}


def _good_file(project: Path, refs: Path) -> bytes:
    assert _update(project, project / "results-a", refs) == 0
    return (refs / f"{MACHINE}.yaml").read_bytes()


@pytest.mark.parametrize("bad, words", [
    (0.0, "1 sample(s) <= 0 (the first 0): a reference is a positive figure"),
    (-3.5, "1 sample(s) <= 0 (the first -3.5): a reference is a positive figure"),
    ("fast", "sample 2: value is 'fast', not a finite number"),
    (float("nan"), "sample 2: value is nan, not a finite number"),
])
def test_bad_samples_are_refused_and_the_good_file_kept(project, tmp_path, capsys, bad, words):
    refs = tmp_path / "refs"
    good = _good_file(project, refs)
    results = _copy(project, "results-bad")
    samples = results / NOISY / "samples.jsonl"
    lines = [json.loads(line) for line in samples.read_text().splitlines()]
    lines[1]["metrics"]["value"] = bad
    samples.write_text("".join(json.dumps(line) + "\n" for line in lines))
    capsys.readouterr()
    assert _update(project, results, refs) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert str(samples) in err and words in err, err
    assert (refs / f"{MACHINE}.yaml").read_bytes() == good
    assert sorted(p.name for p in refs.iterdir()) == [f"{MACHINE}.yaml"]  # no leftovers
    R.load_references(refs / f"{MACHINE}.yaml")


def test_a_bad_sample_of_one_machine_leaves_every_file_alone(project, tmp_path, capsys):
    """Two machines in one folder: the second's bad sample refuses the first's file too."""
    results = _copy(project, "results-two", variant="v1", machine="m-good")
    bad = _copy(project, "results-two-b", variant="v2", machine="m-bad")
    shutil.copytree(bad / "selftest/noise/v2", results / "selftest/noise/v2")
    samples = results / "selftest/noise/v2/samples.jsonl"
    lines = [json.loads(line) for line in samples.read_text().splitlines()]
    lines[0]["metrics"]["value"] = 0
    samples.write_text("".join(json.dumps(line) + "\n" for line in lines))
    refs = tmp_path / "refs"
    assert _update(project, results, refs) == 2
    assert "sample(s) <= 0" in capsys.readouterr().err
    assert not list(refs.glob("*.yaml"))


def test_a_file_that_would_not_load_is_never_written(project, tmp_path, capsys):
    """Whatever the update makes is loaded before it replaces the old file: here the old file
    holds a reference that a merge keeps but that does not load beside the new one."""
    refs = tmp_path / "refs"
    good = _good_file(project, refs)
    path = refs / f"{MACHINE}.yaml"
    data = yaml.safe_load(good)
    data["references"]["selftest/noise/other"] = {"value": {"value": 1.0, "lower": 0.1,
                                                            "upper": 0.2}}
    broken = yaml.safe_dump(data).encode()
    path.write_bytes(broken)  # lower > 0: refused at load
    capsys.readouterr()
    assert _update(project, project / "results-a", refs) == 2
    err = capsys.readouterr().err
    assert f"{path}: not replaced: the updated references would not load: {path}" in err
    assert path.read_bytes() == broken
    assert sorted(p.name for p in refs.iterdir()) == [f"{MACHINE}.yaml"]


def test_ten_concurrent_updates_of_one_file_keep_every_run(project, tmp_path):
    refs = tmp_path / "refs"
    folders = [_copy(project, f"results-c{i}", variant=f"v{i}") for i in range(10)]
    procs = [subprocess.Popen([sys.executable, "-m", "hopperlab.cli", "--root", str(project),
                               "references", "update", str(f), "--references", str(refs)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for f in folders]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0] * 10, outs
    refs_file = R.load_references(refs / f"{MACHINE}.yaml")
    assert sorted(refs_file.entries) == sorted(f"selftest/noise/v{i}" for i in range(10))
    assert sorted(p.name for p in refs.iterdir()) == [f"{MACHINE}.yaml"]
