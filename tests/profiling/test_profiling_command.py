"""The profiler's command line per knob combination, the site's profiling: block, and the
check that refuses profiler=nsys before submission where no nsys can be had."""

from __future__ import annotations

import os
import shlex
import stat
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from hopperlab.config.spec import (
    ContainerSettings,
    Resources,
    RunSpec,
    SiteSpec,
)
from hopperlab.backends.slurm import SlurmSettings
from hopperlab.core.errors import SpecError
from hopperlab.core.schema import validate_against_schema
from hopperlab.profiling import command
from hopperlab.profiling.command import (
    ProfilingSettings,
    check_profiler,
    profiler_prefix,
)
from hopperlab.run import launch
from hopperlab.workloads.base import Knobs
from hopperlab.workloads.membench import MembenchParams

REPO = Path(__file__).resolve().parents[2]


def make_spec(tmp_path: Path, *, profiler="nsys", memory="device", executor="local",
              nsys_path=None, image=None, setup=(), profiling=None) -> RunSpec:
    site_file = tmp_path / "site.yaml"
    site_file.write_text(yaml.safe_dump({"executor": executor,
                                         **({"profiling": profiling} if profiling else {})}))
    site = SiteSpec(name="t", executor=executor, poll_interval_s=0.2,
                    profiling=ProfilingSettings.from_mapping(profiling, str(site_file)),
                    settings={"slurm": SlurmSettings(setup=tuple(setup))},
                    container=ContainerSettings(image=image, runtime="apptainer" if image else None,
                                                image_file=f"/img/{image}.sif" if image else None),
                    tracking_uri="sqlite:///x.db", nsys_path=nsys_path, source=str(site_file),
                    assets_dir=str(tmp_path / "assets"))
    return RunSpec(family="membench", experiment="copy", variant="v", scale="smoke",
                   knobs=Knobs(profiler=profiler, memory=memory), params=MembenchParams(),
                   resources=Resources(gpus=1), site=site,
                   run_dir=str(tmp_path / "results" / "membench" / "copy" / "v"), baseline="v")


def fake_nsys(tmp_path: Path) -> str:
    path = tmp_path / "bin" / "nsys"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def opt(cmd: list[str], name: str) -> str | None:
    return cmd[cmd.index(name) + 1] if name in cmd else None


# --------------------------------------------------------------------------- command lines
@pytest.mark.parametrize("memory", ["device", "managed"])
@pytest.mark.parametrize("capture", ["cudaProfilerApi", "delay", "whole"])
@pytest.mark.parametrize("cpu_sampling", [False, True])
def test_nsys_command_for_each_knob_combination(tmp_path, memory, capture, cpu_sampling):
    delay = {"delay_s": 720, "duration_s": 360} if capture == "delay" else {}
    settings = ProfilingSettings(capture=capture, cpu_sampling=cpu_sampling, **delay)
    spec = make_spec(tmp_path, memory=memory, nsys_path="/opt/nsys/bin/nsys")
    run_dir = tmp_path / "run"
    cmd = profiler_prefix(spec, run_dir, "py", settings)
    sep = cmd.index("--")
    wrapper, nsys = cmd[:sep], cmd[sep + 1:]
    assert wrapper[:5] == ["py", "-m", "hopperlab.cli", "profile", "job"]
    assert opt(wrapper, "--run-dir") == str(run_dir.resolve())
    assert opt(wrapper, "--profiler") == "nsys" and opt(wrapper, "--nsys") == "/opt/nsys/bin/nsys"
    assert nsys[:2] == ["/opt/nsys/bin/nsys", "profile"]
    assert opt(nsys, "--trace") == "cuda,nvtx,cublas,cudnn"
    assert opt(nsys, "--sample") == ("cpu" if cpu_sampling else "none")
    assert opt(nsys, "--cpuctxsw") == ("process-tree" if cpu_sampling else "none")
    um = memory == "managed"
    assert (opt(nsys, "--cuda-um-cpu-page-faults") == "true") is um
    assert (opt(nsys, "--cuda-um-gpu-page-faults") == "true") is um
    assert (opt(nsys, "--capture-range") == "cudaProfilerApi") is (capture == "cudaProfilerApi")
    assert (opt(nsys, "--capture-range-end") == "stop") is (capture == "cudaProfilerApi")
    assert opt(nsys, "--delay") == ("720" if capture == "delay" else None)
    assert opt(nsys, "--duration") == ("360" if capture == "delay" else None)
    assert opt(nsys, "--output") == str(run_dir.resolve() / "artifacts" / "profile" / "report")


