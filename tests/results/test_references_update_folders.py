"""``references update A B C`` takes each folder as one independent process of one machine
(issue 46, D12 and D15): a folder counted twice (a symlink, ``F/../F``, relative and absolute,
a copy) is refused naming both; each folder's machine is said, the folders of another machine
are never pooled into a reference unless asked, and a run too few folders held names the
folder that lacked it."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import yaml

from hopperlab.cli.main import main

from tests.results.run_dirs import KEY, write_run

OTHER = "selftest/trivial/ok"


def _update(tmp_path: Path, *folders: Path | str, extra: tuple[str, ...] = ()) -> int:
    return main(["--root", str(tmp_path), "references", "update", *map(str, folders),
                 "--references", str(tmp_path / "refs"), *extra])


def _folders(tmp_path: Path, machines: tuple[str, ...], lacking: dict[int, str] | None = None,
             gone: dict | None = None) -> list[Path]:
    """One folder per machine given, each with an independent run of KEY and OTHER (minus the
    run ``lacking`` names for a folder's index)."""
    out = []
    for i, machine in enumerate(machines):
        folder = tmp_path / f"F{i + 1}"
        for key in (KEY, OTHER):
            if (lacking or {}).get(i) != key:
                write_run(folder, key, samples=(10.0 + i / 10, 10.1, 9.9), machine=machine,
                          record=gone, spec=gone)
        out.append(folder)
    return out


def _alias(how: str, f1: Path, tmp_path: Path) -> str:
    if how == "symlink":
        (tmp_path / "link").symlink_to(f1)
        return str(tmp_path / "link")
    if how == "dotdot":
        return str(f1 / ".." / f1.name)
    if how == "relative":
        return os.path.relpath(f1)
    copy = tmp_path / "copy"
    shutil.copytree(f1, copy, symlinks=True)    # cp -a: the same runs, the same records
    return str(copy)


@pytest.mark.parametrize("how", ["symlink", "dotdot", "relative", "copy"])
@pytest.mark.parametrize("uid", [True, False], ids=["run_uid", "start-and-host"])
def test_one_folder_counted_twice_is_refused_naming_both(tmp_path, capsys, monkeypatch, how,
                                                         uid):
    monkeypatch.chdir(tmp_path)
    gone = None if uid else {"run_uid": None}
    f1, f2, f3 = _folders(tmp_path, ("m1", "m1", "m1"), gone=gone)
    twin = _alias(how, f1, tmp_path)
    assert _update(tmp_path, f1, f2, twin) == 2
    err = capsys.readouterr().err
    assert f"{f1} and {twin}" in err, err
    assert not (tmp_path / "refs").exists()
    assert _update(tmp_path, f1, f2, f3) == 0        # three independent folders hold
    assert yaml.safe_load((tmp_path / "refs/m1.yaml").read_text())[
        "references"][KEY]["value"]["n"] == 3


def test_each_folder_names_its_machine_and_machines_are_not_pooled(tmp_path, capsys):
    f1, f2, f3, f4 = _folders(tmp_path, ("m1", "m1", "m1", "m2"), lacking={2: OTHER})
    assert _update(tmp_path, f1, f2, f3, f4) == 0
    out = capsys.readouterr().out
    for folder, machine in ((f1, "m1"), (f3, "m1"), (f4, "m2")):
        assert f"[hopperlab] {folder}: runs of machine {machine}" in out, out
    assert (f"{OTHER} value: 2 sample(s); a reference needs 3 or more: it ran in 2 of the 3 "
            f"folders of machine m1; not in {f3}; folders of other machines are not pooled: "
            f"{f4} (m2)") in out, out
    assert f"{KEY} value: 1 sample(s); a reference needs 3 or more: it ran in 1 of the 1 " \
           f"folders of machine m2" in out, out
    m1 = yaml.safe_load((tmp_path / "refs/m1.yaml").read_text())["references"]
    assert set(m1) == {KEY} and m1[KEY]["value"]["n"] == 3      # m2's run is not in it
    assert not (tmp_path / "refs/m2.yaml").exists()


def test_a_machine_option_over_two_machines_pools_only_when_asked(tmp_path, capsys):
    folders = _folders(tmp_path, ("m1", "m1", "m2"))
    assert _update(tmp_path, *folders, extra=("--machine", "m1")) == 2
    err = capsys.readouterr().err
    assert f"2 machines ({folders[0]}: m1, {folders[1]}: m1, {folders[2]}: m2)" in err, err
    assert not (tmp_path / "refs").exists()
    assert _update(tmp_path, *folders, extra=("--machine", "m1", "--pool-machines")) == 0
    m1 = yaml.safe_load((tmp_path / "refs/m1.yaml").read_text())["references"]
    assert m1[KEY]["value"]["n"] == 3
