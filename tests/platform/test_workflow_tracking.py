"""The workflow and the CLI with MLflow down, damaged or behind credentials, and a changed
selection (issue 16, items 3, 6, 8, 14): real Snakemake, real MLflow (server or SQLite), read back.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from hopperlab.config.matrix import load_matrix
from hopperlab.results import tracking
from hopperlab.run.submit import submit
from tests.helpers import copy_project, edit_yaml, hopperlab, snakemake
from tests.infra.mlflow_fixture import free_port
from tests.results.test_tracking import make_run

pytestmark = pytest.mark.timeout(900)

TRIVIAL = "selftest/trivial/ok"


def add_site(project: Path, name: str, tracking_uri: str, upload: str = "each") -> None:
    """configs/sites/<name>.yaml: the local site with another tracking URI (and upload mode)."""
    path = project / "configs" / "sites" / f"{name}.yaml"
    shutil.copy(project / "configs" / "sites" / "local.yaml", path)
    edit_yaml(path, lambda d: d.update(tracking={"uri": tracking_uri, "upload": upload}))


def record(project: Path, results: str, key: str) -> dict:
    return json.loads((project / results / key / "record.json").read_text())


@pytest.mark.integration
def test_changing_the_selection_reruns_no_finished_run(tmp_path):
    project = copy_project(tmp_path / "project")
    out = snakemake(["--cores", "1", "--config", "families=selftest", f"only={TRIVIAL}"], project)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    done = project / "results" / TRIVIAL / "metrics.json"
    for only in (f"{TRIVIAL},selftest/faults/ok", TRIVIAL):  # a run added, then removed again
        plan = snakemake(["-n", "--cores", "1", "--config", "families=selftest", f"only={only}"],
                         project)
        assert plan.returncode == 0, plan.stderr[-3000:]
        text = plan.stdout + plan.stderr
        # the report may be rebuilt for the new selection; the run is not redone
        assert f"output: results/{TRIVIAL}/metrics.json" not in text, text[-3000:]
        assert "tracking-" not in text
    assert "output: results/selftest/faults/ok/metrics.json" in \
        snakemake(["-n", "--cores", "1", "--config", "families=selftest",
                   f"only={TRIVIAL},selftest/faults/ok"], project).stdout
    assert record(project, "results", TRIVIAL)["attempt"] == 1 and done.exists()


@pytest.mark.integration
def test_mlflow_down_at_the_start_only_delays_the_upload(mlflow_uri, tmp_path):
    from mlflow import MlflowClient
    project = copy_project(tmp_path / "project")
    add_site(project, "down", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    blocker = project / "not-a-folder"  # a store folder that cannot be written
    blocker.write_text("")
    add_site(project, "readonly", f"sqlite:///{blocker / 'mlflow.db'}")
    for site in ("down", "readonly"):
        results = f"results-{site}"
        out = snakemake(["--cores", "1", "--config", "families=selftest", f"only={TRIVIAL}",
                         f"site={site}", f"results_dir={results}"], project)
        text = out.stdout + out.stderr
        assert out.returncode == 0, text[-4000:]
        assert record(project, results, TRIVIAL)["status"] == "ok"
        assert "Traceback" not in text
        warnings = [ln for ln in text.splitlines() if "hopperlab sync" in ln]
        assert len(warnings) == 1, text[-4000:]
        assert not (project / results / TRIVIAL / "mlflow.json").exists()

    # MLflow is back (here: the site now names a live server): sync uploads what waited
    for site in ("down", "readonly"):
        add_site(project, site, mlflow_uri)
        results = f"results-{site}"
        out = hopperlab(["sync", "--config", f"site={site}", f"results_dir={results}",
                         "families=selftest"], project)
        assert out.returncode == 0, out.stderr[-3000:]
        assert "1 uploaded" in out.stdout
        info = json.loads((project / results / TRIVIAL / "mlflow.json").read_text())
        run = MlflowClient(mlflow_uri).get_run(info["run_id"])
        assert run.data.tags["hopperlab.status"] == "ok"
        assert run.data.tags["hopperlab.run_uid"] == record(project, results, TRIVIAL)["run_uid"]


@pytest.mark.integration
def test_a_site_that_uploads_at_the_end_syncs_once_after_success_and_failure(mlflow_uri,
                                                                             tmp_path):
    """``tracking.upload: at-end`` (the local site): the jobs upload nothing, the workflow's end
    uploads every run, after a failed run too; MLflow down only delays it, in one line."""
    from mlflow import MlflowClient
    project = copy_project(tmp_path / "project")
    add_site(project, "end", mlflow_uri, upload="at-end")
    add_site(project, "end-down", f"http://127.0.0.1:{free_port()}", upload="at-end")
    keys = (TRIVIAL, "selftest/faults/raises")
    out = snakemake(["--cores", "1", "--keep-going", "--config", "families=selftest",
                     f"only={','.join(keys)}", "site=end", "results_dir=r-end"], project)
    text = out.stdout + out.stderr
    assert out.returncode != 0                                    # a run failed: onerror
    assert [ln for ln in text.splitlines() if "[hopperlab] sync to" in ln and "2 uploaded" in ln], \
        text[-3000:]
    for key in keys:
        info = json.loads((project / "r-end" / key / "mlflow.json").read_text())
        run = MlflowClient(mlflow_uri).get_run(info["run_id"])
        assert run.data.tags["hopperlab.run_uid"] == record(project, "r-end", key)["run_uid"]

    out = snakemake(["--cores", "1", "--config", "families=selftest", f"only={TRIVIAL}",
                     "site=end-down", "results_dir=r-down"], project)
    text = out.stdout + out.stderr
    assert out.returncode == 0 and "Traceback" not in text, text[-3000:]
    assert len([ln for ln in text.splitlines() if "hopperlab sync" in ln]) == 1, text[-3000:]
    assert record(project, "r-down", TRIVIAL)["status"] == "ok"
    assert not (project / "r-down" / TRIVIAL / "mlflow.json").exists()


def _one_line_error(out, *needles: str) -> None:
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2, out.stdout + out.stderr
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.mark.integration  # waits on MLflow URIs that do not answer, 4 s
def test_sync_says_in_one_line_what_is_wrong_with_mlflow(tmp_path):
    project = copy_project(tmp_path / "project")
    run_dir = make_run(project / "results", "fam", "copy", "h2d")
    port = free_port()
    add_site(project, "down", f"http://alice:s3cret@127.0.0.1:{port}")
    down = hopperlab(["sync", "--config", "site=down"], project)
    _one_line_error(down, f"http://127.0.0.1:{port}", "unreachable")
    assert "s3cret" not in down.stdout + down.stderr

    store = project / "results" / "mlflow.db"
    store.write_bytes(b"this is not an SQLite database" * 200)
    damaged = hopperlab(["sync"], project)
    _one_line_error(damaged, str(store), "not a database")
    assert not (run_dir / "mlflow.json").exists()


@pytest.mark.integration
def test_a_password_in_the_tracking_uri_is_written_nowhere(mlflow_uri, tmp_path, capsys):
    from mlflow import MlflowClient
    project = copy_project(tmp_path / "project")
    add_site(project, "creds", mlflow_uri.replace("http://", "http://alice:s3cret@"))
    matrix = load_matrix(project, {"site": "creds", "families": "selftest", "only": TRIVIAL})
    lines: list[str] = []
    assert submit(matrix, TRIVIAL, executor="debug", log=lines.append,
                  upload=tracking.upload_quietly) == 0
    run_dir = project / "results" / TRIVIAL
    written = {p: p.read_text(errors="replace") for p in run_dir.rglob("*") if p.is_file()}
    assert [p for p, text in written.items() if "s3cret" in text] == []
    spec = json.loads((run_dir / "spec.json").read_text())
    assert spec["site"]["tracking_uri"] == mlflow_uri

    client = MlflowClient(mlflow_uri)
    run_id = json.loads((run_dir / "mlflow.json").read_text())["run_id"]
    run = client.get_run(run_id)
    assert run.data.params["site.tracking_uri"] == mlflow_uri
    assert not [k for k, v in {**run.data.params, **run.data.tags}.items() if "s3cret" in v]
    spec_copy = Path(client.download_artifacts(run_id, "spec.json", str(tmp_path / "dl")))
    assert "s3cret" not in spec_copy.read_text()
    out = capsys.readouterr()
    assert "s3cret" not in "\n".join(lines) + out.out + out.err
