"""Profiler command lines that wrap the job's python (the ``profiler`` knob).

Only the command line lives here for now: ``nsys profile`` around the job's process, its report
kept in the run directory's ``artifacts/profile/``. Turning reports into metrics is a later step.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hopperlab.spec import RunSpec

NSYS_TRACES = "cuda,nvtx,cublas,cudnn"


def nsys_executable(spec: "RunSpec") -> str:
    """The site's nsys path, else ``nsys`` (found on PATH on the node, or inside the container)."""
    return spec.site.nsys_path or shutil.which("nsys") or "nsys"


def profiler_prefix(spec: "RunSpec", run_dir: Path) -> list[str]:
    """Arguments put before python in the job's command (empty unless ``profiler: nsys``)."""
    if spec.knobs.profiler != "nsys":
        return []
    report = Path(run_dir).resolve() / "artifacts" / "profile" / "report"
    cmd = [nsys_executable(spec), "profile", "-t", NSYS_TRACES, "-s", "none", "--cpuctxsw=none",
           "--force-overwrite", "true", "-o", str(report)]
    if spec.knobs.memory == "managed":
        cmd += ["--cuda-um-cpu-page-faults=true", "--cuda-um-gpu-page-faults=true"]
    return cmd
