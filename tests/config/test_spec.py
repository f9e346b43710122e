"""Config mistakes stop everything before submission, naming the file, the key and the fix."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hopperlab.cli.workflow import check_container_runtime, run_key
from hopperlab.config.matrix import load_matrix
from hopperlab.config.spec import RunSpec
from hopperlab.core.errors import SpecError
from hopperlab.results.tracking import flatten
from tests.helpers import REPO, copy_project, edit_yaml, snakemake


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return copy_project(tmp_path / "project")


def _error(project: Path, **overrides) -> str:
    with pytest.raises(SpecError) as info:
        load_matrix(project, overrides)
    return str(info.value)


@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
def test_default_matrix_resolves_every_variant_at_both_scales():
    for scale in ("smoke", "full"):
        matrix = load_matrix(REPO, {"scale": scale})
        assert "membench/copy/h2d-pinned" in matrix.runs
        assert "membench/alloc/managed" in matrix.runs
        spec = matrix.runs["membench/alloc/managed"]
        assert spec.knobs.memory == "managed" and spec.scale == scale
        assert spec.run_dir == "results/membench/alloc/managed"
    smoke = load_matrix(REPO, {"scale": "smoke"}).runs["membench/copy/h2d-pinned"]
    full = load_matrix(REPO, {"scale": "full"}).runs["membench/copy/h2d-pinned"]
    assert max(full.params.sizes_mb) > max(smoke.params.sizes_mb)
    assert full.resources.gpus == 1


def test_spec_round_trips_through_json_form():
    spec = load_matrix(REPO).runs["membench/copy/bidir-pinned"]
    again = RunSpec.from_dict(spec.to_dict())
    assert again == spec
    flat = flatten(spec.to_dict())
    assert flat["knobs.memory"] == "device" and flat["params.sizes_mb"] == "[1, 8, 32]"


def test_unknown_key_in_experiments_names_file_and_key_path(project):
    edit_yaml(project / "experiments/membench.yaml",
              lambda d: d["experiments"]["copy"]["variants"]["h2d-pinned"].update(memroy="device"))
    msg = _error(project)
    assert "experiments/membench.yaml" in msg
    assert "experiments.copy.variants.h2d-pinned.memroy: unknown key" in msg
    assert "memory" in msg  # what was expected


def test_unknown_parameter_and_wrong_type_are_refused(project):
    path = project / "experiments/membench.yaml"
    edit_yaml(path, lambda d: d["experiments"]["copy"]["variants"]["h2d-pinned"]["params"]
              .update(direcion="h2d"))
    msg = _error(project)
    assert "experiments.copy.variants.h2d-pinned.params.direcion: unknown parameter" in msg
    edit_yaml(path, lambda d: d["experiments"]["copy"]["variants"]["h2d-pinned"]["params"]
              .pop("direcion"))
    edit_yaml(path, lambda d: d["experiments"]["copy"]["scales"]["smoke"]["params"]
              .update(repeats="three"))
    msg = _error(project)
    assert "params.repeats: expected int" in msg and "'three'" in msg


def test_unsupported_knob_and_unknown_knob_value(project):
    path = project / "experiments/membench.yaml"
    edit_yaml(path, lambda d: d["experiments"]["copy"]["variants"]["h2d-pinned"]
              .update(offload="activations"))
    msg = _error(project)
    assert "membench family does not support the knob 'offload'" in msg
    assert "experiments.copy.variants.h2d-pinned.offload" in msg
    edit_yaml(path, lambda d: d["experiments"]["copy"]["variants"]["h2d-pinned"]
              .update(offload="none", memory="mananged"))
    edit_yaml(path, lambda d: d["experiments"]["copy"]["variants"]["h2d-pinned"].pop("offload"))
    msg = _error(project)
    assert "experiments.copy.variants.h2d-pinned.memory" in msg and "mananged" in msg


def test_baseline_must_be_a_variant(project):
    edit_yaml(project / "experiments/membench.yaml",
              lambda d: d["experiments"]["copy"].update(baseline="nope"))
    assert "experiments.copy.baseline: 'nope' is not one of its variants" in _error(project)


def test_unknown_site_family_scale_and_site_typo(project):
    assert "no site file" in _error(project, site="nowhere")
    assert "local" in _error(project, site="nowhere")  # the known sites are listed
    assert "unknown family 'membnech'" in _error(project, families="membnech")
    assert "scale" in _error(project, scale="huge")
    edit_yaml(project / "configs/sites/local.yaml", lambda d: d.update(excutor="local"))
    msg = _error(project)
    assert "configs/sites/local.yaml" in msg and "excutor: unknown key" in msg


def test_unknown_target_names_what_exists():
    matrix = load_matrix(REPO)

    class WC:
        family, experiment, variant = "membench", "copy", "h2d-pinnned"

    with pytest.raises(SpecError) as info:
        run_key(matrix, WC)
    assert "has no variant 'h2d-pinnned'" in str(info.value) and "h2d-pinned" in str(info.value)


@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
def test_only_selects_a_subset_and_refuses_an_empty_selection(project):
    matrix = load_matrix(project, {"only": "membench/copy"})
    assert matrix.runs and all(k.startswith("membench/copy/") for k in matrix.runs)
    assert "selects no run" in _error(project, only="membench/nothing")


@pytest.mark.integration
def test_snakemake_stops_before_submitting_on_a_typo(project):
    edit_yaml(project / "experiments/membench.yaml",
              lambda d: d["experiments"]["alloc"].update(varaints={}))
    out = snakemake(["--cores", "1"], project)
    assert out.returncode != 0
    text = out.stdout + out.stderr
    assert "experiments/membench.yaml" in text and "experiments.alloc.varaints" in text
    assert not (project / "results").exists()  # nothing was submitted


@pytest.mark.integration
def test_snakemake_rejects_unknown_target_variant(project):
    out = snakemake(["--cores", "1", "results/membench/copy/h2d-pinnned/metrics.json"], project)
    assert out.returncode != 0
    assert "has no variant 'h2d-pinnned'" in out.stdout + out.stderr


@pytest.mark.integration
def test_container_site_without_a_runtime_is_refused_before_submission(project, monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no apptainer or singularity here
    edit_yaml(project / "configs/sites/local.yaml", lambda d: d.update(container="pytorch"))
    with pytest.raises(SpecError) as info:  # the workflow's check on the submitting side
        check_container_runtime(load_matrix(project))
    msg = str(info.value)
    assert "configs/sites/local.yaml" in msg and "container" in msg
    assert "apptainer" in msg and "singularity" in msg
    out = snakemake(["-n", "--cores", "1"], project)  # refused before any job
    assert out.returncode != 0 and "apptainer" in out.stdout + out.stderr


def test_loading_the_spec_never_looks_at_the_machine(project, monkeypatch):
    """Rule 4: no PATH lookup and no git while a spec loads (the submitting side does both)."""
    import shutil
    import subprocess

    def forbidden(*args, **kwargs):
        raise AssertionError(f"the spec looked at the machine: {args!r}")

    edit_yaml(project / "configs/sites/local.yaml", lambda d: d.update(container="pytorch"))
    monkeypatch.setattr(shutil, "which", forbidden)
    monkeypatch.setattr(subprocess, "run", forbidden)
    monkeypatch.setattr(subprocess, "Popen", forbidden)
    matrix = load_matrix(project, {"scale": "full"})
    spec = matrix.runs["membench/copy/h2d-pinned"]
    assert spec.site.container.runtime == "auto" and spec.git_commit is None


def test_container_site_wraps_the_job_python(project, tmp_path, monkeypatch):
    import shlex

    from hopperlab.run.launch import job_python

    fake = tmp_path / "bin" / "apptainer"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:/usr/bin:/bin")
    edit_yaml(project / "configs/sites/local.yaml", lambda d: d.update(container="pytorch"))
    for scale, nv in (("smoke", []), ("full", ["--nv"])):
        spec = load_matrix(project, {"scale": scale}).runs["membench/copy/h2d-pinned"]
        run_dir = project / spec.run_dir
        argv = shlex.split(job_python(spec, run_dir))
        assert argv == ["apptainer", "exec", *nv, "--bind",
                        f"{(project / 'results').resolve()},{(project / 'assets').resolve()}",
                        str(project / "containers" / "pytorch.sif"), "python"]


def test_profiler_override_sets_every_selected_run():
    matrix = load_matrix(REPO, {"scale": "full", "profiler": "nsys",
                                "only": "finetune/lora-llama2-7b,membench/copy"})
    assert matrix.runs and {s.knobs.profiler for s in matrix.runs.values()} == {"nsys"}
    plain = load_matrix(REPO, {"scale": "full", "only": "membench/copy"})
    assert {s.knobs.profiler for s in plain.runs.values()} == {"none"}


def test_profiler_override_with_an_unknown_value_is_refused(project):
    assert "profiler" in _error(project, profiler="nsight")


def test_asset_substitutes_replace_names_in_every_run():
    subs = "dolly-15k:dolly-synthetic,llama-2-tokenizer:tiny-tokenizer"
    for form in (subs, {"dolly-15k": "dolly-synthetic", "llama-2-tokenizer": "tiny-tokenizer"}):
        matrix = load_matrix(REPO, {"scale": "full", "asset_substitutes": form,
                                    "only": "finetune/lora-llama2-7b/baseline"})
        spec = matrix.runs["finetune/lora-llama2-7b/baseline"]
        assert spec.assets == {"model": "llama-2-7b-random", "records": "dolly-synthetic",
                               "tokenizer": "tiny-tokenizer"}


def test_asset_substitutes_refuse_unknown_names_and_bad_pairs(project):
    msg = _error(project, asset_substitutes="dolly-15k:dolly-synthtic")
    assert "asset_substitutes.dolly-15k" in msg and "'dolly-synthtic'" in msg
    assert "NAME:SUBSTITUTE" in _error(project, asset_substitutes="dolly-15k")


def test_config_args_forward_profiler_and_substitutes_to_the_job():
    from hopperlab.cli.workflow import config_args
    from hopperlab.config.matrix import parse_overrides

    config = {"site": "local", "scale": "full", "results_dir": "r", "families": ["finetune"],
              "only": ["finetune/lora-llama2-7b/baseline"], "profiler": "torch",
              "asset_substitutes": {"dolly-15k": "dolly-synthetic"}}
    words = config_args(config, REPO).split()
    assert "profiler=torch" in words and "asset_substitutes=dolly-15k:dolly-synthetic" in words
    assert "asset_substitutes" not in config_args({**config, "asset_substitutes": {}}, REPO)
    again = load_matrix(REPO, parse_overrides(words))
    spec = again.runs["finetune/lora-llama2-7b/baseline"]
    assert spec.knobs.profiler == "torch" and spec.assets["records"] == "dolly-synthetic"


# --------------------------------------------------------------------------- hostile input
def _bomb(levels: int = 6) -> str:
    """A "billion laughs" YAML block: alias ``&l{levels}`` stands for 10**levels strings."""
    lines = ["bomb0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"bomb{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("rel, key, value", [
    ("experiments/membench.yaml", "description", "*l6"),
    ("configs/sites/local.yaml", "executor", "*l6"),
    ("configs/assets.d/finetune.yaml", "scales", "{smoke: *l6}"),
])
def test_yaml_alias_bomb_is_refused_naming_the_file(project, rel, key, value):
    """An alias expanding to a million values is refused when loading, before any check
    builds a message from it (before: the message quoted all of it, megabytes)."""
    path = project / rel
    text = path.read_text() if key != "scales" else "assets: {}\nscales: {}\n"
    text = re.sub(rf"^{key}:.*$", f"{key}: {value}", text, count=1, flags=re.M)
    path.write_text(_bomb() + text)
    msg = _error(project)
    assert rel in msg and "aliases (*name) expand to more than" in msg
    assert len(msg) < 1000


def test_yaml_merge_key_bomb_and_self_alias_are_refused():
    from hopperlab.core.schema import safe_load_yaml

    merge = "m0: &m0 {x: 1}\n" + "".join(
        f"m{i}: &m{i} {{<<: [*m{i - 1}, *m{i - 1}]}}\n" for i in range(1, 40))
    for text in (merge, "a: &a [*a]\n"):
        with pytest.raises(SpecError, match="aliases"):
            safe_load_yaml(text, "some.yaml")
    assert safe_load_yaml("a: &a [1, 2]\nb: *a\nc: {<<: {d: 3}}\n", "ok.yaml") == \
        {"a": [1, 2], "b": [1, 2], "c": {"d": 3}}


@pytest.mark.integration
def test_snakemake_refuses_an_alias_bomb_in_the_config_file(project):
    """Snakemake's own `configfile:` loader expands aliases: hopperlab reads the file first."""
    path = project / "configs/config.yaml"
    kept = "\n".join(line for line in path.read_text().splitlines()
                     if not line.startswith("only:"))
    path.write_text(_bomb() + kept + "\nonly: *l6\n")
    out = snakemake(["-n", "--cores", "1"], project, timeout=600)
    text = out.stdout + out.stderr
    assert out.returncode != 0
    assert "configs/config.yaml" in text and "aliases (*name) expand to more than" in text
    assert len(text) < 5000


