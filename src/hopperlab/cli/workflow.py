"""Small helpers the Snakefile calls, kept here so that they are tested without Snakemake."""

from __future__ import annotations

import atexit
import contextlib
import os
import shlex
import sys
from pathlib import Path
from typing import Any, Mapping

from hopperlab import backends
from hopperlab.assets import hub
from hopperlab.assets.registry import asset_fingerprint, asset_inputs
from hopperlab.config.matrix import load_matrix
from hopperlab.config.spec import Matrix, spec_data_fingerprint, unknown_target_message
from hopperlab.core import locks
from hopperlab.core.errors import (HopperlabError, NoNetworkError, ResultsError, SpecError,
                                   one_line, shown)
from hopperlab.core.rundir import FAILING_STATUSES, METRICS_FILE, RECORD_FILE, load_record
from hopperlab.core.schema import project_schema
from hopperlab.profiling import check_profiler
from hopperlab.run import attempts
from hopperlab.node.containers import PYXIS, resolve_site_runtime
from hopperlab.results import tracking
from hopperlab.results.report import build_report
from hopperlab.results.rows import collect_runs
from hopperlab.results.tracking.verdicts import sync_verdicts
from hopperlab.run.isolation import ALONE_ENV
from hopperlab.run.submit import FORCED_ENV, disk_full_reason, is_disk_full
from hopperlab.run.warm import Starter
from hopperlab.run.warm_client import SOCKET_ENV
from hopperlab.run.warm_plan import could_be_warm

def config_args(config: Mapping[str, Any], root: str | Path) -> str:
    """``KEY=VALUE`` words that rebuild the same matrix in the `hopperlab` subprocess.

    Every key the config schema declares (workflow/schemas/config.schema.yaml) is forwarded:
    a hand-kept list once left ``repeats`` out, and the job measured another count than the
    workflow planned. Unset values (null, empty list or mapping) are left to the job's own
    read of configs/config.yaml, which gives the same."""
    declared = project_schema(Path(root), "config.schema.yaml")["properties"]
    unknown = sorted(set(config) - set(declared))
    if unknown:  # the config was validated against this schema: a key outside it is a bug
        raise SpecError(f"configs/config.yaml: {', '.join(unknown)}: not declared in "
                        f"workflow/schemas/config.schema.yaml, so not forwarded to the jobs")
    words = []
    for key in declared:
        value = config.get(key)
        if value is None or value == [] or value == {}:
            continue
        if isinstance(value, (list, tuple)):
            value = ",".join(map(str, value))
        elif isinstance(value, Mapping):
            value = ",".join(f"{k}:{v}" for k, v in value.items())
        words.append(shlex.quote(f"{key}={value}"))
    return " ".join(words)


def workflow_matrix(root: str | Path, config: Mapping[str, Any]) -> Matrix:
    """The matrix the Snakefile's rules are made from, its config validated once.

    The Snakefile has no ``configfile:``: Snakemake's loader expands YAML aliases without
    bound, and its ``validate`` prints the whole schema for one unknown key. ``config`` holds
    only what ``--config`` (or a profile) gave; ``load_matrix`` reads configs/config.yaml with
    hopperlab's bounded loader, applies those overrides and checks the result against the
    schema, one line per mistake. The one look at PATH on the submitting side (the container
    runtime) follows. A mistake stops Snakemake as ``hopperlab`` stops (``exit_on_config_error``).
    """
    try:
        matrix = load_matrix(root, config)
        check_container_runtime(matrix)
    except SpecError as exc:
        exit_on_config_error(exc)
    return matrix


def bare_forcerun(argv: list[str]) -> bool:
    """True when ``--forcerun``/``-R`` is given with no names after it."""
    for i, arg in enumerate(argv):
        if arg in ("--forcerun", "-R"):
            rest = argv[i + 1:]
            return not rest or rest[0].startswith("-")
    return False


def run_key(matrix: Matrix, wildcards: Any) -> str:
    """The run key of a target's wildcards; an unknown target stops the workflow with a reason."""
    key = f"{wildcards.family}/{wildcards.experiment}/{wildcards.variant}"
    if key not in matrix.runs:
        raise SpecError(unknown_target_message(key, matrix.runs))
    return key


def spec_fingerprint(matrix: Matrix, wildcards: Any) -> str:
    """A hash of the resolved spec (without the git commit), so that a changed spec reruns."""
    return spec_data_fingerprint(matrix.get(run_key(matrix, wildcards)).to_dict())


