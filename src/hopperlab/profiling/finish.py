"""After the profiled process: CSV reports, the SQLite export, ``prof_`` metrics into the record.

Runs in the job, as a wrapper process around the profiled one (``python -m hopperlab.cli
profile job ... -- nsys profile ... python ...``): nsys writes its report only once the child
has exited, and only the job has the job's nsys and libraries. It forwards signals and exits
with the child's status. A profile that cannot be turned into metrics never fails the run (the
error goes to ``artifacts/profile/summary.json`` and the tag ``prof.error``). Why it runs there:
docs/profiling.md.
"""

from __future__ import annotations

import re
import signal
import subprocess
from pathlib import Path
from typing import Any, Sequence

from hopperlab.core import rundir as record
from hopperlab.profiling import nsys_sqlite, torch_trace
from hopperlab.profiling.command import PROFILE_DIR, REPORT_STEM, TORCH_TRACE
from hopperlab.profiling.timeline import DEFAULT_GAP_THRESHOLD_US, derive_metrics, kernel_table

#: ``nsys stats`` reports saved as CSV, with the names older nsys releases gave them
DEFAULT_REPORTS: dict[str, tuple[str, ...]] = {
    "cuda_gpu_kern_sum": ("gpukernsum",),
    "cuda_gpu_mem_time_sum": ("gpumemtimesum",),
    "cuda_gpu_mem_size_sum": ("gpumemsizesum",),
    "cuda_api_sum": ("cudaapisum",),
    "nvtx_sum": ("nvtxsum", "nvtxppsum"),
    "um_sum": (),
    "um_total_sum": (),
    "um_cpu_page_faults_sum": (),
}
#: reports that only make sense with unified-memory tracing: never "missing" without it
UM_REPORTS = frozenset({"um_sum", "um_total_sum", "um_cpu_page_faults_sum"})
SUMMARY_FILE = "summary.json"
TRIMMED_SQLITE = "profile.sqlite"
STATS_TIMEOUT_S = 900
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)


def available_reports(help_text: str) -> set[str]:
    """Report names listed by ``nsys stats --help-reports``."""
    names = set()
    for line in help_text.splitlines():
        m = re.match(r"^\s{1,8}([a-z][a-z0-9_]+)(\[|\s+--|\s*$)", line)
        if m:
            names.add(m.group(1))
    return names


def choose_reports(available: set[str], wanted: Sequence[str] = ()) -> tuple[dict[str, str], list[str]]:
    """{wanted name: name this nsys knows} and the wanted names it does not know."""
    wanted = list(wanted) or list(DEFAULT_REPORTS)
    chosen: dict[str, str] = {}
    missing: list[str] = []
    for name in wanted:
        options = (name, *DEFAULT_REPORTS.get(name, ()))
        found = next((o for o in options if o in available), None)
        if found:
            chosen[name] = found
        else:
            missing.append(name)
    return chosen, missing


