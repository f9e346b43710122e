"""A family's engines as declarations (issue 55): every (engine, knob value) and (engine, param)
pair an engine cannot honour is refused when the matrix loads, in one line naming the file, the
variant and the key; ``hopperlab list`` exits 2 with it. The pairs are derived from the
declarations (``FamilyInfo.engines``), so a knob value or param added to one engine is walked
here without editing this file."""

from __future__ import annotations

import typing
from dataclasses import MISSING, fields

import pytest

from hopperlab.cli.main import main
from hopperlab.config.spec import build_params, check_knobs, check_variant
from hopperlab.core.errors import SpecError
from hopperlab.workloads import family_info
from hopperlab.workloads.base import EngineInfo, Knobs
from tests.helpers import copy_project, edit_yaml

FT = family_info("finetune")
SOURCE = "experiments/finetune.yaml"
VAR = "experiments.x.variants.v"


def _value_of(field) -> object:
    """A value of a field that is not null (null says: not this engine's)."""
    if field.default is not MISSING and field.default is not None:
        return field.default
    if field.default_factory is not MISSING:
        return field.default_factory()
    return 1


def knob_pairs() -> list[tuple[EngineInfo, str, object]]:
    """Every (engine, knob, value) of the family's vocabulary the engine does not implement
    (num_workers: the counts the family names, where the engine has no data loader)."""
    return [(e, knob, value) for e in FT.engines for knob, values in FT.supported_knobs.items()
            for value in sorted(values - e.supported_knobs.get(knob, frozenset()), key=str)]


def param_pairs() -> list[tuple[EngineInfo, str, object]]:
    """Every (engine, param) of another engine that this one has no field for, and every value
    of a shared field's choices that this engine's narrower type leaves out."""
    out = []
    for e in FT.engines:
        own = {f.name: f for f in fields(e.params)}
        hints = typing.get_type_hints(e.params)
        for other in FT.engines:
            other_hints = typing.get_type_hints(other.params)
            for f in fields(other.params):
                if f.name == FT.engine_param:
                    continue
                if f.name not in own:
                    out.append((e, f.name, _value_of(f)))
                elif typing.get_origin(other_hints[f.name]) is typing.Literal and \
                        typing.get_origin(hints[f.name]) is typing.Literal:
                    for value in set(typing.get_args(other_hints[f.name])) - \
                            set(typing.get_args(hints[f.name])):
                        out.append((e, f.name, value))
    unique = {(e.name, name, repr(value)): (e, name, value) for e, name, value in out}
    return [unique[k] for k in sorted(unique)]


def _refused(engine: EngineInfo, knobs: dict, params: dict) -> str:
    with pytest.raises(SpecError) as err:
        built = build_params(FT, {"backend": engine.name, **params}, SOURCE, f"{VAR}.params")
        checked = check_knobs(FT, knobs, SOURCE, VAR, built)
        check_variant(FT, checked, built, SOURCE, VAR)
    return str(err.value)


def test_the_pairs_are_walked_for_every_engine():
    """Each engine leaves something of the family out: the walk is not empty anywhere."""
    assert {e.name for e, *_ in knob_pairs()} == {"mcore", "sharded"}  # torch has every knob
    assert {e.name for e, *_ in param_pairs()} == {e.name for e in FT.engines}


@pytest.mark.parametrize("engine, knob, value", knob_pairs(),
                         ids=lambda x: x.name if isinstance(x, EngineInfo) else str(x))
def test_a_knob_value_the_engine_cannot_honour_is_refused(engine, knob, value):
    msg = _refused(engine, {knob: value}, {})
    assert msg.startswith(f"{SOURCE}: {VAR}.{knob}: the finetune family's {engine.name} "
                          f"engine does not implement {knob}=")
    assert "\n" not in msg


@pytest.mark.parametrize("engine, param, value", param_pairs(),
                         ids=lambda x: x.name if isinstance(x, EngineInfo) else str(x))
def test_a_param_the_engine_cannot_honour_is_refused(engine, param, value):
    msg = _refused(engine, {}, {param: value})
    assert msg.startswith(f"{SOURCE}: {VAR}.params.{param}: ")
    assert "\n" not in msg


