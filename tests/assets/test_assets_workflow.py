"""Assets as DAG steps: a run's rule depends on the assets its experiment names, an asset is built
once before the runs that use it, a deleted or redefined asset is rebuilt with its dependents only,
and naming mistakes stop before anything runs."""

from __future__ import annotations

import json
import re

import pytest

from hopperlab.config.matrix import load_matrix
from hopperlab.core.errors import AssetMissing, SpecError
from tests.helpers import copy_project, edit_yaml, snakemake

pytestmark = pytest.mark.timeout(600)
SELECT = ["--config", "families=selftest", "only=selftest/assets,selftest/trivial"]


def _planned(out: str) -> dict[str, int]:
    """Job counts of a dry run's 'Job stats' table."""
    counts: dict[str, int] = {}
    table = out.split("Job stats:", 1)[1] if "Job stats:" in out else ""
    for line in table.splitlines():
        m = re.match(r"^(\w+)\s+(\d+)$", line.strip())
        if m and m.group(1) != "total":
            counts[m.group(1)] = int(m.group(2))
    return counts


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    project = copy_project(tmp_path_factory.mktemp("assets") / "project")
    out = snakemake(["--cores", "2", *SELECT], project)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return project


@pytest.mark.integration
def test_the_run_reads_the_asset_the_workflow_built_first(built):
    record = json.loads((built / "results/selftest/assets/table/metrics.json").read_text())
    assert record["status"] == "ok"
    assert record["metrics"]["table_rows"] == 10000
    assert (built / "assets/interactions-smoke/MANIFEST.sha256").is_file()
    assert record["tags"]["selftest.table"] == str(built / "assets/interactions-smoke")


@pytest.mark.integration
def test_nothing_reruns_when_nothing_changed(built):
    out = snakemake(["-n", "--cores", "2", *SELECT], built)
    assert "Nothing to be done" in out.stdout + out.stderr


@pytest.mark.integration
def test_a_deleted_asset_reruns_itself_and_its_dependents_only(built, tmp_path):
    import shutil

    shutil.rmtree(built / "assets/interactions-smoke")
    out = snakemake(["-n", "--cores", "2", *SELECT], built)
    planned = _planned(out.stdout)
    # the asset, the one run that uses it, and the report; the asset-free run stays
    assert planned == {"asset": 1, "run": 1, "report": 1, "all": 1}, out.stdout[-3000:]
    assert "output: results/selftest/trivial" not in out.stdout
    out = snakemake(["--cores", "2", *SELECT], built)
    assert out.returncode == 0, out.stderr[-3000:]


@pytest.mark.integration
def test_a_changed_definition_rebuilds_the_asset(built):
    edit_yaml(built / "configs/assets.yaml",
              lambda d: d["assets"]["interactions-smoke"].update(rows=500))
    out = snakemake(["-n", "--cores", "2", *SELECT], built)
    planned = _planned(out.stdout)
    assert planned.get("asset") == 1 and planned.get("run") == 1, out.stdout[-3000:]
    out = snakemake(["--cores", "2", *SELECT], built)
    assert out.returncode == 0, out.stderr[-3000:]
    record = json.loads((built / "results/selftest/assets/table/metrics.json").read_text())
    assert record["metrics"]["table_rows"] == 500


def test_an_unknown_asset_name_is_refused_naming_file_and_key(tmp_path):
    project = copy_project(tmp_path / "project")
    edit_yaml(project / "experiments/selftest.yaml",
              lambda d: d["experiments"]["assets"].update(assets={"table": "no-such-table"}))
    with pytest.raises(SpecError) as err:
        load_matrix(project, {"families": "selftest"})
    text = str(err.value)
    assert "experiments/selftest.yaml" in text and "assets.table" in text
    assert "no-such-table" in text and "interactions-smoke" in text


def test_asset_files_of_families_merge_and_duplicates_name_both_files(tmp_path):
    from hopperlab.assets.registry import load_assets

    project = copy_project(tmp_path / "project")
    extra = project / "configs/assets.d"
    extra.mkdir(exist_ok=True)
    (extra / "zz-test.yaml").write_text(
        "assets:\n  extra-table:\n    kind: generated-table\n    rows: 3\n"
        "    columns: {x: {type: int, low: 0, high: 9}}\n")
    specs = load_assets(project)
    assert specs["extra-table"].source == "configs/assets.d/zz-test.yaml"
    (extra / "zz-dup.yaml").write_text(
        "assets:\n  interactions-smoke:\n    kind: generated-table\n    rows: 3\n"
        "    columns: {x: {type: int, low: 0, high: 9}}\n")
    with pytest.raises(SpecError) as err:
        load_assets(project)
    assert "configs/assets.d/zz-dup.yaml" in str(err.value)
    assert "configs/assets.yaml" in str(err.value)


def test_a_run_without_its_asset_says_which_and_how_to_build_it(tmp_path):
    project = copy_project(tmp_path / "project")
    matrix = load_matrix(project, {"families": "selftest"})
    spec = matrix.get("selftest/assets/table")
    with pytest.raises(AssetMissing) as err:
        spec.asset_path("table")
    assert "interactions-smoke" in str(err.value) and "hopperlab assets fetch" in str(err.value)
    with pytest.raises(AssetMissing) as err:
        spec.asset_path("model")
    assert "'model'" in str(err.value)


@pytest.mark.integration
def test_the_offline_full_scale_command_plans_no_substituted_asset(tmp_path):
    """README: `--config scale=full asset_substitutes=...` on a node without the Hub."""
    project = copy_project(tmp_path / "project")
    subs = "asset_substitutes=dolly-15k:dolly-synthetic,llama-2-tokenizer:tiny-tokenizer"
    out = snakemake(["-n", "--config", "scale=full", "site=gpu-node", subs], project)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    planned = set(re.findall(r"output: assets/([^/\s]+)/MANIFEST", out.stdout))
    assert not planned & {"dolly-15k", "llama-2-tokenizer", "dolly-15k-prepared-2048"}, planned
    derived = [n for n in planned if n.startswith("dolly-15k-prepared-2048.")]
    assert len(derived) == 1 and {"dolly-synthetic", "tiny-tokenizer"} <= planned
    full_1b = [job for job in out.stdout.split("\nrule ") if "experiment=full-1b" in job]
    assert len(full_1b) == 2 and all(f"assets/{derived[0]}/" in b for b in full_1b), full_1b


@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
def test_the_rule_builds_a_derived_asset_from_the_substitutes(tmp_path):
    """What the planned asset rule runs: `hopperlab fetch NAME --config ...asset_substitutes`."""
    from tests.helpers import hopperlab

    project = copy_project(tmp_path / "project")
    subs = {"dolly-15k": "dolly-synthetic", "llama-2-tokenizer": "tiny-tokenizer"}
    config = ["scale=full", "asset_substitutes=" + ",".join(f"{a}:{b}" for a, b in subs.items())]
    spec = load_matrix(project, dict(c.split("=", 1) for c in config)).runs["finetune/full-1b/fp8"]
    name = spec.assets["data"]
    assert name.startswith("dolly-15k-prepared-2048.")
    out = hopperlab(["fetch", name, "--config", *config], project)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    info = json.loads((project / "assets" / name / "ASSET.json").read_text())
    assert {role: i["name"] for role, i in info["inputs"].items()} == {
        "data": "dolly-synthetic", "tokenizer": "tiny-tokenizer"}
    assert not (project / "assets/dolly-15k").exists()
