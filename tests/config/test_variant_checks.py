"""A knob that contradicts its variant's params is refused when the matrix loads, with the file
and the knob's key path (``FamilyInfo.check``), not by a failed run after the queue."""

from __future__ import annotations

from pathlib import Path

import pytest

from hopperlab.config.matrix import load_matrix
from hopperlab.config.spec import RunSpec
from hopperlab.core.errors import SpecError
from tests.helpers import REPO, copy_project, edit_yaml

#: (family, experiment, variant, knobs set on the variant, params set on it, words of the why)
CLASHES = [
    ("inference", "kv-cache", "resident", {"memory": "managed"}, {},
     "needs study: kv-cache and policy: offload"),
    ("inference", "weight-streaming", "resident", {"memory": "managed"}, {},
     "needs study: kv-cache and policy: offload"),
    ("database", "tpch", "device", {"memory": "managed"}, {},
     "memory: managed goes with placement: managed"),
    ("database", "tpch", "device", {}, {"placement": "system"},
     "memory: system goes with placement: system"),
    ("recommender", "latency", "gpu", {"num_workers": 4}, {"workers_all_cores": True},
     "workers_all_cores: true"),
    ("recommender", "latency", "cpu-only", {"memory": "managed"}, {},
     "pipeline: cpu has no GPU component"),
    ("recommender", "latency", "gpu", {"memory": "managed"}, {"transfer": "pageable"},
     "no staging buffer"),
    ("finetune", "lora-llama2-7b", "baseline", {"memory": "managed"},
     {"expandable_segments": True}, "expandable_segments: not with memory: managed"),
    ("finetune", "lora-llama2-7b", "baseline", {"memory": "managed"},
     {"offload_budget_gib": 1.0, "offload_budget_caps_allocator": True},
     "offload_budget_caps_allocator: not with memory: managed"),
    ("finetune", "lora-llama2-7b", "baseline", {"offload": "both"},
     {"activation_offload": "save_on_cpu"}, "save_on_cpu cannot be combined"),
    ("finetune", "lora-llama2-7b", "baseline", {"precision": "fp8"},
     {"recompute_elementwise": True}, "recompute_elementwise: not with precision fp8"),
    ("finetune", "lora-llama2-7b", "baseline", {}, {"oversubscribe": True},
     "oversubscribe: needs the knob memory: managed"),
    ("membench", "alloc", "device", {"memory": "managed"}, {},
     "managed contradicts kind: device"),
    ("membench", "alloc", "device", {"memory": "system"}, {},
     "kind: system goes with memory: system"),
    ("membench", "copy", "h2d-pageable", {"memory": "system"}, {},
     "system has no copy to measure"),
    ("membench", "collective", "all-reduce", {"memory": "managed"}, {},
     "does not apply to the test collective"),
]


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_project(tmp_path_factory.mktemp("checks") / "project")


@pytest.mark.parametrize("family,exp,var,knobs,params,why", CLASHES,
                         ids=[f"{c[0]}-{c[1]}-{c[2]}-{'-'.join({**c[3], **c[4]})}"
                              for c in CLASHES])
def test_contradiction_is_refused_at_load_with_file_and_key(project, family, exp, var, knobs,
                                                            params, why):
    path = project / "experiments" / f"{family}.yaml"
    original = path.read_text()

    def clash(data: dict) -> None:
        variant = data["experiments"][exp]["variants"][var]
        variant.update(knobs)
        variant.setdefault("params", {}).update(params)

    edit_yaml(path, clash)
    try:
        with pytest.raises(SpecError) as info:
            load_matrix(project, {"families": family})
    finally:
        path.write_text(original)
    msg = str(info.value)
    knob = next(iter(knobs), "memory")  # the knob the variant sets, or the one it leaves unset
    assert msg.startswith(f"experiments/{family}.yaml: experiments.{exp}.variants.{var}.{knob}: ")
    assert why in msg and "\n" not in msg


def test_the_projects_matrix_has_no_contradiction():
    for scale in ("smoke", "full"):
        assert load_matrix(REPO, {"scale": scale}).runs


def test_a_hand_edited_spec_json_is_refused_too():
    spec = load_matrix(REPO).runs["database/tpch/device"].to_dict()
    spec["knobs"]["memory"] = "managed"
    with pytest.raises(SpecError, match=r"^spec.json: knobs.memory: 'managed' with placement 'device'"):
        RunSpec.from_dict(spec)
