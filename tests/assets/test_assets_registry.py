"""configs/assets.yaml: typed specs, validation naming file and key, inputs, fingerprints."""

from __future__ import annotations

import dataclasses
import re
import textwrap
from pathlib import Path

import pytest
import yaml

from hopperlab.assets import (
    asset_fingerprint,
    asset_inputs,
    asset_outputs,
    kinds,
    load_assets,
    load_scales,
)
from hopperlab.core.errors import SpecError

ROOT = Path(__file__).resolve().parents[2]


def _root(tmp_path: Path, text: str) -> Path:
    (tmp_path / "configs").mkdir(parents=True, exist_ok=True)
    (tmp_path / "configs" / "assets.yaml").write_text(textwrap.dedent(text))
    return tmp_path


def _error(tmp_path: Path, text: str) -> str:
    with pytest.raises(SpecError) as err:
        load_assets(_root(tmp_path, text))
    return str(err.value)


def test_the_repository_assets_load():
    specs = load_assets(ROOT)
    for name in ("tiny-llama", "tiny-tokenizer", "dolly-synthetic", "dolly-smoke-prepared",
                 "llama-2-7b", "llama-2-70b", "dolly-15k", "dolly-15k-prepared"):
        assert name in specs
    assert specs["llama-2-7b"].repo == "meta-llama/Llama-2-7b-hf"
    assert specs["llama-2-70b"].repo == "meta-llama/Llama-2-70b-hf"
    assert specs["dolly-15k"].repo == "databricks/databricks-dolly-15k"
    for spec in specs.values():
        if hasattr(spec, "revision"):
            assert re.fullmatch(r"[0-9a-f]{40}", spec.revision), spec.name
    scales = load_scales(ROOT)
    assert set(scales["smoke"]) >= {"tiny-llama", "dolly-smoke-prepared"}
    assert set(scales["full"]) >= {"llama-2-7b", "llama-2-70b", "dolly-15k-prepared"}


def test_inputs_and_outputs():
    assert asset_inputs("dolly-smoke-prepared", ROOT) == {"data": "dolly-synthetic",
                                                          "tokenizer": "tiny-tokenizer"}
    assert asset_inputs("tiny-llama", ROOT) == {"tokenizer": "tiny-tokenizer"}
    assert asset_inputs("llama-2-7b", ROOT) == {}
    assert asset_outputs("llama-2-7b", "results/assets") == \
        "results/assets/llama-2-7b/MANIFEST.sha256"


def test_fingerprint_follows_the_definition_only():
    specs = load_assets(ROOT)
    base = asset_fingerprint("dolly-smoke-prepared", specs)
    assert base == asset_fingerprint("dolly-smoke-prepared", load_assets(ROOT))

    def changed(name, **kw):
        return {**specs, name: dataclasses.replace(specs[name], **kw)}

    # where it comes from and what it is called do not matter ...
    assert asset_fingerprint("llama-2-7b", changed("llama-2-7b", local_path="/x")) == \
        asset_fingerprint("llama-2-7b", specs)
    assert asset_fingerprint("dolly-smoke-prepared",
                             changed("dolly-smoke-prepared", description="other")) == base
    # ... what it is does, and so do its inputs' definitions (the tokenizer keys the cache)
    assert asset_fingerprint("dolly-smoke-prepared",
                             changed("dolly-smoke-prepared", seq_len=256)) != base
    assert asset_fingerprint("dolly-smoke-prepared",
                             changed("tiny-tokenizer", vocab_size=600)) != base
    assert asset_fingerprint("llama-2-7b", specs, weights="random") != \
        asset_fingerprint("llama-2-7b", specs)


def test_schema_mirrors_the_spec_dataclasses():
    schema = yaml.safe_load((ROOT / "workflow/schemas/assets.schema.yaml").read_text())
    registry = kinds()
    hidden = {"name", "source", "root"}
    for name, kind in registry.items():
        if name not in schema["$defs"]:
            continue  # a kind registered elsewhere (tests): checked by its dataclass
        fields = {f.name for f in dataclasses.fields(kind.spec)} - hidden
        assert set(schema["$defs"][name]["properties"]) == fields, name
        assert schema["$defs"][name]["additionalProperties"] is False
    listed = {c["if"]["properties"]["kind"]["const"] for c in schema["$defs"]["asset"]["allOf"]}
    assert listed == {"hf-model", "hf-tokenizer", "hf-dataset", "tiny-tokenizer", "tiny-llama",
                      "dolly-synthetic", "dolly-prepared", "generated-table"}


HUB = """
assets:
  m:
    kind: hf-model
    repo: owner/model
{extra}
"""


