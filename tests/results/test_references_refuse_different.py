"""``hopperlab references update`` never takes a reference from a run that reads DIFFERENT
(issue 47's fault: a backward that never ran reads twice as fast): no entry from it, a line
naming the run and its verdict, the existing entry kept, exit 1; the honest runs' references
are written as ever."""

from __future__ import annotations

from pathlib import Path

import yaml

from hopperlab.cli.main import main

from tests.results.different_runs import (BASELINE, EXPERIMENT, HONEST, SPEEDS, WRONG,
                                          write_finetune, write_folder)
from tests.results.run_dirs import reference_file


def _update(tmp_path: Path, *folders: Path) -> int:
    return main(["--root", str(tmp_path), "references", "update", *map(str, folders),
                 "--references", str(tmp_path / "refs")])


def _body(tmp_path: Path) -> dict:
    return yaml.safe_load((tmp_path / "refs" / "m1.yaml").read_text())["references"]


def test_a_different_run_gives_no_reference_and_its_old_entry_is_kept(tmp_path, capsys):
    results = write_folder(tmp_path / "results")
    # the machine's file already holds an honest reference of the variant
    reference_file(tmp_path / "refs", runs=(f"{EXPERIMENT}/{WRONG}",), value=10.0)
    before = _body(tmp_path)[f"{EXPERIMENT}/{WRONG}"]
    assert _update(tmp_path, results) == 1
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("[hopperlab] refused "))
    assert f"{EXPERIMENT}/{WRONG} in {results}: DIFFERENT against {BASELINE}" in line, out
    assert "gradient norm" in line and "no reference from it" in line, line
    body = _body(tmp_path)
    assert body[f"{EXPERIMENT}/{WRONG}"] == before   # kept as it was, not the 2x run's
    for honest in (BASELINE, HONEST):                # the others written
        assert body[f"{EXPERIMENT}/{honest}"]["tokens_per_s"]["n"] == 3, body
    assert "1 run(s) refused" in out and "the others written" in out


def test_nothing_but_a_refused_run_to_write_exits_1_not_2(tmp_path, capsys):
    results = write_folder(tmp_path / "results")
    for variant in (BASELINE, HONEST):   # the honest runs measured once: too few samples
        (results / EXPERIMENT / variant / "samples.jsonl").write_text("")
    assert _update(tmp_path, results) == 1   # the refusal is the news, not a usage error (2)
    out = capsys.readouterr().out
    assert f"refused {EXPERIMENT}/{WRONG}" in out and "no reference written" in out, out
    assert not (tmp_path / "refs" / "m1.yaml").exists()


def test_a_run_different_in_one_of_three_folders_makes_no_reference(tmp_path, capsys):
    folders = [write_folder(tmp_path / f"results-{i}", wrong=False) for i in range(3)]
    # the variant computed something else in one process only: no reference from any of them
    for i, f in enumerate(folders):
        write_finetune(f, WRONG, SPEEDS[WRONG], offload="activations",
                       grads=(0.0,) * 4 if i == 1 else (1.5, 1.4, 1.3, 1.2))
    assert _update(tmp_path, *folders) == 1
    out = capsys.readouterr().out
    refused = [ln for ln in out.splitlines() if ln.startswith("[hopperlab] refused ")]
    assert len(refused) == 1 and str(folders[1]) in refused[0], out
    body = _body(tmp_path)
    assert f"{EXPERIMENT}/{WRONG}" not in body, body
    assert body[f"{EXPERIMENT}/{HONEST}"]["tokens_per_s"]["n"] == 3


def test_no_different_run_exits_0(tmp_path, capsys):
    results = write_folder(tmp_path / "results", wrong=False)
    assert _update(tmp_path, results) == 0
    assert "refused" not in capsys.readouterr().out