def assets_dir_for_rules(matrix: Matrix) -> str:
    """The site's assets folder as Snakemake should name it: relative to the project root when
    inside it (so targets read ``assets/NAME/MANIFEST.sha256``), else absolute."""
    folder = Path(matrix.site.assets_dir)
    try:
        return folder.relative_to(matrix.root).as_posix()
    except ValueError:
        return folder.as_posix()


def asset_manifest(assets_dir: str, name: str) -> str:
    return f"{assets_dir}/{name}/MANIFEST.sha256"


def run_asset_manifests(matrix: Matrix, wildcards: Any, assets_dir: str) -> list[str]:
    """The manifests of the assets a run names: its rule's inputs."""
    spec = matrix.get(run_key(matrix, wildcards))
    return [asset_manifest(assets_dir, name) for name in sorted(set(spec.assets.values()))]


def _asset_spec_or_error(specs: Mapping[str, Any], name: str) -> Any:
    if name not in specs:
        raise SpecError(f"configs/assets.yaml: assets: no asset named {shown(name)} (asked for as "
                        f"a target); known assets: {', '.join(specs)}")
    return specs[name]


def asset_input_manifests(specs: Mapping[str, Any], name: str, assets_dir: str) -> list[str]:
    """The manifests of the assets ``name`` is built from (a tokenizer, a data set...)."""
    _asset_spec_or_error(specs, name)
    return [asset_manifest(assets_dir, dep) for dep in sorted(set(asset_inputs(name, specs)
                                                                    .values()))]


def matrix_asset_manifests(matrix: Matrix, specs: Mapping[str, Any], assets_dir: str) -> list[str]:
    """The manifests of every asset the matrix uses, with the assets they are built from.

    They are targets of ``rule all``: Snakemake does not rebuild a missing *intermediate* file
    whose consumers are up to date, so a deleted asset would otherwise stay deleted. As targets,
    a deleted asset is rebuilt, and the runs that use it rerun (their input is newer).
    """
    wanted: set[str] = set()
    todo = [name for spec in matrix.runs.values() for name in spec.assets.values()]
    while todo:
        name = todo.pop()
        if name in wanted:
            continue
        _asset_spec_or_error(specs, name)
        wanted.add(name)
        todo.extend(asset_inputs(name, specs).values())
    return [asset_manifest(assets_dir, name) for name in sorted(wanted)]


def asset_rule_fingerprint(specs: Mapping[str, Any], name: str) -> str:
    """The asset's definition hash: a changed definition reruns its rule (and its dependents)."""
    _asset_spec_or_error(specs, name)
    return asset_fingerprint(name, specs)


def run_output_paths(matrix: Matrix) -> list[str]:
    return [f"{spec.run_dir}/{METRICS_FILE}" for spec in matrix.runs.values()]


def refresh_report_if_stale(matrix: Matrix) -> bool:
    """Rebuild summary.csv/report.html when a run record is newer than them; True if rebuilt."""
    results = matrix.results_dir
    summary = results / "summary.csv"
    newest = 0.0
    for spec in matrix.runs.values():
        for name in (METRICS_FILE, RECORD_FILE):
            path = matrix.root / spec.run_dir / name
            if path.exists():
                newest = max(newest, path.stat().st_mtime)
    if newest == 0.0 or (summary.exists() and summary.stat().st_mtime >= newest):
        return False
    build_report(results)  # each run at the price it recorded
    return True


def forced_run_keys(matrix: Matrix, dag_settings: Any) -> list[str]:
    """The runs the user told Snakemake to redo (``*`` for all), from its DAG settings.

    ``hopperlab submit`` adopts a finished run of the same spec instead of redoing it (after an
    interrupt Snakemake reruns jobs whose runs had finished); a run named by ``--forcerun``
    (its ``metrics.json`` or the rule ``run``), ``--force`` on its target or ``--forceall`` is
    redone all the same. Reruns because an input changed are told apart by the submit itself.
    """
    if dag_settings is None:
        return []
    if getattr(dag_settings, "forceall", False):
        return ["*"]
    asked = set(getattr(dag_settings, "forcerun", ()) or ())
    if getattr(dag_settings, "forcetargets", False):
        asked |= set(getattr(dag_settings, "targets", ()) or ())
    if "run" in asked:
        return ["*"]
    by_output = {os.path.realpath(matrix.root / spec.run_dir / METRICS_FILE): key
                 for key, spec in matrix.runs.items()}
    return sorted({by_output[p] for p in map(os.path.realpath, asked) if p in by_output})