@pytest.mark.parametrize("extra, expected", [
    ("", "configs/assets.yaml: assets.m.revision: required: the 40-hex commit id of owner/model"),
    ("    revision: main", "configs/assets.yaml: assets.m.revision: expected a 40-hex commit id "
                           "of owner/model, got 'main'"),
    ("    revision: " + "a" * 40 + "\n    weights: random",
     "configs/assets.yaml: assets.m.architecture: required with weights: random"),
    ("    revision: " + "a" * 40 + "\n    architecture: models/none.json",
     "configs/assets.yaml: assets.m.architecture: no such file 'models/none.json'"),
    ("    revision: " + "a" * 40 + "\n    weights: trained",
     "configs/assets.yaml: assets.m.weights: 'trained' is not one of"),
    ("    revision: " + "a" * 40 + "\n    token: hf_abc",
     "configs/assets.yaml: assets.m.token: unknown key; expected one of: architecture, "
     "description, files, kind, local_path, repo, revision, weights"),
])
def test_hub_mistakes_name_file_and_key(tmp_path, extra, expected):
    assert expected in _error(tmp_path, HUB.format(extra=extra))


def test_other_mistakes(tmp_path):
    assert "assets.x.kind: unknown kind 'nope'; expected one of:" in _error(tmp_path, """
        assets:
          x: {kind: nope}
        """)
    assert "assets.p.tokenizer: unknown asset 'missing'" in _error(tmp_path, """
        assets:
          d: {kind: dolly-synthetic}
          p: {kind: dolly-prepared, data: d, tokenizer: missing}
        """)
    assert ("assets.p.tokenizer: 'd' is of kind 'dolly-synthetic'; expected an asset of kind "
            "hf-tokenizer or hf-model or tiny-tokenizer or tiny-llama") in _error(tmp_path, """
        assets:
          d: {kind: dolly-synthetic}
          p: {kind: dolly-prepared, data: d, tokenizer: d}
        """)
    assert "assets.u.columns.a.type: 'dates' is not one of" in _error(tmp_path, """
        assets:
          u: {kind: generated-table, rows: 3, columns: {a: {type: dates}}}
        """)
    assert "assets.u.columns.a: expected numbers low < high" in _error(tmp_path, """
        assets:
          u: {kind: generated-table, rows: 3, columns: {a: {type: int, low: 5, high: 3}}}
        """)
    assert "assets.m.repo: expected a Hub repository id 'owner/name', got 'nope'" in _error(
        tmp_path, f"""
        assets:
          m: {{kind: hf-model, repo: nope, revision: {'a' * 40}}}
        """)
    assert "scales.smoke[0]: unknown asset 'ghost'" in _error(tmp_path, """
        scales: {smoke: [ghost]}
        assets:
          d: {kind: dolly-synthetic}
        """)
    assert "assets.d.records: -1 is less than the minimum of 1" in _error(tmp_path, """
        assets:
          d: {kind: dolly-synthetic, records: -1}
        """)
    assert "configs/assets.yaml: assets: 'Bad_Name' does not match" in _error(tmp_path, """
        assets:
          Bad_Name: {kind: dolly-synthetic}
        """)


def test_cycles_are_refused(tmp_path):
    from hopperlab.assets.registry import AssetKind, AssetSpec, KINDS, register_kind

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class LoopSpec(AssetSpec):
        after: str | None = None

    register_kind(AssetKind(name="loop", spec=LoopSpec, build=lambda s, c: None,
                            input_kinds={"after": ("loop",)}))
    try:
        text = _error(tmp_path, """
            assets:
              a: {kind: loop, after: b}
              b: {kind: loop, after: a}
            """)
        assert "assets are built from each other: a -> b -> a" in text
        # a kind the schema does not list is checked by its dataclass
        assert "assets.a.other: unknown key for kind 'loop'; expected one of: after, " \
               "description, kind" in _error(tmp_path, """
            assets:
              a: {kind: loop, other: 1}
            """)
        assert "assets.a.after: expected str | None, got int 3" in _error(tmp_path, """
            assets:
              a: {kind: loop, after: 3}
            """)
    finally:
        KINDS.pop("loop")


# --------------------------------------------------------------------------- asset_substitutes
OFFLINE = {"dolly-15k": "dolly-synthetic", "llama-2-tokenizer": "tiny-tokenizer"}


def test_a_substitute_replaces_inputs_of_derived_assets_under_a_new_name():
    from hopperlab.assets.registry import apply_substitutes

    real = load_assets(ROOT)
    specs, renames = apply_substitutes(real, OFFLINE)
    derived = renames["dolly-15k-prepared-2048"]
    # a new folder and fingerprint: a cached asset built from the real inputs is never reused
    assert derived != "dolly-15k-prepared-2048" and derived.startswith("dolly-15k-prepared-2048.")
    assert asset_inputs(derived, specs) == {"data": "dolly-synthetic", "tokenizer": "tiny-tokenizer"}
    assert asset_fingerprint(derived, specs) != asset_fingerprint("dolly-15k-prepared-2048", real)
    assert renames["dolly-15k"] == "dolly-synthetic" and renames["tiny-llama"] == "tiny-llama"
    # the same name however the assets were loaded (Snakemake's rules and the job agree)
    assert derived in load_assets(ROOT, OFFLINE)


def test_a_substitute_of_the_wrong_kind_is_refused_naming_the_config_key():
    from hopperlab.assets.registry import apply_substitutes

    with pytest.raises(SpecError) as err:
        apply_substitutes(load_assets(ROOT), {"llama-2-tokenizer": "dolly-synthetic"})
    assert "asset_substitutes" in str(err.value) and "tokenizer" in str(err.value)