def test_every_engine_takes_its_own_params_and_knobs():
    """The other side of the walk: each engine's own fields and knob values load."""
    for e in FT.engines:
        for knob, values in e.supported_knobs.items():
            for value in list(values)[:3]:
                params = build_params(FT, {"backend": e.name}, SOURCE, f"{VAR}.params")
                assert check_knobs(FT, {knob: value}, SOURCE, VAR, params) == Knobs(
                    **{knob: value})


def test_null_says_an_inherited_param_is_not_this_engines():
    params = build_params(FT, {"backend": "mcore", "liger": None, "offload_budget_gib": None},
                          SOURCE, f"{VAR}.params")
    assert type(params).__name__ == "McoreParams"
    with pytest.raises(SpecError, match=r"params\.liger: unknown parameter of the finetune "
                                        r"family's mcore engine"):
        build_params(FT, {"backend": "mcore", "liger": []}, SOURCE, f"{VAR}.params")


def test_nemo_is_the_mcore_engines_alias_and_an_unknown_engine_is_refused():
    params = build_params(FT, {"backend": "nemo"}, SOURCE, f"{VAR}.params")
    assert params.backend == "mcore"
    with pytest.raises(SpecError, match=r"params\.backend: 'jax' is no engine of the finetune "
                                        r"family; its engines: torch, mcore \(alias nemo\), "
                                        r"sharded"):
        build_params(FT, {"backend": "jax"}, SOURCE, f"{VAR}.params")


def test_an_unknown_activation_offload_is_refused_not_mapped():
    with pytest.raises(SpecError, match=r"params\.activation_offload: expected one of async, "
                                        r"save_on_cpu, got str 'pinned'"):
        build_params(FT, {"activation_offload": "pinned"}, SOURCE, f"{VAR}.params")
    from hopperlab.workloads.finetune import FinetuneParams
    from hopperlab.workloads.finetune.torch.techniques import Techniques

    unchecked = FinetuneParams()
    object.__setattr__(unchecked, "activation_offload", "pinned")  # as a test's object might be
    with pytest.raises(ValueError, match="activation_offload: 'pinned' is not one of async"):
        Techniques(Knobs(offload="activations"), unchecked, "cpu", False)


@pytest.mark.parametrize("knob, value", [("precision", "fp8"), ("memory", "managed"),
                                         ("offload", "activations")])
def test_hopperlab_list_refuses_the_13b_sharded_variant_that_lied(tmp_path, capsys, knob,
                                                                  value):
    """The issue's ``probe-fp8``: it passed ``hopperlab list`` and ran bf16 under an fp8 name."""
    project = copy_project(tmp_path / "p")
    edit_yaml(project / SOURCE, lambda d: d["experiments"]["full-llama2-13b-sharded"]
              ["variants"].update({"probe": {"description": "x", knob: value}}))
    capsys.readouterr()
    assert main(["list", "--root", str(project)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err
    assert err.startswith(f"hopperlab: config error: {SOURCE}: "
                          f"experiments.full-llama2-13b-sharded.variants.probe.{knob}: "
                          f"the finetune family's sharded engine does not implement "
                          f"{knob}='{value}'"), err


def test_what_megatron_core_refuses_is_refused_at_load_not_in_the_job():
    """The contradictions the mcore engine met in the job before (issue 55): the default
    weights (pretrained), fp8, managed memory, CPU offloading with recompute."""
    assert "weights: expected one of random, got str 'pretrained'" in _refused(
        FT.engine_named("mcore"), {}, {"weights": "pretrained"})
    assert "precision: the finetune family's mcore engine does not implement" in _refused(
        FT.engine_named("nemo"), {"precision": "fp8"}, {})
    msg = _refused(FT.engine_named("mcore"), {"offload": "activations"}, {"checkpointing": True})
    assert msg == (f"{SOURCE}: {VAR}.offload: activations, but checkpointing: megatron-core "
                   f"refuses CPU offloading with activation recomputation")
    built = build_params(FT, {"backend": "mcore"}, SOURCE, f"{VAR}.params")
    check_variant(FT, check_knobs(FT, {"offload": "activations"}, SOURCE, VAR, built), built,
                  SOURCE, VAR)  # offloading alone: megatron-core's (TransformerEngine's) own
