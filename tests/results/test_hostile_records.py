"""A record cannot write references of its choosing (issue 46, D18): a run whose record or spec
names a family, experiment or variant that is not a name (a newline, a ``/``, a ``*``, empty)
or not its directory's is refused with one line naming the file and key; the folder's other
runs update, and a later check of an honest folder still passes."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from hopperlab.cli.main import main
from hopperlab.results.rows import collect_runs

from tests.results.run_dirs import KEY, write_run

#: a variant that, written unquoted as a references key, plants selftest/trivial/ok
PLANT = ("evil:\n    value: {value: 10.0, spread: 0.01, n: 3, min_effect: 0.05}\n"
         "  selftest/trivial/ok:\n    value: {value: 99.0, spread: 0.01, n: 3, min_effect: 0.05}\n"
         "  selftest/noise/x")

HOSTILE = [
    ("record.json", "variant", PLANT),
    ("record.json", "variant", "*"),
    ("record.json", "experiment", "*"),
    ("record.json", "family", "../../x"),
    ("record.json", "variant", ""),
    ("record.json", "variant", "ok\x1b[2J"),
    ("record.json", "key", "selftest/trivial/ok"),
    ("record.json", "experiment", "trivial"),       # a name, but another run's
    ("spec.json", "variant", PLANT),
    ("spec.json", "experiment", "*"),
]


def _update(tmp_path: Path, *folders: Path) -> int:
    return main(["--root", str(tmp_path), "references", "update", *map(str, folders),
                 "--references", str(tmp_path / "refs")])


@pytest.mark.parametrize("file, key, value", HOSTILE)
def test_a_hostile_record_is_refused_and_the_other_runs_update(tmp_path, capsys, file, key,
                                                               value):
    results = tmp_path / "results"
    write_run(results, KEY, samples=(10.0, 10.1, 9.9))
    changes = {file.split(".")[0]: {key: value}}
    if file == "spec.json":      # a record that does not say (an older one): its spec is read
        changes["record"] = {key: None}
    evil = write_run(results, "selftest/noise/evil", samples=(99.0, 99.1, 98.9), **changes)
    assert _update(tmp_path, results) == 0
    out = capsys.readouterr().out
    refused = [line for line in out.splitlines() if "refused" in line]
    assert len(refused) == 1 and f"{evil / file}: {key}:" in refused[0], out
    written = yaml.safe_load((tmp_path / "refs/m1.yaml").read_text())["references"]
    assert set(written) == {KEY}, written              # nothing planted, no glob
    # check says the refusal too, and judges the folder's honest run
    assert main(["--root", str(tmp_path), "check", str(results), "--references",
                 str(tmp_path / "refs")]) == 0
    out = capsys.readouterr().out
    assert f"[hopperlab] refused {evil / file}: {key}:" in out and "pass 1" in out, out
    # the honest folder checks clean against what was written
    honest = tmp_path / "honest"
    write_run(honest, KEY, samples=(10.0, 10.05, 9.95))
    write_run(honest, "selftest/trivial/ok", samples=(10.0, 10.05, 9.95))
    assert main(["--root", str(tmp_path), "check", str(honest), "--references",
                 str(tmp_path / "refs"), "--strict"]) == 0, capsys.readouterr().out


@pytest.mark.parametrize("name", ["*", "a\nb"])
def test_a_run_directory_that_is_not_a_name_is_refused(tmp_path, name):
    from hopperlab.results.rows import read_runs   # new with this check
    results = tmp_path / "results"
    write_run(results, KEY)
    write_run(results, f"selftest/{name}/ok", record={"experiment": None, "key": None},
              spec={"experiment": None, "key": None})
    rows, refused = read_runs(results)
    assert [r.key for r in rows] == [KEY]
    assert len(refused) == 1 and "the run directory's experiment" in refused[0], refused


def test_collect_runs_logs_the_refused_record(tmp_path, caplog):
    results = tmp_path / "results"
    write_run(results, KEY)
    evil = write_run(results, "selftest/noise/evil", record={"variant": "*"})
    assert [r.key for r in collect_runs(results)] == [KEY]
    assert any(f"{evil / 'record.json'}: variant: '*' is not a name" in m
               for m in caplog.messages), caplog.messages
