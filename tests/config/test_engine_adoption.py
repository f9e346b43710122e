"""Engines with params of their own plan the runs the one params class planned (issue 55).

Two fixtures, written by the code before engines (tests/fixtures/engines/README.md):
``results-ca91e75/`` holds the spec.json of every finetune run of the default matrix as
``hopperlab submit`` of ca91e75 wrote it (52 params each, ``backend: nemo``, the dead
``nemo_recipe``); ``plan-56b0f53.json`` what 56b0f53 planned for every family at smoke scale on
the local site and at full scale on the gpu-node site. A finished run is adopted, not redone,
when its spec.json's fingerprint equals the one planned now (``run.submit.adoptable_attempt``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hopperlab.config.matrix import load_matrix
from hopperlab.config.spec import result_data, spec_data_fingerprint

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "engines"
#: runs planned before that the engines' declarations refuse now, each with why
DROPPED = {"finetune/lora-llama2-7b/nemo-fp8":
           "fp8 needs TransformerEngine's layer spec, which the mcore engine does not build: "
           "the job always skipped it"}


#: experiments planned now that 56b0f53 did not have, each with why (new runs, not changed ones)
ADDED = {"membench/matmul": "the node's own matmul ceilings as runs (issue 48)",
         "finetune/lora-sweep": "the micro-batch sweep of the memory techniques (issue 49)"}
#: spec fields added since 56b0f53 that say how a run is measured, not what it computes:
#: compared apart (their defaults), never a reason to redo a run
NEW_FIELDS = {"processes": 1}


def _experiment(key: str) -> str:
    return key.rsplit("/", 1)[0]


def _data(spec) -> dict:
    """A RunSpec as its spec.json holds it (JSON types: lists, not tuples)."""
    return json.loads(json.dumps(spec.to_dict(), default=str))


def test_every_finetune_run_of_ca91e75_is_adopted():
    planned = {k: s for k, s in load_matrix(ROOT, {"families": "finetune"}).runs.items()
               if _experiment(k) not in ADDED}
    files = sorted((FIXTURES / "results-ca91e75").rglob("spec.json"))
    assert len(files) == len(planned) + len(DROPPED)
    engines = set()
    for path in files:
        old = json.loads(path.read_text())
        engines.add(old["params"]["backend"])
        if old["key"] in DROPPED:
            assert old["key"] not in planned
            continue
        assert spec_data_fingerprint(old) == spec_data_fingerprint(_data(planned[old["key"]])), \
            old["key"]
    assert engines == {"torch", "nemo", "sharded"}  # each engine's runs, nemo by its old name


def test_a_changed_param_is_still_a_new_run():
    """The adoption is not blind: a spec.json of ca91e75 whose run changed since is redone."""
    planned = load_matrix(ROOT, {"families": "finetune"}).runs
    path = FIXTURES / "results-ca91e75" / "finetune/lora-llama2-7b/nemo-baseline/spec.json"
    old = json.loads(path.read_text())
    now = _data(planned[old["key"]])
    assert spec_data_fingerprint(old) == spec_data_fingerprint(now)
    old["params"]["lora_rank"] += 1
    assert spec_data_fingerprint(old) != spec_data_fingerprint(now)


@pytest.mark.parametrize("label", ["local/smoke", "gpu-node/full"])
def test_the_default_matrix_plans_the_runs_it_planned_before(label):
    before = json.loads((FIXTURES / "plan-56b0f53.json").read_text())[label]
    site, scale = label.split("/")
    runs = {k: s for k, s in load_matrix(ROOT, {"site": site, "scale": scale}).runs.items()
            if _experiment(k) not in ADDED}
    assert set(before) - set(runs) == set(DROPPED)
    assert set(runs) <= set(before)
    for key, spec in runs.items():
        now = result_data(_data(spec))
        was = result_data({**before[key], "site": {}})
        now.pop("site")
        was.pop("site")
        for name, default in NEW_FIELDS.items():
            assert now.pop(name, default) == default, (key, name)
        assert now == was, key


@pytest.mark.parametrize("key", ["finetune/lora-llama2-7b/baseline",
                                 "finetune/lora-llama2-7b/nemo-baseline",
                                 "finetune/full-llama2-13b-sharded/fsdp2"])
def test_a_finished_run_of_ca91e75_is_what_submit_adopts(tmp_path, key):
    """Its spec.json in a results folder with an ``ok`` record: ``hopperlab submit`` takes that
    attempt for the run (``adoptable_record``) instead of submitting it again."""
    from hopperlab.core import rundir as record
    from hopperlab.run.submit import adoptable_record

    matrix = load_matrix(ROOT, {"families": "finetune", "only": key,
                                "results_dir": str(tmp_path / "results")})
    spec = matrix.get(key)
    run_dir = matrix.root / spec.run_dir
    old = json.loads((FIXTURES / "results-ca91e75" / key / "spec.json").read_text())
    record.write_json_atomic(run_dir / record.SPEC_FILE, old)
    record.write_record(run_dir, {"key": key, "attempt": 1, "status": "ok", "reason": None,
                                  "metrics": {}})
    (run_dir / record.HISTORY_FILE).write_text(
        json.dumps({"attempt": 1, "event": "start"}) + "\n" +
        json.dumps({"attempt": 1, "event": "end"}) + "\n")
    rec = adoptable_record(matrix, spec, run_dir)
    assert rec is not None and rec["status"] == "ok"
    old["params"]["seed"] += 1  # a run that changed since is not adopted
    record.write_json_atomic(run_dir / record.SPEC_FILE, old)
    assert adoptable_record(matrix, spec, run_dir) is None
