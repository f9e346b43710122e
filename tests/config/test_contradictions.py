"""Each contradiction a family knows is refused when the matrix loads (issue 38, part 4), naming
the file and key, with the project's one error base."""

from __future__ import annotations

import pytest

from hopperlab.config.matrix import load_matrix
from hopperlab.core.errors import HopperlabError, SpecError
from hopperlab.workloads.base import Contradiction
from hopperlab.workloads.prediction import MissingInput, Unpredictable
from tests.helpers import copy_project, edit_yaml


def _variant(project, experiment: str, name: str, variant: dict) -> None:
    edit_yaml(project / "experiments/finetune.yaml",
              lambda d: d["experiments"][experiment]["variants"].update({name: variant}))


def _refusal(project, only: str) -> str:
    with pytest.raises(SpecError) as info:
        load_matrix(project, {"families": "finetune", "only": only})
    return str(info.value)


#: a variant of lora-llama2-7b on the mcore engine: the experiment's torch-only params set null
MCORE = {"backend": "nemo", "weights": "random", "offload_min_bytes": None,
         "offload_budget_gib": None, "resident_layers": None, "liger": None}


def test_nemo_with_managed_memory_is_refused_at_matrix_load(tmp_path):
    project = copy_project(tmp_path / "p")
    _variant(project, "lora-llama2-7b", "nemo-managed",
             {"description": "x", "memory": "managed", "params": MCORE})
    msg = _refusal(project, "finetune/lora-llama2-7b/nemo-managed")
    assert "experiments/finetune.yaml" in msg
    assert ("variants.nemo-managed.memory: the finetune family's mcore engine does not "
            "implement memory='managed'") in msg
    _variant(project, "lora-llama2-7b", "nemo-managed",
             {"description": "x", "params": MCORE})  # the same on device: fine
    assert load_matrix(project, {"families": "finetune",
                                 "only": "finetune/lora-llama2-7b/nemo-managed"}).runs


def test_nemo_with_full_fine_tuning_is_refused_at_matrix_load(tmp_path):
    project = copy_project(tmp_path / "p")
    _variant(project, "lora-llama2-7b", "nemo-full",
             {"description": "x", "params": {**MCORE, "method": "full"}})
    msg = _refusal(project, "finetune/lora-llama2-7b/nemo-full")
    assert "nemo-full.params.method: expected one of lora" in msg


@pytest.mark.parametrize("offload", ["parameters", "both"])
def test_moe_with_parameter_offload_is_refused_at_matrix_load(tmp_path, offload):
    project = copy_project(tmp_path / "p")
    _variant(project, "moe-sft", "offload-params", {"description": "x", "offload": offload})
    msg = _refusal(project, "finetune/moe-sft/offload-params")
    assert f"variants.offload-params.offload: {offload}, but parameter offload" in msg
    assert "hopperlab-moe" in msg


def test_the_default_matrix_holds_no_contradiction():
    from tests.helpers import REPO

    for scale in ("smoke", "full"):
        assert load_matrix(REPO, {"scale": scale}).runs


@pytest.mark.parametrize("error", [Contradiction("memory", "x"), Unpredictable("x"),
                                   MissingInput("x")])
def test_family_exceptions_share_the_project_base(error):
    assert isinstance(error, HopperlabError)
    assert isinstance(Contradiction("memory", "x"), SpecError)