def test_error_messages_cut_long_values_short(project, tmp_path):
    """`--config site=/etc/passwd` quoted the whole file; a value is shown cut to ~100 chars."""
    big = tmp_path / "big.txt"
    big.write_text("x" * 10_000)
    msg = _error(project, site=str(big))
    assert "xxxxx" in msg and "x" * 101 not in msg and "…" in msg
    msg = _error(project, only="membench/" + "y" * 5000)
    assert "y" * 101 not in msg and "selects no run" in msg


def _add_variant(project: Path, name: str) -> None:
    edit_yaml(project / "experiments/membench.yaml",
              lambda d: d["experiments"]["copy"]["variants"].update(
                  {name: {"params": {"direction": "h2d", "host_memory": "pinned"}}}))


@pytest.mark.integration
def test_over_long_variant_name_is_refused_at_spec_time(project):
    """A 300-character variant passed `list` and `-n`, then failed with File name too long."""
    name = "v" * 300
    _add_variant(project, name)
    msg = _error(project)
    assert "experiments/membench.yaml" in msg and "experiments.copy.variants.vvv" in msg
    assert "300 bytes long" in msg and "at most 255" in msg
    out = snakemake(["-n", "--cores", "1", "--config", "only=membench/copy"], project)
    assert out.returncode != 0 and "300 bytes long" in out.stdout + out.stderr


