"""The command line as a user meets it (issue 28, items 15-17): assets looked for where the
workflow puts them, expected errors in one line with exit 2 (through Snakemake too), no
BrokenPipe traceback under `| head`, `--root` after the verb, `only=` naming a family that is
not in `families`, `sync` counting what MLflow already has, `check` saying it checked nothing."""

from __future__ import annotations

import subprocess
import sys
import uuid

import pytest

from hopperlab.cli.main import main
from tests.helpers import REPO, copy_project, edit_yaml, snakemake


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = copy_project(tmp_path_factory.mktemp("cli") / "project")
    edit_yaml(root / "configs" / "sites" / "local.yaml",
              lambda d: d.update(assets_dir="site-assets"))
    return root


def test_assets_list_and_verify_look_in_the_sites_assets_dir(project, capsys):
    assert main(["--root", str(project), "fetch", "tiny-tokenizer"]) == 0
    assert (project / "site-assets" / "tiny-tokenizer").is_dir()
    capsys.readouterr()
    assert main(["--root", str(project), "assets", "list"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines()
                if ln.startswith("tiny-tokenizer "))
    assert "complete" in line
    assert main(["assets", "verify", "tiny-tokenizer", "--root", str(project)]) == 0
    assert capsys.readouterr().out.strip() == "tiny-tokenizer: ok"
    # an asset never built is absent, not DAMAGED; an unknown name is a config error
    assert main(["assets", "verify", "tiny-llama", "--root", str(project)]) == 1
    assert "tiny-llama: absent" in capsys.readouterr().out
    assert main(["assets", "verify", "nope", "--root", str(project)]) == 2
    assert "unknown asset 'nope'" in capsys.readouterr().err


def test_an_expected_error_is_one_line_with_exit_2(project, capsys):
    assert main(["--root", str(project), "list", "--config", "site=nope"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("hopperlab: config error: configs/config.yaml")


@pytest.mark.integration
def test_through_snakemake_too(project):
    out = snakemake(["-n", "--config", "site=nope"], project, timeout=300)
    assert out.returncode == 2, out.stderr[-2000:]
    errors = [ln for ln in out.stderr.splitlines() if "error" in ln.lower() or "File" in ln]
    assert errors == [ln for ln in out.stderr.splitlines() if ln.startswith("hopperlab: config")]
    assert len(errors) == 1 and "site: no site file" in errors[0]


@pytest.mark.parametrize("verb", [["assets", "list"], ["list", "--json"]])
def test_no_broken_pipe_traceback_under_head(project, verb):
    # `| true`: the reader is gone before the first line, as `| head -1` is before a later one
    cmd = (f"{sys.executable} -m hopperlab.cli --root {project} {' '.join(verb)} | true; "
           f"echo ${{PIPESTATUS[0]}}")
    out = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=300)
    assert "Traceback" not in out.stderr and "BrokenPipe" not in out.stderr, out.stderr
    assert out.stdout.strip() == "141"     # as a tool stopped by SIGPIPE, not 1


def test_root_after_the_verb_as_the_error_advises(project, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["check"]) == 2
    err = capsys.readouterr().err
    assert "hopperlab check --root PROJECT" in err
    assert main(["list", "--root", str(project), "--json"]) == 0
    assert '"family": "membench"' in capsys.readouterr().out


def test_only_naming_a_family_outside_families_says_so(project, capsys):
    assert main(["--root", str(project), "list", "--config", "only=selftest/faults/ok"]) == 2
    err = capsys.readouterr().err
    assert "'selftest' is not in families" in err and "families=" in err
    assert main(["--root", str(project), "list", "--config", "only=nofam/x"]) == 2
    assert "'nofam' is not a known family" in capsys.readouterr().err


@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
def test_sync_counts_the_runs_mlflow_already_has(tmp_path):
    from hopperlab.results import tracking
    from tests.results.test_tracking import make_run, sqlite_uri
    results, uri = tmp_path / "results", sqlite_uri(tmp_path / "store")
    for v in ("one", "two"):
        make_run(results, "fam", "copy", v, run_uid=uuid.uuid4().hex)
    assert str(tracking.sync(results, uri)) == "2 runs: 2 uploaded, 0 already in MLflow, 0 failed"
    assert str(tracking.sync(results, uri)) == "2 runs: 0 uploaded, 2 already in MLflow, 0 failed"


def test_check_without_references_says_so_and_fails_when_strict(project, tmp_path, capsys):
    from tests.results.test_tracking import make_run
    results = tmp_path / "results"
    make_run(results, "fam", "copy", "one")
    assert main(["--root", str(project), "check", str(results)]) == 0
    out = capsys.readouterr().out
    assert "nothing was checked" in out and "hopperlab references update" in out
    assert main(["--root", str(project), "check", str(results), "--strict"]) == 3


def test_readme_names_the_check_flag():
    assert "--strict" in (REPO / "README.md").read_text()


# -- issue 37, minor items ---------------------------------------------------------------------
def test_list_piped_cuts_no_name(capsys):
    from hopperlab.config.matrix import load_matrix

    assert main(["--root", str(REPO), "list"]) == 0
    out = capsys.readouterr().out
    assert "\u2026" not in out
    for spec in load_matrix(REPO, {}).runs.values():
        assert f" {spec.variant} " in out, spec.variant


def test_containers_runtime_sees_charliecloud(tmp_path, monkeypatch, capsys):
    (tmp_path / "ch-run").write_text("#!/bin/sh\nexit 0\n")
    (tmp_path / "ch-run").chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert main(["containers", "runtime"]) == 0
    assert capsys.readouterr().out.strip() == "charliecloud"
    (tmp_path / "ch-run").unlink()
    assert main(["containers", "runtime"]) == 1
    err = capsys.readouterr().err
    assert "charliecloud" in err and "mmdebstrap" in err


def test_predict_from_cpu_results_says_what_it_needs(tmp_path, capsys):
    from hopperlab.core import rundir as record

    run_dir = tmp_path / "results/selftest/trivial/ok"
    rec = record.Recorder(run_dir, identity={"key": "selftest/trivial/ok", "family": "selftest",
                                             "experiment": "trivial", "variant": "ok"})
    rec.hardware = {"hostname": "vm", "cpu_arch": "x86_64"}
    rec.log_metrics({"value": 3.0})
    rec.set_tag("machine", "cpu-x86_64")
    rec.finish("ok", None)
    assert main(["--root", str(REPO), "predict", str(tmp_path / "results"), "--machine",
                 "gh200-96gb"]) == 2
    err = capsys.readouterr().err
    assert "measured on cpu-x86_64" in err and "CPU smoke runs are not" in err, err
    assert "h100-80g-pcie5-x86_64" in err and "configs/machines/README.md" in err, err


def test_membench_doc_shows_the_commands_that_exist():
    text = (REPO / "docs/benchmarks/membench.md").read_text()
    assert "hopperlab.workloads.membench.sweep" not in text
    assert "python -m hopperlab.results.report" not in text
    # the sweep script is gone (issue 48): the doc's command is the workflow's
    assert "--config site=gpu-node scale=full only=membench/copy,membench/alloc" in text