def export_forced_runs(matrix: Matrix, dag_settings: Any) -> None:
    """Tell the jobs (``hopperlab submit``, through the environment) which runs are forced."""
    os.environ[FORCED_ENV] = " ".join(forced_run_keys(matrix, dag_settings))


def hold_results(matrix: Matrix) -> None:
    """Take the results folder for this workflow (onstart): a second workflow writing into it,
    from this checkout or another, is refused with the holder's host and pid. Its own jobs
    learn the holder through the environment; the lock goes when the workflow ends."""
    path = locks.results_lock_path(matrix.results_dir)
    try:
        locks.acquire(path, f"results folder {matrix.results_dir}")
    except OSError as exc:
        if not is_disk_full(exc):
            raise
        raise ResultsError(f"cannot start: {disk_full_reason(path, exc)}; free some space and "
                           f"run again") from None
    os.environ[locks.HOLDER_ENV] = locks.holder_id(locks.this_process())
    atexit.register(locks.release, path)  # also when Snakemake stops on an exception


#: ``HOPPERLAB_WARM_START=0``: no warm starter (every local job a fresh python, as before)
WARM_START_ENV = "HOPPERLAB_WARM_START"
#: where the warm starter writes what it says (a job it started cold, and why)
WARM_LOG = "warm-starter.log"
_STARTERS: list[Starter] = []


def start_warm_starter(matrix: Matrix, runs: list[str]) -> bool:
    """onstart: one warm starter (run/warm.py) for the jobs of this host without GPUs, when the
    site's jobs are processes here; its socket goes to the jobs through the environment."""
    if os.environ.get(WARM_START_ENV) == "0" or _STARTERS:
        return False
    if not any(key in matrix.runs and could_be_warm(matrix.runs[key]) for key in runs):
        return False
    matrix.results_dir.mkdir(parents=True, exist_ok=True)
    starter = Starter(matrix.results_dir / WARM_LOG, dict(matrix.site.env))
    _STARTERS.append(starter)
    os.environ[SOCKET_ENV] = starter.socket
    atexit.register(stop_warm_starter)
    return True


def stop_warm_starter() -> None:
    """End the workflow's warm starter, if any (the workflow's end, or its process's)."""
    os.environ.pop(SOCKET_ENV, None)
    while _STARTERS:
        _STARTERS.pop().stop()


def finish_workflow(matrix: Matrix) -> None:
    """onsuccess/onerror: upload the runs (a site with ``tracking.upload: at-end``), refresh the
    report if a run is newer, then give the folder back."""
    stop_warm_starter()
    try:
        keep_finished_outputs(matrix)
        refresh_report_if_stale(matrix)
        if matrix.site.tracking_upload == "at-end":
            upload_at_end(matrix)
        verdicts_at_end(matrix)
    finally:
        locks.release(locks.results_lock_path(matrix.results_dir))


def verdicts_at_end(matrix: Matrix) -> None:
    """The correctness verdicts of the folder's uploaded runs set in MLflow where they changed
    since their upload (a run uploaded while its baseline still ran; the report rule does the
    same, but does not run when a run failed): ``results.tracking.verdicts``, one line each
    change, MLflow down one line; nothing asked of MLflow where nothing changed."""
    try:
        found = sync_verdicts(collect_runs(matrix.results_dir), matrix.site.tracking_uri)
    except HopperlabError as exc:  # a folder that cannot be read: the workflow said so already
        print(f"[hopperlab] correctness not set in MLflow: {exc}")
        return
    for line in found.lines():
        print(line)


def upload_at_end(matrix: Matrix) -> None:
    """One ``sync`` of the results folder: what the jobs did not upload. MLflow down or
    refusing only delays it (one line, the runs stay on disk; the next workflow or `hopperlab
    sync` uploads them), as a per-run upload would."""
    uri = tracking.redact_uri(matrix.site.tracking_uri)
    try:
        report = tracking.sync(matrix.results_dir, matrix.site.tracking_uri, progress=False)
    except HopperlabError as exc:
        print(f"[hopperlab] upload to {uri} left for later (`hopperlab sync`): {exc}")
        return
    print(f"[hopperlab] sync to {uri}: {report}")


def container_inputs(matrix: Matrix) -> list[str]:
    """The image the workflow builds before any run (containers/<name>.sif, .<arch>.sif, .ch),
    relative to the project; none when the site names an existing image or uses pyxis (enroot
    images are made on the cluster)."""
    c = matrix.site.container
    if not c.image or c.existing or c.runtime == PYXIS:
        return []
    path = Path(str(c.image_file))
    with contextlib.suppress(ValueError):
        return [str(path.relative_to(matrix.root.resolve()))]
    return [str(path)]


