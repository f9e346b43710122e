"""The family contract (workloads/base.py): what a family's ``run(spec, recorder)`` reads and
calls is what config's RunSpec, core's Recorder and ``fake_run`` provide, and every family's
entry is typed with it."""

from __future__ import annotations

import importlib
import inspect

import pytest

from hopperlab.config.matrix import load_matrix
from hopperlab.core.errors import AssetMissing
from hopperlab.core.rundir import Recorder
from hopperlab.workloads import FAMILY_MODULES, family_info
from hopperlab.workloads.base import (ContainerView, Knobs, Recording, ResourcesView, RunView,
                                      SiteView, fake_run)
from hopperlab.workloads.prediction import PredictModel
from tests.helpers import REPO


def _views(spec) -> None:
    assert isinstance(spec, RunView)
    assert isinstance(spec.site, SiteView) and isinstance(spec.site.container, ContainerView)
    assert isinstance(spec.resources, ResourcesView) and isinstance(spec.knobs, Knobs)


def test_every_resolved_run_is_a_run_view():
    for spec in load_matrix(REPO).runs.values():
        _views(spec)


def test_the_recorder_is_a_recording(tmp_path):
    assert isinstance(Recorder(tmp_path / "run"), Recording)


def test_fake_run_is_a_complete_run_view(tmp_path):
    spec = fake_run({"x": 1}, run_dir=tmp_path, gpus=2, assets={"model": tmp_path / "m"},
                    family="membench", experiment="copy", variant="v", memory="managed")
    _views(spec)
    assert spec.key == "membench/copy/v" and spec.knobs == Knobs(memory="managed")
    assert spec.resources.gpus == 2 and spec.repeats == 1 and spec.scale == "smoke"
    assert spec.asset_path("model") == tmp_path / "m"
    with pytest.raises(AssetMissing, match="'data'"):
        spec.asset_path("data")
    with pytest.raises(TypeError):
        fake_run(memroy="managed")  # a knob that does not exist is a mistake, not a default


@pytest.mark.parametrize("family", sorted(FAMILY_MODULES))
def test_every_family_entry_is_typed_with_the_contract(family):
    """Each engine's entry (a family without engines is one): the run it sees is a RunView,
    typed by the engine's own params class where it says one (``RunView[TorchParams]``)."""
    pytest.importorskip("torch")
    info = family_info(family)
    for engine in info.engines or (info.engine_named(None),):
        params = list(inspect.signature(engine.load_entry()).parameters.values())
        names = {engine.params.__name__, *(k for k, v in vars(
            importlib.import_module(engine.entry.partition(":")[0])).items()
            if v is engine.params)}
        assert str(params[0].annotation) in {"RunView", *(f"RunView[{n}]" for n in names)}, \
            engine.name
        assert str(params[1].annotation) == "Recording"


@pytest.mark.parametrize("family", sorted(FAMILY_MODULES))
def test_a_familys_prediction_model_loads_and_predicts_figures_it_declares(family):
    info = family_info(family)
    model = info.load_predict()
    if model is None:
        assert family == "selftest"  # the platform's own test family predicts nothing
        return
    assert isinstance(model, PredictModel) and model.metrics
    assert set(model.metrics) <= set(info.directions)  # which way is better: declared
