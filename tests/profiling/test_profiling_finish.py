"""The step after the profiled process: the wrapper, nsys stats/export, metrics into the record.

nsys is not on CI machines: a stand-in ``nsys`` answers the four calls the wrapper makes
(``--version``, ``export``, ``stats --help-reports``, ``stats --report``) with files that a real
nsys 2025.3 wrote on the lent H100 (tests/fixtures/profiling/); ``profile`` just runs the
command it wraps. What is tested is hopperlab's side: the calls, where files land, the record.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from hopperlab.core.rundir import Recorder, load_record, write_json_atomic
from hopperlab.profiling.finish import (
    SUMMARY_FILE,
    TRIMMED_SQLITE,
    amend_record,
    finish_profile,
)

FIX = Path(__file__).parents[1] / "fixtures" / "profiling"
REPO = Path(__file__).resolve().parents[2]


def stand_in_nsys(tmp_path: Path, export: Path, csv_dir: Path) -> Path:
    script = tmp_path / "nsys"
    script.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import shutil, subprocess, sys
        from pathlib import Path
        args = sys.argv[1:]
        def opt(name):
            return args[args.index(name) + 1]
        if args == ["--version"]:
            print("NVIDIA Nsight Systems version 2025.3.1.0 (stand-in)")
        elif args[0] == "profile":
            rc = subprocess.call(args[args.index("--output") + 2:])
            Path(opt("--output") + ".nsys-rep").write_bytes(b"stand-in report")
            sys.exit(rc)
        elif args[0] == "export":
            assert args[-1].endswith(".nsys-rep") and opt("--type") == "sqlite"
            shutil.copy({str(export)!r}, opt("--output"))
        elif args[:2] == ["stats", "--help-reports"]:
            print(Path({str(FIX / "nsys-2025.3.1-help-reports.txt")!r}).read_text())
        elif args[0] == "stats":
            assert args[-1].endswith(".sqlite") and opt("--format") == "csv"
            src = Path({str(csv_dir)!r}) / (opt("--report") + ".csv")
            if src.exists():
                shutil.copy(src, opt("--output") + "_" + opt("--report") + ".csv")
        else:
            sys.exit(f"stand-in nsys: unexpected {{args}}")
        """))
    script.chmod(0o755)
    return script


APP = textwrap.dedent("""\
    import sys
    from hopperlab.core.rundir import Recorder
    rec = Recorder(sys.argv[1], identity={"key": "t/e/v"})
    rec.log_metric("work_done", 1.0)
    rec.finish("ok")
    sys.exit(int(sys.argv[2]))
    """)


