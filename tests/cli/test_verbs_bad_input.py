"""Bad input to the result verbs is one clear line, and their output says what a user needs
(issue 37, minor items): a hand reference of a value <= 0 and a NaN/inf price are refused at
load; ``machines`` on a record whose variant is a path; ``sync`` names the runs that failed and
why; JUnit stays valid XML when a reason holds ANSI escapes or NUL; ``machines --reference``
takes aliases; ``hopperlab run`` prints what it measured."""

from __future__ import annotations

import csv
import json
import math
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from hopperlab.cli.main import main
from hopperlab.config.cost import CostSpec
from hopperlab.core.errors import SpecError
from hopperlab.results.machines import references as R

from tests.helpers import REPO, copy_project, hopperlab, project_with_noisy_run

NOISY = "selftest/noise/noisy"
FIX = REPO / "tests/fixtures/machines"


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> tuple[Path, str]:
    """A project with a real run measured with 5 repeats, and what `hopperlab run` printed."""
    proj, out = project_with_noisy_run(tmp_path_factory.mktemp("bad") / "proj")
    return proj, out.stdout


def _copy_with_record(project: Path, name: str, **record) -> Path:
    dest = project / name
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(project / "results-a", dest)
    path = dest / NOISY / "record.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **record}))
    return dest


@pytest.mark.integration
def test_run_prints_the_values_it_measured(project):
    proj, stdout = project
    line = [x for x in stdout.splitlines() if " measured " in x]
    assert len(line) == 1, stdout
    assert line[0].startswith(f"[hopperlab] {NOISY} measured value = ")
    assert " ± " in line[0]                                      # 5 repeats: an interval
    assert line[0].endswith(f"({proj / 'results-a' / NOISY / 'metrics.json'})")


@pytest.mark.parametrize("value", [-10, 0])
def test_a_hand_reference_of_a_value_not_above_zero_is_refused_at_load(tmp_path, value):
    path = tmp_path / "m1.yaml"
    path.write_text(f"machine: m1\nreferences:\n  {NOISY}:\n    value: {{value: {value}, "
                    f"lower: -0.05, upper: 0.05}}\n")
    with pytest.raises(SpecError, match=rf"m1.yaml: references.{NOISY}.value: value is "
                                        rf"{value}: a reference is a positive figure"):
        R.load_references(path)


@pytest.mark.parametrize("rate", [math.nan, math.inf])
def test_a_price_that_is_not_finite_is_refused(rate):
    with pytest.raises(ValueError, match="per_gpu_hour is (nan|inf): a rate is a finite number"):
        CostSpec(per_gpu_hour=rate)
    with pytest.raises(ValueError, match="per_kwh is"):
        CostSpec(per_node_hour=1.0, per_kwh=rate)


def test_a_site_priced_at_nan_is_one_line(tmp_path):
    proj = copy_project(tmp_path / "proj")
    site = proj / "configs/sites/local.yaml"
    site.write_text(site.read_text().replace("per_node_hour: 0.10", "per_node_hour: .nan"))
    out = hopperlab(["list", "--json"], proj)
    assert out.returncode == 2, out.stdout[-1000:]
    assert out.stderr.strip().endswith("local.yaml: cost: per_node_hour is nan: a rate is a "
                                       "finite number"), out.stderr


@pytest.mark.integration
def test_machines_on_a_record_whose_variant_is_a_path_is_one_line(project, tmp_path, capsys):
    proj, _ = project
    evil = _copy_with_record(proj, "results-evil", variant="../../x", machine="other-m")
    code = main(["--root", str(proj), "machines", str(evil), str(proj / "results-a"),
                 "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"{evil}: no run to compare: {evil / NOISY / 'record.json'}: variant: " \
           f"'../../x' is not a name: '/'" in err, err


@pytest.mark.integration
def test_sync_names_the_run_that_failed_and_why(project):
    proj, _ = project
    broken = proj / "results-broken"
    shutil.rmtree(broken, ignore_errors=True)
    shutil.copytree(proj / "results-a", broken)
    (broken / NOISY / "record.json").write_text("{ torn")
    (broken / NOISY / "metrics.json").write_text("{ torn")
    out = hopperlab(["sync", "--config", "families=selftest", "results_dir=results-broken"],
                    proj)
    assert out.returncode == 1, out.stderr[-2000:]
    line = out.stdout.strip().splitlines()[-1]
    assert "0 uploaded, 0 already in MLflow, 1 failed (" in line, line
    assert f"{broken / NOISY}: " in line and "\n" not in line


@pytest.mark.integration
def test_junit_is_valid_xml_when_a_reason_holds_ansi_escapes_and_nul(project, tmp_path):
    proj, _ = project
    results = _copy_with_record(proj, "results-ansi", status="failed",
                                reason="\x1b[31mCUDA error\x1b[0m: bad \x00 byte \x07")
    junit = tmp_path / "check.xml"
    assert main(["--root", str(proj), "check", str(results), "--references",
                 str(tmp_path / "refs"), "--junit", str(junit)]) == 0
    failure = ET.parse(junit).getroot().find("testcase/failure")
    assert failure is not None and failure.get("type") == "failed"
    assert failure.text == "CUDA error: bad \\x00 byte \\x07"


@pytest.mark.integration  # renders the machines pages, 2 s
def test_machines_reference_takes_an_alias(tmp_path, capsys):
    assert main(["--root", str(REPO), "machines", str(FIX / "results-h200"),
                 str(FIX / "results-h100"), "--reference", "h100", "--out",
                 str(tmp_path)]) == 0, capsys.readouterr().err
    rows = list(csv.DictReader((tmp_path / "machines.csv").open()))
    assert {r["reference_machine"] for r in rows} == {"h100-80g-pcie5-x86_64"}
    assert main(["--root", str(REPO), "machines", str(FIX / "results-h200"),
                 str(FIX / "results-h100"), "--reference", "gh200", "--out",
                 str(tmp_path)]) == 2                           # an alias of neither
    assert "--reference gh200: not one of the compared machines" in capsys.readouterr().err
