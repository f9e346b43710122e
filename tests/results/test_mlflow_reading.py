"""Every verb that reads MLflow opens it one way (issue 37, item 1 and minor items): a tracking
server that is down (a closed port, a password in the URI) is one line without the password
and exit 2 from ``compare --mlflow``, ``compare family/experiment``, ``history`` and ``machines
--mlflow`` alike, never minutes of retries and chained tracebacks; ``compare --mlflow`` takes
commit hash prefixes; ``history`` quotes what it searches for; ``compare family/experiment``
on a SQLite store says how to open the address it prints."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.helpers import REPO, copy_project, edit_yaml, hopperlab

PASSWORD = "S3cretPW"


def _closed_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def down_uri() -> str:
    return f"http://alice:{PASSWORD}@127.0.0.1:{_closed_port()}"


def _one_line_down(out, port_uri: str) -> None:
    text = out.stdout + out.stderr
    assert out.returncode == 2, text[-3000:]
    assert PASSWORD not in text and "alice" not in text, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr[-3000:]
    # the quick /health probe said so: MLflow's own minutes of retries were never started
    assert lines[0] == f"hopperlab: MLflow unreachable at {port_uri} (no answer on /health)"


@pytest.mark.parametrize("verb", [
    ["compare", "--mlflow", "{uri}", "tags.git_commit = 'a1b2'", "tags.git_commit = 'c3d4'"],
    ["compare", "--mlflow", "{uri}", "a1b2c3d", "e4f5a6b"],
    ["history", "--mlflow", "{uri}"],
    ["history", "--mlflow", "{uri}", "--machine", "cpu-x86_64", "--run", "a/b/c"],
    ["machines", "--mlflow", "{uri}"],
], ids=["compare-filters", "compare-hashes", "history", "history-filtered", "machines"])
@pytest.mark.integration  # waits out a closed port, 0.3-2.4 s each
def test_a_server_that_is_down_is_one_line_without_its_password(verb, down_uri, tmp_path):
    args = [a.replace("{uri}", down_uri) for a in verb]
    out = hopperlab(["--root", str(REPO), *args, "--out", str(tmp_path)], tmp_path,
                    timeout=240)
    _one_line_down(out, down_uri.replace(f"alice:{PASSWORD}@", ""))
    assert not any(tmp_path.iterdir())  # nothing written


def test_compare_family_experiment_with_the_site_server_down(down_uri, tmp_path):
    project = copy_project(tmp_path / "proj")
    edit_yaml(project / "configs/sites/local.yaml",
              lambda d: d["tracking"].update(uri=down_uri))
    out = hopperlab(["compare", "membench/copy"], project, timeout=240)
    _one_line_down(out, down_uri.replace(f"alice:{PASSWORD}@", ""))


def test_a_commit_is_a_hash_or_its_prefix():
    from hopperlab.results.machines.mlflow_source import commit_prefix

    full = "0123456789abcdef0123456789abcdef01234567"
    assert commit_prefix(full) == full
    assert commit_prefix(" 0123ABC ") == "0123abc"
    assert commit_prefix("tags.git_commit = '0123abc'") == "0123abc"
    assert commit_prefix('tags.`git_commit`="0123abc"') == "0123abc"
    assert commit_prefix("abc") is None                       # too short to name a commit
    assert commit_prefix("tags.machine = 'abcdef'") is None
    assert commit_prefix("tags.git_commit = '0123abc' and tags.machine = 'x'") is None
    assert commit_prefix("main") is None


COMMITS = {"results": "aaaa1111" + "0" * 32, "results-b": "aaaa2222" + "0" * 32}


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> tuple[Path, str]:
    """A project whose default SQLite store holds the noisy run of two commits that share the
    prefix ``aaaa`` (their git_commit tags set after the upload)."""
    from mlflow import MlflowClient

    from hopperlab.results import tracking

    project = copy_project(tmp_path_factory.mktemp("store") / "proj")
    edit_yaml(project / "experiments/selftest.yaml",
              lambda d: d["experiments"]["noise"].update(repeats=5))
    uri = f"sqlite:///{project / 'results/mlflow.db'}"
    for results, commit in COMMITS.items():
        out = hopperlab(["run", "selftest/noise/noisy", "--no-upload", "--config",
                         "families=selftest", f"results_dir={results}"], project)
        assert out.returncode == 0, out.stderr[-2000:]
        report = tracking.sync(project / results, uri, progress=False)
        assert not report.failed, report
        client = MlflowClient(uri)
        exp = client.get_experiment_by_name("selftest")
        for run in client.search_runs([exp.experiment_id]):
            if run.data.tags.get("git_commit") not in COMMITS.values() and \
                    run.data.tags.get(tracking.TAG_VARIANT) == "noisy":
                client.set_tag(run.info.run_id, "git_commit", commit)
    return project, uri


@pytest.mark.integration
def test_compare_mlflow_takes_hash_prefixes(store, tmp_path):
    project, uri = store
    out = hopperlab(["compare", "--mlflow", uri, "aaaa1111", "tags.git_commit = 'aaaa2222'",
                     "--out", str(tmp_path)], project)
    assert out.returncode in (0, 1), out.stderr[-2000:]
    assert "compare aaaa1111 (A) -> tags.git_commit = 'aaaa2222' (B)" in out.stdout
    assert "ONLY IN" not in out.stdout  # both sides found the run
    out = hopperlab(["compare", "--mlflow", uri, "aaaa1111", "aaaa", "--out", str(tmp_path)],
                    project)
    assert out.returncode == 2
    assert "the commit prefix aaaa matches 2 commits (aaaa11110000, aaaa22220000): give more " \
           "of the hash" in out.stderr
    out = hopperlab(["compare", "--mlflow", uri, "aaaa1111", "bbbb1111", "--out",
                     str(tmp_path)], project)
    assert out.returncode == 2 and "runs whose git_commit starts with bbbb1111" in out.stderr


@pytest.mark.integration
def test_history_with_a_quote_in_its_filters_is_a_clear_error(store, tmp_path):
    project, uri = store
    out = hopperlab(["history", "--mlflow", uri, "--machine", "o'brien", "--out",
                     str(tmp_path)], project)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "no ok run of o'brien" in out.stderr
    out = hopperlab(["history", "--mlflow", uri, "--run", "selftest/noise/it's\"", "--out",
                     str(tmp_path)], project)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "a value with both quote kinds" in out.stderr
    out = hopperlab(["history", "--mlflow", uri, "--run", "selftest/noise/noisy", "--out",
                     str(tmp_path)], project)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "selftest/noise/noisy value: 2 runs" in out.stdout


@pytest.mark.integration
def test_compare_family_experiment_on_a_sqlite_store_says_how_to_open_it(store):
    project, uri = store
    out = hopperlab(["compare", "selftest/noise", "--config", "families=selftest"], project)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("http://127.0.0.1:5000/#/compare-runs?runs=")
    assert f"mlflow ui --backend-store-uri {uri}" in out.stderr