def run_wrapper(tmp_path: Path, nsys: Path, exit_code: int = 0) -> tuple[int, Path]:
    run_dir = tmp_path / "run"
    app = tmp_path / "app.py"
    app.write_text(APP)
    report = run_dir / "artifacts" / "profile" / "report"
    report.parent.mkdir(parents=True)
    cmd = [sys.executable, "-m", "hopperlab.cli", "profile", "job", "--run-dir", str(run_dir),
           "--profiler", "nsys", "--nsys", str(nsys), "--",
           str(nsys), "profile", "--output", str(report), sys.executable, str(app),
           str(run_dir), str(exit_code)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin"})
    assert "[hopperlab.profiling]" in out.stderr, out.stderr
    return out.returncode, run_dir


@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
def test_wrapper_finishes_an_nsys_profile_into_the_record(tmp_path):
    nsys = stand_in_nsys(tmp_path, FIX / "trainloop__loop__w0-managed-nsys.sqlite",
                         FIX / "csv-trainloop-w0-managed-nsys")
    rc, run_dir = run_wrapper(tmp_path, nsys)
    assert rc == 0
    rec = load_record(run_dir)
    assert rec["metrics"]["work_done"] == 1.0  # the job's own metrics stay
    assert rec["metrics"]["prof_kernels"] == 880
    assert rec["metrics"]["prof_um_share"] > 0
    assert rec["tags"]["prof.nsys_version"].startswith("NVIDIA Nsight Systems version 2025.3.1")
    assert json.loads((run_dir / "metrics.json").read_text()) == rec
    profile = run_dir / "artifacts" / "profile"
    names = {p.name for p in profile.iterdir()}
    assert {"report.nsys-rep", TRIMMED_SQLITE, SUMMARY_FILE, "cuda_gpu_kern_sum.csv",
            "nvtx_sum.csv", "um_total_sum.csv"} <= names
    assert "report.sqlite" not in names  # the full export is not kept by default
    summary = json.loads((profile / SUMMARY_FILE).read_text())
    assert summary["reports_missing"] == [] and summary["top_kernels"][0]["count"] > 0
    assert "cuda_gpu_mem_size_sum" in summary["reports"]


@pytest.mark.integration  # runs for seconds: a workload, processes or a subprocess
def test_wrapper_keeps_the_job_exit_status_and_reports_reports_without_data(tmp_path):
    nsys = stand_in_nsys(tmp_path, FIX / "trainloop__loop__w4-device-nsys.sqlite",
                         FIX / "csv-trainloop-w4-device-nsys")
    rc, run_dir = run_wrapper(tmp_path, nsys, exit_code=3)
    assert rc == 3
    summary = json.loads((run_dir / "artifacts/profile" / SUMMARY_FILE).read_text())
    assert "um_sum" in summary["reports_without_data"]  # no unified memory in this run
    assert load_record(run_dir)["metrics"]["prof_gpu_idle_gaps"] > 0


def test_a_missing_report_is_a_tag_not_a_failure(tmp_path):
    run_dir = tmp_path / "run"
    Recorder(run_dir).finish("ok")
    summary = finish_profile(run_dir, "nsys", nsys="/no/nsys")
    assert "nsys wrote no report.nsys-rep" in summary["error"]
    assert "prof.error" in load_record(run_dir)["tags"]
    skipped = tmp_path / "skipped"
    Recorder(skipped).finish("skipped", "no GPU")
    summary = finish_profile(skipped, "torch")
    assert "error" not in summary and "skipped" in summary["note"]
    assert "prof.error" not in load_record(skipped)["tags"]


def test_a_stale_record_is_not_amended(tmp_path):
    Recorder(tmp_path, attempt=1).finish("ok")
    write_json_atomic(tmp_path / "spec.json", {"attempt": 2})
    assert amend_record(tmp_path, {"prof_x": 1.0}, {}) is False
    assert "prof_x" not in load_record(tmp_path)["metrics"]


@pytest.mark.integration
def test_in_process_torch_profile_of_a_membench_run(tmp_path):
    """hopperlab run (debug executor): the launcher finishes a torch profile itself."""
    pytest.importorskip("torch")
    from hopperlab.run import launch, runner
    from hopperlab.workloads.base import Knobs
    from hopperlab.workloads.membench import MembenchParams
    from tests.profiling.test_profiling_command import make_spec

    spec = make_spec(tmp_path, profiler="torch", executor="debug")
    spec = replace(spec, knobs=Knobs(profiler="torch"), resources=replace(spec.resources, gpus=0),
                   params=MembenchParams(test="copy", host_memory="pageable", sizes_mb=(1,),
                                         repeats=1, warmup=0))
    run_dir = Path(spec.run_dir)
    data = spec.to_dict()
    data["attempt"] = 1
    write_json_atomic(run_dir / "spec.json", data)
    outcome = launch.run_job(spec, run_dir, runner.execute, str(run_dir / "spec.json"))
    assert outcome.state == "COMPLETED"
    rec = load_record(run_dir)
    assert rec["status"] == "ok" and rec["tags"]["prof.source"] == "torch"
    assert rec["metrics"]["prof_nvtx_memcpy_1_MiB_count"] == 1