def test_no_profiler_no_prefix_and_torch_only_the_wrapper(tmp_path):
    assert profiler_prefix(make_spec(tmp_path, profiler="none"), tmp_path, "py") == []
    cmd = profiler_prefix(make_spec(tmp_path, profiler="torch"), tmp_path, "py")
    assert cmd[-1] == "--" and opt(cmd, "--profiler") == "torch"
    assert "nsys" not in cmd[cmd.index("job"):] and "--nsys" not in cmd  # no `nsys profile`


def test_site_profiling_block_reaches_the_command(tmp_path):
    spec = make_spec(tmp_path, nsys_path="nsys", profiling={
        "traces": "cuda,nvtx", "capture": "delay", "delay_s": 1.5, "gap_threshold_us": 250,
        "keep_sqlite": True, "extra_args": ["--gpu-metrics-devices=none"],
        "stats_reports": ["cuda_gpu_kern_sum"]})
    cmd = profiler_prefix(spec, tmp_path, "py")
    assert opt(cmd, "--trace") == "cuda,nvtx" and opt(cmd, "--delay") == "1.5"
    assert "--duration" not in cmd and "--capture-range" not in cmd
    assert opt(cmd, "--gap-threshold-us") == "250" and "--keep-sqlite" in cmd
    assert opt(cmd, "--report") == "cuda_gpu_kern_sum" and "--gpu-metrics-devices=none" in cmd


def test_site_schema_accepts_the_profiling_block_and_refuses_unknown_keys():
    schema = yaml.safe_load((REPO / "workflow/schemas/site.schema.yaml").read_text())
    validate_against_schema({"executor": "local", "profiling": {
        "capture": "delay", "delay_s": 720, "duration_s": 360, "cpu_sampling": True}},
        schema, "site.yaml")
    with pytest.raises(SpecError, match="profiling.sampling: unknown key"):
        validate_against_schema({"executor": "local", "profiling": {"sampling": True}},
                                schema, "site.yaml")
    with pytest.raises(SpecError, match="profiling.capture"):
        validate_against_schema({"executor": "local", "profiling": {"capture": "api"}},
                                schema, "site.yaml")


@pytest.mark.parametrize("block, message", [
    ({"capture": "delay"}, "needs delay_s"),
    ({"delay_s": 3}, "belong to capture: delay"),
    ({"capture": "always"}, "expected one of"),
    ({"trace": "cuda"}, "profiling.trace: unknown key"),
])
def test_bad_profiling_blocks_name_the_site_file(tmp_path, block, message):
    with pytest.raises(SpecError, match=message) as err:
        make_spec(tmp_path, profiling=block)
    assert str(tmp_path / "site.yaml") in str(err.value)


def test_the_site_file_is_read_once_into_the_site_spec(tmp_path, monkeypatch):
    """Issue 38: the site's resources, repeats and profiling block come with the one read of
    its file (load_site), not from later reads of it; spec.json keeps the profiling block
    only where the site has one, and reads it back."""
    from hopperlab.config import site as site_module
    from hopperlab.config.matrix import load_matrix
    from tests.helpers import copy_project, edit_yaml

    project = copy_project(tmp_path / "p")
    edit_yaml(project / "configs/sites/local.yaml",
              lambda d: d.update(profiling={"capture": "whole", "cpu_sampling": True},
                                 repeats={"smoke": 2, "full": 3}))
    reads = []
    real = site_module.load_yaml
    monkeypatch.setattr(site_module, "load_yaml", lambda path, what: (reads.append(path),
                                                                      real(path, what))[1])
    matrix = load_matrix(project, {"families": "selftest", "only": "selftest/trivial"})
    assert len(reads) == 1
    spec = matrix.get("selftest/trivial/ok")
    assert spec.repeats == 2 and spec.site.profiling.capture == "whole"
    assert command.site_settings(spec).cpu_sampling is True
    data = spec.to_dict()
    assert data["site"]["profiling"]["capture"] == "whole"
    assert "scale_resources" not in data["site"] and "scale_repeats" not in data["site"]
    assert RunSpec.from_dict(data).site.profiling == spec.site.profiling
    plain = load_matrix(REPO, {"families": "selftest", "only": "selftest/trivial"})
    assert "profiling" not in plain.get("selftest/trivial/ok").to_dict()["site"]