def test_run_directory_and_results_dir_must_fit_in_a_path(project):
    deep = "/".join(["d" * 200] * 20)  # every name fits; the whole path does not
    msg = _error(project, results_dir=deep)
    assert "experiments/membench.yaml: experiments.copy.variants.h2d-pageable" in msg
    assert "-byte path" in msg
    msg = _error(project, results_dir="r" * 256)
    assert "results_dir" in msg and "256 bytes long" in msg


def test_over_long_asset_name_is_refused(project):
    path = project / "configs/assets.yaml"
    name = "a" * 250
    edit_yaml(path, lambda d: d["assets"].update({name: dict(d["assets"]["tiny-tokenizer"])}))
    msg = _error(project)
    assert "configs/assets.yaml: assets.aaa" in msg and "250 bytes long" in msg


@pytest.mark.integration
def test_snakemake_names_an_unknown_config_key_in_one_line(project):
    """Snakemake's `validate` printed its whole 68-line schema for one unknown key."""
    out = snakemake(["-n", "--cores", "1", "--config", "sacle=full"], project)
    text = out.stdout + out.stderr
    assert out.returncode != 0
    assert ("configs/config.yaml (with --config overrides): sacle: unknown key; expected one "
            "of: asset_substitutes, families, only, processes, profiler, repeats, results_dir, "
            "scale, site") in text
    assert "Failed validating" not in text and "'properties'" not in text


