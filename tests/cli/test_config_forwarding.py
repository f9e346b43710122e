"""Every config override reaches the job (issue 38, part 1): the words the Snakefile puts on each
``hopperlab submit`` line rebuild the workflow's own matrix, key for key of the config schema."""

from __future__ import annotations

import json
import shlex
from typing import Any, Callable

import pytest

from hopperlab.cli.main import build_parser
from hopperlab.cli.workflow import config_args, workflow_matrix
from hopperlab.config.matrix import load_matrix, parse_overrides
from hopperlab.config.spec import Matrix
from hopperlab.core.schema import project_schema
from tests.helpers import REPO

#: one override per config schema key, away from configs/config.yaml's value, and where the job's
#: spec.json shows it; a key added to the schema without a probe here fails the test below
PROBES: dict[str, tuple[Any, Callable[[Matrix], bool]]] = {
    "site": ("gpu-node", lambda m: {s.site.name for s in m.runs.values()} == {"gpu-node"}),
    "scale": ("full", lambda m: {s.scale for s in m.runs.values()} == {"full"}),
    "results_dir": ("elsewhere", lambda m: all(s.run_dir.startswith("elsewhere/")
                                               for s in m.runs.values())),
    "families": (["selftest"], lambda m: {s.family for s in m.runs.values()} == {"selftest"}),
    "only": (["selftest/noise"], lambda m: set(m.runs) == {"selftest/noise/noisy"}),
    "profiler": ("torch", lambda m: {s.knobs.profiler for s in m.runs.values()} == {"torch"}),
    "asset_substitutes": ({"dolly-15k": "dolly-synthetic"}, lambda m: m.runs[
        "finetune/lora-llama2-7b/baseline"].assets["records"] == "dolly-synthetic"),
    "repeats": (3, lambda m: {s.repeats for s in m.runs.values()} == {3}),
    "processes": (3, lambda m: {s.processes for s in m.runs.values()} == {3}),
}
#: what a probe needs beside its own key (a substitute acts on a family that has the asset)
BESIDE = {"asset_substitutes": {"families": ["finetune"],
                                "only": ["finetune/lora-llama2-7b/baseline"]},
          "only": {"families": ["selftest"]}, "profiler": {"families": ["finetune"], "only": ["finetune/lora-llama2-7b/baseline"]},
          "repeats": {"families": ["selftest"]}, "processes": {"families": ["selftest"]},
          "site": {"families": ["selftest"]},
          "scale": {"families": ["selftest"]}, "results_dir": {"families": ["selftest"]}}


def _job_matrix(workflow: Matrix) -> Matrix:
    """The matrix `hopperlab submit` builds from the rule's command line, as the shell splits it."""
    words = shlex.split(config_args(workflow.config, workflow.root))
    args = build_parser().parse_args(["submit", "some/run/key", "--config", *words])
    return load_matrix(REPO, parse_overrides(args.config))


def _spec_json(matrix: Matrix) -> dict[str, str]:
    return {key: json.dumps(spec.to_dict(), sort_keys=True) for key, spec in matrix.runs.items()}


def test_every_schema_key_has_a_probe():
    declared = set(project_schema(REPO, "config.schema.yaml")["properties"])
    assert declared == set(PROBES), "add a probe for each new config key"


@pytest.mark.parametrize("key", sorted(PROBES))
def test_every_schema_key_round_trips_into_spec_json(key):
    value, shows = PROBES[key]
    workflow = workflow_matrix(REPO, {**BESIDE.get(key, {}), key: value})
    assert shows(workflow), f"the probe of {key} does not change the workflow's matrix"
    job = _job_matrix(workflow)
    assert shows(job), f"--config {key}={value} did not reach the job"
    assert _spec_json(job) == _spec_json(workflow)


def test_all_keys_at_once_give_the_job_the_workflow_spec():
    overrides = {"site": "gpu-node", "scale": "full", "results_dir": "elsewhere",
                 "families": ["finetune"], "profiler": "torch", "repeats": 2, "processes": 3,
                 "only": ["finetune/lora-llama2-7b/baseline"],
                 "asset_substitutes": {"dolly-15k": "dolly-synthetic"}}
    assert set(overrides) == set(PROBES)
    workflow = workflow_matrix(REPO, overrides)
    assert _spec_json(_job_matrix(workflow)) == _spec_json(workflow)


def test_a_key_outside_the_schema_is_refused_not_dropped():
    from hopperlab.core.errors import SpecError

    with pytest.raises(SpecError, match="not declared in workflow/schemas/config.schema.yaml"):
        config_args({"site": "local", "stray": 1}, REPO)