def jobs_to_run(dag: Any) -> tuple[list[str], list[str]]:
    """(run keys, asset names) of the jobs Snakemake's DAG will run (onstart)."""
    runs, assets = [], []
    for job in dag.needrun_jobs():
        wc = job.wildcards
        if job.rule.name == "run":
            runs.append(f"{wc.family}/{wc.experiment}/{wc.variant}")
        elif job.rule.name == "asset":
            assets.append(str(wc.asset))
    return runs, assets


def preflight(matrix: Matrix, runs: list[str] | None = None, assets: list[str] = (),
              asset_specs: Mapping[str, Any] | None = None) -> None:
    """One check per workflow, before any job (onstart): the site's scheduler reachable and
    its partition present, nsys for every run that profiles with it, the Hub for every asset
    to fetch from it. Raises the first problem as one line with the way out; each job would
    otherwise meet it again, and a refused job's output is deleted by Snakemake."""
    site = matrix.site
    launcher = backends.launcher(site.executor)
    launcher.check_reachable(site.source)
    launcher.check_partition(site.own_settings, site.source)
    for key in matrix.runs if runs is None else runs:
        if key in matrix.runs:
            check_profiler(matrix.runs[key])
    fetched = [name for name in assets if asset_specs and name in asset_specs
               and hub.needs_hub(asset_specs[name])]
    if fetched:
        why = hub.hub_unreachable()
        if why:
            first = asset_specs[fetched[0]]
            raise NoNetworkError(
                f"{len(fetched)} asset(s) to fetch from the Hugging Face Hub "
                f"({', '.join(fetched)}), but {why}; ways out for {first.name}: "
                f"{'; '.join(hub.ways_out(first))}")


def preflight_or_exit(matrix: Matrix, runs: list[str] | None = None, assets: list[str] = (),
                      asset_specs: Mapping[str, Any] | None = None) -> None:
    """``preflight``, a problem printed as one line and exit status 2 (as a config error)."""
    try:
        preflight(matrix, runs, assets, asset_specs)
    except HopperlabError as exc:
        exit_on_config_error(exc)


def keep_finished_outputs(matrix: Matrix) -> list[str]:
    """Put back ``metrics.json`` of each run whose last submission was refused (the earlier
    attempt, a result, was kept; Snakemake deleted its output as the failed job's): onerror.
    Returns the keys put back."""
    kept = []
    for key, spec in matrix.runs.items():
        run_dir = matrix.root / spec.run_dir
        if (run_dir / METRICS_FILE).exists() or not (run_dir / RECORD_FILE).exists():
            continue
        events = attempts.history(run_dir)
        if not events or events[-1].get("event") != "not-submitted":
            continue
        try:
            rec = load_record(run_dir)
        except (OSError, ValueError):
            continue
        if rec and rec.get("status") not in FAILING_STATUSES:
            (run_dir / METRICS_FILE).write_text((run_dir / RECORD_FILE).read_text())
            kept.append(key)
    return kept


def check_container_runtime(matrix: Matrix) -> None:
    """Refuse, before any job, a site whose container cannot run on this (submitting) machine:
    loading the spec never looks at PATH, the workflow does once."""
    c = matrix.site.container
    resolve_site_runtime(matrix.site.source, c.runtime, c.image)


def exit_on_config_error(exc: HopperlabError) -> None:
    """Stop the Snakefile as ``hopperlab`` stops: one line on stderr and exit status 2
    (a WorkflowError would add Snakemake's file, line and traceback lines and exit 1)."""
    print(one_line(exc), file=sys.stderr)
    raise SystemExit(2)


def run_threads(matrix: Matrix, wc: Any, cores: int | None) -> int:
    """The Snakemake cores a run takes: every one for a host-bound run of a site whose jobs
    run on this node (nothing starts beside it: config/isolation.py), else 1; a scheduler's
    site keeps its runs apart itself (Slurm: an exclusive allocation)."""
    spec = matrix.runs[run_key(matrix, wc)]
    local = spec.site.backend.job_handle == "process" and not spec.site.backend.isolates
    return max(1, int(cores or 1)) if spec.host_bound is not None and local else 1


def alone_env(matrix: Matrix, wc: Any, threads: int) -> str:
    """The rule's word to the submitting side that it keeps this run alone (its record says
    so: run/isolation.py), else nothing."""
    spec = matrix.runs[run_key(matrix, wc)]
    if spec.host_bound is None or spec.site.backend.job_handle != "process":
        return ""
    return f"{ALONE_ENV}={int(threads)} "