def test_job_python_puts_wrapper_and_nsys_inside_the_container(tmp_path, monkeypatch):
    runtime = tmp_path / "bin" / "apptainer"  # the site's runtime, found on PATH at submission
    runtime.parent.mkdir()
    runtime.write_text("#!/bin/sh\nexit 0\n")
    runtime.chmod(0o755)
    monkeypatch.setenv("PATH", f"{runtime.parent}:/usr/bin:/bin")
    spec = make_spec(tmp_path, image="pytorch", executor="slurm")
    line = shlex.split(launch.job_python(spec, Path(spec.run_dir)))
    exec_at = line.index("exec")
    wrapper_at = line.index("hopperlab.cli") - 2
    assert exec_at < wrapper_at, "the wrapper must run inside the container"
    assert line[wrapper_at] == "python"  # the container's python, not this machine's
    nsys_verb = line.index("profile", line.index("--", wrapper_at))  # after the wrapper's --
    assert line[nsys_verb - 1] == "nsys"  # the image's nsys, from its PATH
    assert line[-1] == "python"


def test_job_python_without_profiler_is_unchanged(tmp_path):
    spec = make_spec(tmp_path, profiler="none")
    assert shlex.split(launch.job_python(spec, Path(spec.run_dir))) == [sys.executable]


# --------------------------------------------------------------------------- the check
def test_check_refuses_nsys_where_there_is_none(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(SpecError, match=r"nsys_path: .*no nsys is on PATH"):
        check_profiler(make_spec(tmp_path))
    with pytest.raises(SpecError, match=r"nsys_path: /no/such/nsys is not an executable"):
        check_profiler(make_spec(tmp_path, nsys_path="/no/such/nsys"))
    with pytest.raises(SpecError, match=r"nsys_path: .*no slurm.setup"):
        check_profiler(make_spec(tmp_path, executor="slurm"))
    with pytest.raises(SpecError, match="executor debug"):
        check_profiler(make_spec(tmp_path, executor="debug", nsys_path=fake_nsys(tmp_path)))


def test_check_accepts_what_can_find_nsys(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    check_profiler(make_spec(tmp_path, nsys_path=fake_nsys(tmp_path)))
    check_profiler(make_spec(tmp_path, executor="slurm", setup=["module load nsight-systems"]))
    check_profiler(make_spec(tmp_path, executor="slurm", image="pytorch"))
    check_profiler(make_spec(tmp_path, profiler="torch", executor="debug"))
    check_profiler(make_spec(tmp_path, profiler="none"))
    monkeypatch.setenv("PATH", str(Path(fake_nsys(tmp_path)).parent) + os.pathsep
                       + os.environ["PATH"])
    check_profiler(make_spec(tmp_path))
    assert command.nsys_executable(make_spec(tmp_path)) == fake_nsys(tmp_path)


@pytest.mark.integration
def test_check_is_called_before_submission(tmp_path, monkeypatch):
    """hopperlab submit refuses before it writes anything into the run directory."""
    from hopperlab.config.spec import Matrix
    from hopperlab.run import submit as submission

    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    spec = make_spec(tmp_path)
    spec = replace(spec, run_dir="results/membench/copy/v")
    matrix = Matrix(runs={spec.key: spec}, config={"results_dir": "results"}, site=spec.site,
                    root=tmp_path)
    with pytest.raises(SpecError, match="nsys_path"):
        submission.submit(matrix, spec.key, log=lambda *_: None)
    assert not (tmp_path / "results").exists()
