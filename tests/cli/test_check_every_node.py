"""``hopperlab check --every-node`` on the real test Slurm cluster (issue 29, part 4): one job
per node of the partition (``--nodelist``), each node judged, the slow one named, JUnit XML.
The selftest run stands in for the check subset: 1 % noise, 5 repeats, 10 % lower on the node
whose flag file exists."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from tests.helpers import copy_project, edit_yaml, hopperlab

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def project(tmp_path_factory, slurm_cluster) -> Path:
    project = copy_project(tmp_path_factory.mktemp("nodes") / "project")
    site = {"description": "the test cluster", "executor": "slurm", "poll_interval_s": 1,
            "slurm": {"partition": slurm_cluster.partition},
            "resources": {"smoke": {"gpus": 0, "cpus": 1, "mem_gb": 1, "time_min": 5}},
            "tracking": {"uri": f"sqlite:///{project}/mlflow.db"}}
    (project / "configs/sites/slurm-test.yaml").write_text(yaml.safe_dump(site))
    flags = project / "flags"
    flags.mkdir()
    edit_yaml(project / "experiments/selftest.yaml", lambda d: d["experiments"]["noise"][
        "scales"]["smoke"]["params"].update(jitter=0.01, slow_while=f"{flags}/slow-{{node}}"))
    return project


def _check(project: Path, cluster, junit: Path):
    return hopperlab(["check", "--every-node", "--junit", str(junit), "--config",
                      "site=slurm-test", "families=selftest", "only=selftest/noise/noisy"],
                     project, env=cluster.env)


@pytest.mark.integration
def test_one_job_per_node_on_that_node(project, slurm_cluster, tmp_path):
    out = _check(project, slurm_cluster, tmp_path / "check.xml")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    for node in slurm_cluster.nodes:
        assert f"NODE {node}: PASS" in out.stdout
        record = json.loads((project / f"results/nodes/{node}/selftest/noise/noisy/"
                                       f"record.json").read_text())
        assert record["slurm"]["node"] == node and record["metrics"]["value_n"] == 5
    suite = ET.parse(tmp_path / "check.xml").getroot()
    assert suite.get("tests") == str(len(slurm_cluster.nodes)) and suite.get("failures") == "0"


@pytest.mark.integration
def test_the_slow_node_is_named(project, slurm_cluster, tmp_path):
    slurm_cluster.need_two_nodes()
    slow = slurm_cluster.nodes[-1]
    (project / "flags" / f"slow-{slow}").touch()
    try:
        out = _check(project, slurm_cluster, tmp_path / "check.xml")
    finally:
        (project / "flags" / f"slow-{slow}").unlink()
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    assert f"NODE {slow}: SLOW" in out.stdout
    assert f"NODE {slurm_cluster.nodes[0]}: PASS" in out.stdout
    assert "SLOW selftest/noise/noisy value: worse than the other nodes' median, " \
        in out.stdout                                             # 10 % lower than 10
    case = [c for c in ET.parse(tmp_path / "check.xml").getroot().iter("testcase")
            if c.get("classname") == f"hopperlab.{slow}"]
    assert case and case[0].find("failure").get("type") == "slow"


def test_a_slow_link_among_four_nodes_measured_once_is_named(tmp_path):
    """The 13.6 GB/s node among 55 GB/s ones, one run per node and no reference: the other
    nodes' scatter is the noise."""
    from hopperlab.results.machines.node_check import SLOW, judge_nodes
    from hopperlab.results.rows import RunRow

    def row(node: str, gbps: float) -> RunRow:
        return RunRow("membench", "copy", "h2d-pinned", "ok", None, 1, "full", node, None,
                      "x86_64", None, None, 1.0, {"gbps_at_largest": gbps},
                      tmp_path / node, headline_metrics=("gbps_at_largest",), machine="m")

    rows = {n: [row(n, v)] for n, v in (("a", 55.0), ("b", 54.8), ("c", 55.3), ("d", 13.6))}
    verdicts = {v.node: v for v in judge_nodes(rows, tmp_path / "no-refs")}
    assert verdicts["d"].verdict == SLOW
    assert verdicts["d"].lines == ["SLOW membench/copy/h2d-pinned gbps_at_largest: worse than "
                                   "the other nodes' median, 13.6 vs 55: x0.247 [0.232, 0.264] "
                                   "(95%; 1 vs 3 sample(s), spread 0.54%, min effect 5%)"]
    assert all(verdicts[n].verdict == "pass" for n in "abc")