def test_lora_fp8_is_compared_with_bf16_compiled_alike():
    runs = load_matrix(REPO, {"only": "finetune/lora-llama2-7b"}).runs
    reference = runs["finetune/lora-llama2-7b/bf16-compile"]
    fp8 = runs["finetune/lora-llama2-7b/fp8"]
    assert reference.knobs.precision == "bf16" and reference.params.compile
    assert fp8.compare_to == "bf16-compile" and fp8.baseline == "baseline"
    assert runs["finetune/lora-llama2-7b/workers-4"].compare_to is None  # the baseline
    assert RunSpec.from_dict(fp8.to_dict()) == fp8
    assert "compare_to" not in runs["finetune/lora-llama2-7b/workers-4"].to_dict()


@pytest.mark.parametrize("name", ["bf16-compil", "fp8"])
def test_compare_to_an_unknown_variant_or_itself_is_refused_naming_file_and_key(project, name):
    edit_yaml(project / "experiments/finetune.yaml", lambda d: d["experiments"]["lora-llama2-7b"]
              ["variants"]["fp8"].update(compare_to=name))
    msg = _error(project)
    assert "experiments/finetune.yaml" in msg and f"{name!r}" in msg
    assert "experiments.lora-llama2-7b.variants.fp8.compare_to" in msg


@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
def test_a_large_experiments_file_without_aliases_is_no_alias_bomb(tmp_path):
    """Issue 28 item 10: a legitimate 10,000-variant experiments file was refused as an alias
    bomb (its written size passed the expansion limit)."""
    from hopperlab.core.schema import check_expansion, safe_load_yaml, value_children

    variants = "".join(f"      v{i}: {{params: {{action: ok, steps: {i % 7}}}, "
                       f"description: variant number {i}}}\n" for i in range(10_000))
    text = ("experiments:\n  many:\n    description: ten thousand variants\n"
            "    baseline: v0\n    variants:\n" + variants)
    data = safe_load_yaml(text, "experiments/selftest.yaml")
    assert len(data["experiments"]["many"]["variants"]) == 10_000
    check_expansion(data, value_children, "experiments/selftest.yaml")  # as loaded, too
    with pytest.raises(SpecError, match="aliases"):  # a bomb beside it is still one
        safe_load_yaml(_bomb() + text, "experiments/selftest.yaml")