def _run(cmd: list[str], timeout: float = STATS_TIMEOUT_S) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def nsys_version(nsys: str) -> str | None:
    try:
        out = _run([nsys, "--version"], timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip().splitlines()[-1] if out.returncode == 0 and out.stdout.strip() else None


def export_sqlite(nsys: str, report: Path, dest: Path) -> Path:
    out = _run([nsys, "export", "--type", "sqlite", "--force-overwrite", "true",
                "--output", str(dest), str(report)])
    if out.returncode != 0 or not dest.is_file():
        raise RuntimeError(f"nsys export failed ({out.returncode}): {(out.stderr or out.stdout)[-800:]}")
    return dest


def stats_csvs(nsys: str, source: Path, folder: Path, wanted: Sequence[str] = ()
               ) -> tuple[dict[str, str], list[str], list[str]]:
    """Run ``nsys stats`` for the reports this nsys offers; return {report: csv file name},
    the wanted reports it does not offer, and those it offers that wrote nothing (no data)."""
    help_out = _run([nsys, "stats", "--help-reports"], timeout=120)
    chosen, missing = choose_reports(available_reports(help_out.stdout + help_out.stderr), wanted)
    written: dict[str, str] = {}
    empty: list[str] = []
    for name, actual in chosen.items():
        prefix = folder / f".stats-{name}"
        out = _run([nsys, "stats", "--report", actual, "--format", "csv",
                    "--output", str(prefix), str(source)])
        produced = sorted(folder.glob(f".stats-{name}_*.csv"))
        target = folder / f"{name}.csv"
        for extra in produced[1:]:
            extra.unlink()
        if out.returncode == 0 and produced and _has_rows(produced[0]):
            produced[0].replace(target)
            written[name] = target.name
        else:  # nsys writes an empty file, or none, for a report without data in this profile
            if produced:
                produced[0].unlink()
            empty.append(name)
    return written, missing, empty


def _has_rows(csv_file: Path) -> bool:
    lines = [ln for ln in csv_file.read_text(errors="replace").splitlines() if ln.strip()]
    return len(lines) > 1


def finish_profile(run_dir: Path | str, profiler: str, *, nsys: str | None = None,
                   gap_threshold_us: float = DEFAULT_GAP_THRESHOLD_US, keep_sqlite: bool = False,
                   reports: Sequence[str] = ()) -> dict[str, Any]:
    """Turn the run's profile into artifacts and metrics; amend the run's record with them.

    Returns the summary also written to ``artifacts/profile/summary.json``.
    """
    run_dir = Path(run_dir)
    folder = run_dir / PROFILE_DIR
    folder.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {"profiler": profiler, "metrics": {}, "tags": {}}
    try:
        if profiler == "nsys":
            timeline = _nsys_timeline(folder, nsys or "nsys", summary, keep_sqlite, reports)
        elif profiler == "torch":
            trace = run_dir / "artifacts" / TORCH_TRACE
            if not trace.is_file():
                raise FileNotFoundError(f"the workload wrote no torch trace at {trace}")
            timeline = torch_trace.read_timeline(trace)
        else:
            raise ValueError(f"unknown profiler {profiler!r}")
        metrics, tags = derive_metrics(timeline, gap_threshold_us)
        summary["metrics"], summary["tags"] = metrics, {**summary["tags"], **tags}
        summary["top_kernels"] = kernel_table(timeline)
    except Exception as exc:  # noqa: BLE001 - a profile problem is reported, never fatal
        try:
            rec = record.load_record(run_dir) or {}
        except (OSError, ValueError):
            rec = {}
        if isinstance(exc, FileNotFoundError) and rec.get("status") in ("skipped", "oom"):
            # nothing was profiled because nothing ran: the record already says why
            summary["note"] = f"no profile: the run is {rec['status']}"
        else:
            summary["error"] = f"{type(exc).__name__}: {exc}"[:2000]
            summary["tags"]["prof.error"] = summary["error"][:500]
    record.write_json_atomic(folder / SUMMARY_FILE, summary)
    amend_record(run_dir, summary["metrics"], summary["tags"])
    return summary


def _nsys_timeline(folder: Path, nsys: str, summary: dict[str, Any], keep_sqlite: bool,
                   reports: Sequence[str]):
    report = folder / f"{REPORT_STEM}.nsys-rep"
    if not report.is_file():
        leftovers = sorted(p.name for p in folder.glob(f"{REPORT_STEM}*"))
        raise FileNotFoundError(
            f"nsys wrote no {report.name}" + (f" (found: {', '.join(leftovers)}; a lone .qdstrm "
                                              f"means its importer failed)" if leftovers else
                                              " (did the workload open measured_region()?)"))
    version = nsys_version(nsys)
    if version:
        summary["tags"]["prof.nsys_version"] = version
    full = export_sqlite(nsys, report, folder / f"{REPORT_STEM}.sqlite")
    try:
        written, missing, empty = stats_csvs(nsys, full, folder, reports)
        summary["reports"] = written
        summary["reports_missing"] = missing
        summary["reports_without_data"] = empty
        unexpected = [m for m in missing if m not in UM_REPORTS]
        if missing:
            summary["tags"]["prof.reports_missing"] = ", ".join(missing)
        if unexpected:
            summary["tags"]["prof.reports_missing_core"] = ", ".join(unexpected)
        timeline = nsys_sqlite.read_timeline(full)
        nsys_sqlite.trim(full, folder / TRIMMED_SQLITE)
    finally:
        if not keep_sqlite:
            full.unlink(missing_ok=True)
    return timeline


def amend_record(run_dir: Path, metrics: dict[str, float], tags: dict[str, str]) -> bool:
    """Add the profile's metrics and tags to the run's record (if the job wrote one)."""
    rec = record.load_record(run_dir)
    if rec is None:
        return False
    spec_file = run_dir / record.SPEC_FILE
    if spec_file.exists() and rec.get("attempt") != record.read_json(spec_file).get("attempt", 1):
        return False  # the record of an earlier attempt: the job died before writing its own
    rec["metrics"] = {**(rec.get("metrics") or {}), **metrics}
    rec["tags"] = {**(rec.get("tags") or {}), **tags}
    record.write_record(run_dir, rec)
    return True


# --------------------------------------------------------------------------- the wrapper
def run_child(cmd: Sequence[str]) -> int:
    """Run ``cmd``, passing on the signals a scheduler sends; return its exit status."""
    child = subprocess.Popen(list(cmd))
    previous = {}

    def forward(signum: int, _frame: Any) -> None:
        if child.poll() is None:
            child.send_signal(signum)

    for sig in _FORWARDED:
        previous[sig] = signal.signal(sig, forward)
    try:
        rc = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 128 - rc if rc < 0 else rc
