"""What ``hopperlab check`` must never take for a pass (issue 46, D26, D25 and the every-node
minor): a metric NaN in every sample (a regression, as a missing one), a run with some NaN
samples (at best inconclusive, the NaN ones said), a referenced run the folder lacks (named;
``--strict`` fails on it), a node of ``--every-node`` that nothing judged."""

from __future__ import annotations

from pathlib import Path

import pytest

from hopperlab.cli.main import main
from hopperlab.results.machines import node_check

from tests.results.run_dirs import KEY, reference_file, write_run

NAN = float("nan")
OTHER = "selftest/trivial/ok"


def _check(tmp_path: Path, results: Path, *extra: str) -> int:
    return main(["--root", str(tmp_path), "check", str(results), "--references",
                 str(tmp_path / "refs"), *extra])


def test_a_metric_nan_in_every_sample_fails_as_a_missing_one(tmp_path, capsys):
    reference_file(tmp_path / "refs")
    run = write_run(tmp_path / "results", samples=(NAN, NAN, NAN))
    assert "value" not in (run / "metrics.json").read_text()    # no value either
    assert _check(tmp_path, tmp_path / "results") == 1
    out = capsys.readouterr().out
    assert (f"REGRESSION m1 {KEY} value: value not a finite number in any of its 3 sample(s) "
            f"(NaN is never a pass) in {run / 'metrics.json'}") in out, out


@pytest.mark.parametrize("bad", [NAN, "fast"])
def test_some_nan_samples_are_dropped_said_and_never_pass(tmp_path, capsys, bad):
    reference_file(tmp_path / "refs")
    write_run(tmp_path / "results", samples=(10.0, bad, 10.02, 9.98, bad))
    assert _check(tmp_path, tmp_path / "results") == 0       # inconclusive, as the noise is
    out = capsys.readouterr().out
    assert f"INCONCLUSIVE m1 {KEY} value:" in out, out
    assert "2 of 5 sample(s) not a finite number (NaN), dropped" in out, out
    assert _check(tmp_path, tmp_path / "results", "--strict") == 1
    # the finite samples alone pass: the NaN ones were all that held the verdict back
    write_run(tmp_path / "finite", samples=(10.0, 10.02, 9.98))
    assert _check(tmp_path, tmp_path / "finite", "--strict") == 0
    capsys.readouterr()
    # and a NaN sample never hides a regression the finite ones show
    write_run(tmp_path / "slow", samples=(8.0, bad, 8.02, 7.98, bad))
    assert _check(tmp_path, tmp_path / "slow") == 1
    assert f"REGRESSION m1 {KEY} value:" in capsys.readouterr().out


def test_a_referenced_run_the_folder_lacks_is_named_and_fails_strict(tmp_path, capsys):
    refs = reference_file(tmp_path / "refs", runs=(KEY, OTHER, "selftest/faults/*"))
    results = tmp_path / "results"
    write_run(results, KEY)
    assert _check(tmp_path, results) == 0
    out = capsys.readouterr().out
    assert (f"[hopperlab] note: m1 {OTHER} is referenced in {refs}, {results} has no run of "
            f"it (--strict fails on it)") in out, out
    assert "m1 selftest/faults/* is referenced" in out          # a glob matching no run
    assert _check(tmp_path, results, "--strict") == 1
    out = capsys.readouterr().out
    assert f"MISSING m1 {OTHER}: referenced in {refs}, no run of it in {results}" in out, out
    assert "missing 2" in out
    # a folder meant to hold only some runs says which (the matrix's only=)
    assert _check(tmp_path, results, "--strict", "--config", f"only={KEY}") == 0
    assert _check(tmp_path, results, "--strict", "--config", "only=selftest/trivial") == 1
    assert f"MISSING m1 {OTHER}" in capsys.readouterr().out
    write_run(results, OTHER)
    write_run(results, "selftest/faults/ok")
    assert _check(tmp_path, results, "--strict") == 0
    assert "MISSING" not in capsys.readouterr().out


def test_a_node_nothing_checked_is_not_a_pass(tmp_path):
    from hopperlab.results.rows import collect_runs

    write_run(tmp_path / "n1", KEY, machine="m1")
    write_run(tmp_path / "n2", OTHER, machine="m1")   # another run: no peer to compare with
    rows = {n: collect_runs(tmp_path / n) for n in ("n1", "n2")}
    verdicts = node_check.judge_nodes(rows, tmp_path / "no-refs")
    assert [v.verdict for v in verdicts] == ["nothing checked"] * 2
    from hopperlab.cli.check_nodes import EXIT_NOTHING_CHECKED, exit_code
    assert exit_code(verdicts, strict=True) == EXIT_NOTHING_CHECKED
    assert exit_code(verdicts, strict=False) == 0     # said, as a plain check of nothing
    # a reference judges n1: it passes; n2 is still not checked
    reference_file(tmp_path / "refs")
    verdicts = node_check.judge_nodes(rows, tmp_path / "refs")
    assert [v.verdict for v in verdicts] == [node_check.PASS, node_check.NOTHING_CHECKED]
    # both nodes ran the same run: each is compared with the other, a check of both
    write_run(tmp_path / "n2", KEY, machine="m1")
    rows = {n: collect_runs(tmp_path / n) for n in ("n1", "n2")}
    verdicts = node_check.judge_nodes(rows, tmp_path / "no-refs")
    assert [v.verdict for v in verdicts] == [node_check.PASS] * 2
    assert exit_code(verdicts, strict=True) == 0
