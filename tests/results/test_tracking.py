"""hopperlab.results.tracking against a real MLflow server (tests.infra.mlflow_fixture), read back."""

from __future__ import annotations

import datetime
import json
import multiprocessing as mp
import shutil
import sys
import time
import uuid
from pathlib import Path

import mlflow
import pytest

from hopperlab.results import tracking
from hopperlab.core.rundir import MLFLOW_FILE, Recorder, write_json_atomic
from hopperlab.results.tracking import TrackingUnavailable

pytestmark = [pytest.mark.timeout(600), pytest.mark.mlflow_server]


# -- helpers --------------------------------------------------------------------------------------
def uid() -> str:
    return uuid.uuid4().hex[:8]


def make_run(results: Path, family: str, experiment: str, variant: str, *, attempt: int = 1,
             status: str = "ok", reason: str | None = None, steps: int = 5,
             step_metrics: tuple[str, ...] = ("bw_gbps",), final: dict | None = None,
             traceback: str | None = None, spec_extra: dict | None = None,
             run_uid: str | None = None) -> Path:
    run_dir = results / family / experiment / variant
    spec = {
        "family": family, "experiment": experiment, "variant": variant, "scale": "small",
        "knobs": {"memory": "pinned", "direction": "h2d"},
        "params": {"sizes_mb": [64, 256, 1024], "repeats": 3},
        "resources": {"gpus": 1, "time_min": 10},
        "git_commit": "0123abc",
        **(spec_extra or {}),
    }
    write_json_atomic(run_dir / "spec.json", spec)
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    (run_dir / "logs" / "job.out").write_text(f"stdout of {variant}\n")
    (run_dir / "logs" / "job.err").write_text("")
    identity = {"key": f"{family}/{experiment}/{variant}", "family": family,
                "experiment": experiment, "variant": variant}
    if run_uid:  # as `hopperlab submit` makes one per attempt
        identity["run_uid"] = run_uid
    rec = Recorder(run_dir, identity=identity, attempt=attempt)
    rec.hardware = {"hostname": "gpu-node-07", "cpu_model": "Xeon", "cpu_arch": "x86_64",
                    "gpu_model": "NVIDIA H100 80GB HBM3"}
    write_json_atomic(run_dir / "hardware.json", rec.hardware)
    rec.slurm = {"job_id": "4242", "state": "COMPLETED"}
    rec.set_tag("membench.target", "cuda")
    for i in range(steps):
        rec.log_step(i, **{name: 10.0 * i + k for k, name in enumerate(step_metrics)})
    rec.log_metrics(final if final is not None else {"bw_gbps_peak": 54.8, "latency_us": 3.25})
    rec.artifact_path("table.csv").write_text("size_mb,gbps\n64,50.1\n")
    if traceback:
        (run_dir / "traceback.txt").write_text(traceback)
    rec.finish(status, reason)
    return run_dir


def child_runs(client, experiment_id: str, **tags) -> list:
    flt = " and ".join(f"tags.`{k}` = '{v}'" for k, v in tags.items())
    return client.search_runs([experiment_id], filter_string=flt)


def all_artifacts(client, run_id: str, path: str | None = None) -> set[str]:
    out = set()
    for info in client.list_artifacts(run_id, path):
        if info.is_dir:
            out |= all_artifacts(client, run_id, info.path)
        else:
            out.add(info.path)
    return out


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


# -- one run --------------------------------------------------------------------------------------
def test_upload_contents(mlflow_uri, tmp_path):
    fam, exp = f"membench-{uid()}", "copy"
    run_dir = make_run(tmp_path, fam, exp, "h2d-pinned")
    run_id = tracking.upload_run(run_dir, mlflow_uri)

    client = mlflow.MlflowClient(mlflow_uri)
    run = client.get_run(run_id)
    assert run.info.run_name == "h2d-pinned"
    assert run.info.status == "FINISHED"

    # params: the spec, flattened to dotted keys
    p = run.data.params
    assert p["knobs.memory"] == "pinned"
    assert p["knobs.direction"] == "h2d"
    assert json.loads(p["params.sizes_mb"]) == [64, 256, 1024]
    assert p["params.repeats"] == "3"
    assert p["resources.gpus"] == "1"
    assert p["scale"] == "small"

    # step metrics with their steps; final metrics
    hist = client.get_metric_history(run_id, "bw_gbps")
    assert sorted((m.step, m.value) for m in hist) == [(i, 10.0 * i) for i in range(5)]
    assert all(m.timestamp > 1_600_000_000_000 for m in hist)
    assert run.data.metrics["bw_gbps_peak"] == pytest.approx(54.8)
    assert run.data.metrics["latency_us"] == pytest.approx(3.25)

    # tags
    t = run.data.tags
    assert t["hopperlab.family"] == fam
    assert t["hopperlab.experiment"] == exp
    assert t["hopperlab.variant"] == "h2d-pinned"
    assert t["hopperlab.attempt"] == "1"
    assert t["hopperlab.status"] == "ok"
    assert "hopperlab.reason" not in t
    assert t["hopperlab.run_key"] == f"{fam}/{exp}/h2d-pinned#1"
    assert t["hopperlab.uploaded"] == "true"
    assert t["hostname"] == "gpu-node-07"
    assert t["gpu_model"] == "NVIDIA H100 80GB HBM3"
    assert t["cpu_arch"] == "x86_64"
    assert t["git_commit"] == "0123abc"
    assert t["slurm_job_id"] == "4242"
    assert t["membench.target"] == "cuda"

    # parent/child structure: experiment = family, parent run = experiment
    experiment = client.get_experiment_by_name(fam)
    assert run.info.experiment_id == experiment.experiment_id
    parents = child_runs(client, experiment.experiment_id, **{"hopperlab.role": "parent"})
    assert len(parents) == 1
    parent = parents[0]
    assert parent.info.run_name == exp
    assert parent.data.tags["hopperlab.family"] == fam
    assert parent.data.tags["hopperlab.experiment"] == exp
    assert t["mlflow.parentRunId"] == parent.info.run_id

    # artifacts
    arts = all_artifacts(client, run_id)
    assert {"logs/job.out", "logs/job.err", "spec.json", "record.json", "hardware.json",
            "artifacts/table.csv"} <= arts
    assert "traceback.txt" not in arts

    # mlflow.json
    info = json.loads((run_dir / MLFLOW_FILE).read_text())
    assert info == {"attempt": 1, "run_id": run_id, "experiment_id": experiment.experiment_id,
                    "tracking_uri": mlflow_uri, "run_uid": t["hopperlab.run_uid"],
                    # the verdict tags it was given (none: no run to be compared with)
                    "correctness_tags": {}}


def test_final_metric_is_the_latest_value_of_its_step_metric(mlflow_uri, tmp_path):
    """tokens_per_s is logged each step and once as the run's figure (the median): MLflow's
    latest value, what its UI shows, must be the run's figure, also when the run finished
    within the second of its last step (records written before 2026-11-26 have whole seconds)."""
    run_dir = make_run(tmp_path, f"finetune-{uid()}", "lora", "base",
                       step_metrics=("tokens_per_s",), final={"tokens_per_s": 123.0})
    steps = [json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines()]
    record = json.loads((run_dir / "record.json").read_text())
    finished = datetime.datetime.fromisoformat(record["finished_at"]).timestamp()
    assert finished <= steps[-1]["time"] + 1        # the case of the bug: the same second
    run_id = tracking.upload_run(run_dir, mlflow_uri)
    client = mlflow.MlflowClient(mlflow_uri)
    assert client.get_run(run_id).data.metrics["tokens_per_s"] == pytest.approx(123.0)
    hist = client.get_metric_history(run_id, "tokens_per_s")
    assert sorted(m.value for m in hist) == sorted([10.0 * i for i in range(5)] + [123.0])


def test_failed_run(mlflow_uri, tmp_path):
    fam = f"membench-{uid()}"
    tb = "Traceback (most recent call last):\n  ...\nRuntimeError: boom\n"
    run_dir = make_run(tmp_path, fam, "copy", "d2h", status="failed", reason="RuntimeError: boom",
                       traceback=tb, final={})
    run_id = tracking.upload_run(run_dir, mlflow_uri)
    client = mlflow.MlflowClient(mlflow_uri)
    run = client.get_run(run_id)
    assert run.info.status == "FAILED"
    assert run.data.tags["hopperlab.status"] == "failed"
    assert run.data.tags["hopperlab.reason"] == "RuntimeError: boom"
    arts = all_artifacts(client, run_id)
    assert {"traceback.txt", "record.json"} <= arts
    local = Path(client.download_artifacts(run_id, "traceback.txt", str(tmp_path / "dl")))
    assert local.read_text() == tb


@pytest.mark.parametrize("status,expected", [("oom", "FINISHED"), ("skipped", "FINISHED"),
                                             ("timeout", "FAILED")])
def test_status_mapping(mlflow_uri, tmp_path, status, expected):
    run_dir = make_run(tmp_path, f"membench-{uid()}", "copy", "v", status=status,
                       reason=f"because {status}", final={})
    run = mlflow.MlflowClient(mlflow_uri).get_run(tracking.upload_run(run_dir, mlflow_uri))
    assert run.info.status == expected
    assert run.data.tags["hopperlab.reason"] == f"because {status}"


def test_upload_twice_creates_one_run(mlflow_uri, tmp_path):
    fam = f"membench-{uid()}"
    run_dir = make_run(tmp_path, fam, "copy", "h2d")
    first = tracking.upload_run(run_dir, mlflow_uri)
    (run_dir / MLFLOW_FILE).unlink()  # even without mlflow.json, the server is asked first
    second = tracking.upload_run(run_dir, mlflow_uri)
    assert first == second
    client = mlflow.MlflowClient(mlflow_uri)
    exp_id = client.get_experiment_by_name(fam).experiment_id
    assert len(child_runs(client, exp_id, **{"hopperlab.variant": "h2d"})) == 1
    assert len(client.search_runs([exp_id])) == 2  # the parent and the child


def test_half_upload_is_redone(mlflow_uri, tmp_path):
    fam = f"membench-{uid()}"
    run_uid = uuid.uuid4().hex
    run_dir = make_run(tmp_path, fam, "copy", "h2d", run_uid=run_uid)
    tracking.prepare(mlflow_uri, [(fam, "copy")])
    client = mlflow.MlflowClient(mlflow_uri)
    exp_id = client.get_experiment_by_name(fam).experiment_id
    # An upload that died after create_run: the key and uid tags, no "uploaded" tag.
    dead = client.create_run(exp_id, run_name="h2d",
                             tags={"hopperlab.run_key": f"{fam}/copy/h2d#1",
                                   "hopperlab.run_uid": run_uid}).info.run_id
    run_id = tracking.upload_run(run_dir, mlflow_uri)
    assert run_id != dead
    assert client.get_run(dead).info.lifecycle_stage == "deleted"
    live = child_runs(client, exp_id, **{"hopperlab.run_key": f"{fam}/copy/h2d#1"})
    assert [r.info.run_id for r in live] == [run_id]
    assert live[0].data.tags["hopperlab.uploaded"] == "true"


def test_attempt_two_is_a_second_child(mlflow_uri, tmp_path):
    fam = f"membench-{uid()}"
    run_dir = make_run(tmp_path, fam, "copy", "h2d", status="timeout", reason="time limit",
                       final={})
    first = tracking.upload_run(run_dir, mlflow_uri)
    # hopperlab submit moves attempt 1 aside, then attempt 2 runs in the run dir.
    archive = run_dir / "attempts" / "1"
    archive.mkdir(parents=True)
    for p in list(run_dir.iterdir()):
        if p.name != "attempts" and p.name != "spec.json":
            shutil.move(str(p), archive / p.name)
    shutil.copy(run_dir / "spec.json", archive / "spec.json")
    make_run(tmp_path, fam, "copy", "h2d", attempt=2)
    second = tracking.upload_run(run_dir, mlflow_uri)
    assert second != first
    assert tracking.upload_run(archive, mlflow_uri) == first  # the archived attempt: the same

    client = mlflow.MlflowClient(mlflow_uri)
    exp_id = client.get_experiment_by_name(fam).experiment_id
    kids = child_runs(client, exp_id, **{"hopperlab.variant": "h2d"})
    assert sorted(r.info.run_name for r in kids) == ["h2d", "h2d #2"]
    assert len({r.data.tags["mlflow.parentRunId"] for r in kids}) == 1
    by_name = {r.info.run_name: r for r in kids}
    assert by_name["h2d"].info.status == "FAILED"
    assert by_name["h2d #2"].info.status == "FINISHED"
    assert by_name["h2d #2"].data.tags["hopperlab.run_key"] == f"{fam}/copy/h2d#2"
    assert json.loads((run_dir / MLFLOW_FILE).read_text())["attempt"] == 2
    assert json.loads((archive / MLFLOW_FILE).read_text())["attempt"] == 1


def test_many_params_long_values(mlflow_uri, tmp_path):
    extra = {"params": {f"p{i:03d}": i for i in range(250)}, "knobs": {"blob": "x" * 7000}}
    run_dir = make_run(tmp_path, f"membench-{uid()}", "copy", "wide", spec_extra=extra)
    run = mlflow.MlflowClient(mlflow_uri).get_run(tracking.upload_run(run_dir, mlflow_uri))
    assert run.data.params["params.p249"] == "249"
    assert len([k for k in run.data.params if k.startswith("params.")]) == 250
    assert run.data.params["knobs.blob"] == "x" * 6000


def test_odd_names_are_made_safe(mlflow_uri, tmp_path):
    run_dir = make_run(tmp_path, f"membench-{uid()}", "copy", "odd", step_metrics=("bw(GB/s)",),
                       final={"peak [GB/s]": 1.5},
                       spec_extra={"params": {"size (MB)": 64, "size [MB]": 65}})
    run = mlflow.MlflowClient(mlflow_uri).get_run(tracking.upload_run(run_dir, mlflow_uri))
    assert run.data.metrics["bw_GB/s_"] == 40.0
    assert run.data.metrics["peak _GB/s_"] == 1.5
    assert run.data.params["params.size _MB_"] == "64"  # the first of two that collide


def test_10k_step_metrics_fast(mlflow_uri, tmp_path, monkeypatch):
    names = ("bw_gbps", "lat_us", "util", "mem_gb")
    run_dir = make_run(tmp_path, f"membench-{uid()}", "copy", "long", steps=2500,
                       step_metrics=names)
    calls = {"log_batch": 0}
    real_log_batch = mlflow.MlflowClient.log_batch

    def counting_log_batch(self, *a, **kw):
        calls["log_batch"] += 1
        return real_log_batch(self, *a, **kw)

    def forbidden(*a, **kw):
        raise AssertionError("one call per metric: use log_batch")

    monkeypatch.setattr(mlflow.MlflowClient, "log_batch", counting_log_batch)
    monkeypatch.setattr(mlflow.MlflowClient, "log_metric", forbidden)
    tracking.prepare(mlflow_uri, [(run_dir.parent.parent.name, "copy")])
    run_id = tracking.upload_run(run_dir, mlflow_uri)
    # 10,002 metrics / 1000 = 11 metric batches, + 1 params batch + 1 tags batch
    assert calls["log_batch"] == 13
    client = mlflow.MlflowClient(mlflow_uri)
    for name in names:
        hist = client.get_metric_history(run_id, name)
        assert len(hist) == 2500
        assert sorted(m.step for m in hist) == list(range(2500))


# -- outage and sync ------------------------------------------------------------------------------
def test_server_down_then_sync(mlflow_server, mlflow_uri, tmp_path, monkeypatch):
    fam = f"membench-{uid()}"
    results = tmp_path / "results"
    done = make_run(results, fam, "copy", "before-outage")
    tracking.upload_run(done, mlflow_uri)
    other_uri = make_run(results, fam, "copy", "elsewhere")
    write_json_atomic(other_uri / MLFLOW_FILE, {"attempt": 1, "run_id": "x", "experiment_id": "1",
                                                "tracking_uri": "http://other-host:5000"})
    lost = make_run(results, fam, "copy", "lost-mlflow-json")
    tracking.upload_run(lost, mlflow_uri)
    (lost / MLFLOW_FILE).unlink()

    mlflow_server.stop()
    try:
        assert not tracking.is_reachable(mlflow_uri)
        during = [make_run(results, fam, "copy", f"during-{i}") for i in range(2)]
        during.append(make_run(results, fam, "load", "during-x", status="failed", reason="boom",
                               final={}, traceback="Traceback\n"))
        before = snapshot(results)

        t0 = time.perf_counter()
        with pytest.raises(TrackingUnavailable) as err:
            tracking.upload_run(during[0], mlflow_uri)
        quick = time.perf_counter() - t0
        assert "unreachable" in str(err.value)

        # Without the /health pre-check, MLflow's own retries must also give up quickly.
        monkeypatch.setattr(tracking.client, "is_reachable", lambda uri, timeout=5.0: True)
        t0 = time.perf_counter()
        with pytest.raises(TrackingUnavailable):
            tracking.upload_run(during[1], mlflow_uri)
        retried = time.perf_counter() - t0
        monkeypatch.undo()
        print(f"\nserver down: TrackingUnavailable after {quick:.2f}s (health check), "
              f"{retried:.2f}s (MLflow HTTP retries)")

        with pytest.raises(TrackingUnavailable):
            tracking.sync(results, mlflow_uri)
        assert snapshot(results) == before  # nothing written, nothing removed
    finally:
        mlflow_server.start()

    print(f"server restarted in {mlflow_server.start_seconds[-1]:.1f}s")
    t0 = time.perf_counter()
    report = tracking.sync(results, mlflow_uri)
    print(f"sync after restart: {report} ({time.perf_counter() - t0:.2f}s)")
    expected = {f"{fam}/copy/during-0#1", f"{fam}/copy/during-1#1", f"{fam}/load/during-x#1",
                f"{fam}/copy/elsewhere#1"}
    assert set(report.uploaded) == expected
    assert report.already == [f"{fam}/copy/lost-mlflow-json#1"]
    assert report.failed == []
    assert report.counts == {"uploaded": 4, "already": 1, "failed": 0}
    for run_dir in during:
        assert json.loads((run_dir / MLFLOW_FILE).read_text())["tracking_uri"] == mlflow_uri

    again = tracking.sync(results, mlflow_uri)
    assert again.counts == {"uploaded": 0, "already": 0, "failed": 0}

    client = mlflow.MlflowClient(mlflow_uri)
    exp_id = client.get_experiment_by_name(fam).experiment_id
    kids = child_runs(client, exp_id, **{"hopperlab.family": fam})
    kids = [r for r in kids if "hopperlab.run_key" in r.data.tags]
    assert len(kids) == 6
    parents = child_runs(client, exp_id, **{"hopperlab.role": "parent"})
    assert sorted(r.info.run_name for r in parents) == ["copy", "load"]


def test_sync_archived_attempts(mlflow_uri, tmp_path):
    fam = f"membench-{uid()}"
    results = tmp_path / "results"
    run_dir = make_run(results, fam, "copy", "h2d", status="failed", reason="x", final={})
    archive = run_dir / "attempts" / "1"
    archive.mkdir(parents=True)
    for p in list(run_dir.iterdir()):
        if p.name != "attempts":
            shutil.move(str(p), archive / p.name)
    make_run(results, fam, "copy", "h2d", attempt=2)
    report = tracking.sync(results, mlflow_uri)
    assert sorted(report.uploaded) == [f"{fam}/copy/h2d#1", f"{fam}/copy/h2d#2"]
    assert tracking.sync(results, mlflow_uri).counts["uploaded"] == 0


# -- prepare ---------------------------------------------------------------------------------------
KEYS = [("fam-a", "copy"), ("fam-a", "latency"), ("fam-b", "copy")]


def _prepare_worker(uri: str, keys: list, barrier, no_lock: bool, queue) -> None:
    import contextlib

    from hopperlab.results import tracking as tr

    if no_lock:  # behave like processes on different hosts: no shared file lock
        tr._store_lock = lambda uri: contextlib.nullcontext()
    try:
        barrier.wait(timeout=120)
        tr.prepare(uri, keys)
        queue.put("ok")
    except BaseException as exc:  # report to the parent
        queue.put(f"{type(exc).__name__}: {exc}")


def _prepare_in_processes(uri: str, keys: list, n: int = 4, no_lock: bool = False) -> None:
    ctx = mp.get_context("spawn")
    barrier, queue = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_prepare_worker, args=(uri, keys, barrier, no_lock, queue))
             for _ in range(n)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert results == ["ok"] * n, results


def _check_layout(uri: str, keys: list) -> set[str]:
    client = mlflow.MlflowClient(uri)
    families = {f for f, _ in keys}
    exps = [e for e in client.search_experiments() if e.name in families]
    assert sorted(e.name for e in exps) == sorted(families)
    ids = set()
    for exp in exps:
        parents = child_runs(client, exp.experiment_id, **{"hopperlab.role": "parent"})
        names = sorted(r.info.run_name for r in parents)
        assert names == sorted(e for f, e in keys if f == exp.name)
        assert all(r.info.status == "FINISHED" for r in parents)
        ids |= {r.info.run_id for r in parents}
    return ids


def test_prepare_concurrent_fresh_sqlite(tmp_path):
    uri = f"sqlite:///{tmp_path / 'fresh' / 'mlflow.db'}"
    _prepare_in_processes(uri, KEYS)
    ids = _check_layout(uri, KEYS)
    tracking.prepare(uri, KEYS)  # idempotent
    assert _check_layout(uri, KEYS) == ids
    # artifacts of a SQLite store go next to the database, not into ./mlruns
    exp = mlflow.MlflowClient(uri).get_experiment_by_name("fam-a")
    assert exp.artifact_location.startswith((tmp_path / "fresh").as_uri())
    # and a run uploads into it, artifacts included
    run_dir = make_run(tmp_path / "results", "fam-a", "copy", "h2d")
    run_id = tracking.upload_run(run_dir, uri)
    assert "spec.json" in all_artifacts(mlflow.MlflowClient(uri), run_id)
    assert list((tmp_path / "fresh" / "mlartifacts").rglob("spec.json"))
    assert not Path("mlruns").exists() or not list(Path("mlruns").rglob(run_id))


@pytest.mark.parametrize("no_lock", [False, True], ids=["same-host", "no-shared-lock"])
def test_prepare_concurrent_server(mlflow_uri, no_lock):
    s = uid()
    keys = [(f"{f}-{s}", e) for f, e in KEYS]
    _prepare_in_processes(mlflow_uri, keys, no_lock=no_lock)
    ids = _check_layout(mlflow_uri, keys)
    tracking.prepare(mlflow_uri, keys)
    assert _check_layout(mlflow_uri, keys) == ids


# -- credentials -----------------------------------------------------------------------------
def test_credentials_never_written(mlflow_uri, tmp_path, capsys, caplog):
    creds_uri = mlflow_uri.replace("http://", "http://alice:s3cret@")
    run_dir = make_run(tmp_path, f"membench-{uid()}", "copy", "h2d")
    tracking.upload_run(run_dir, creds_uri)
    assert json.loads((run_dir / MLFLOW_FILE).read_text())["tracking_uri"] == mlflow_uri
    assert tracking.is_synced(run_dir, mlflow_uri)

    from tests.infra.mlflow_fixture import free_port

    dead = f"http://alice:s3cret@127.0.0.1:{free_port()}"
    with pytest.raises(TrackingUnavailable) as err:
        tracking.upload_run(run_dir, dead)
    assert "s3cret" not in str(err.value)
    out = capsys.readouterr()
    assert "s3cret" not in out.out + out.err + caplog.text


def test_credentials_of_an_old_spec_json_never_reach_mlflow(mlflow_uri, tmp_path):
    """A spec.json written with a password in the site's URI (issue 16, item 14): neither the
    params nor the spec.json artifact carry it."""
    site = {"name": "cluster", "tracking_uri": "http://alice:s3cret@mlflow.example.org:5055"}
    run_dir = make_run(tmp_path, f"membench-{uid()}", "copy", "h2d", spec_extra={"site": site})
    run_id = tracking.upload_run(run_dir, mlflow_uri)
    client = mlflow.MlflowClient(mlflow_uri)
    params = client.get_run(run_id).data.params
    assert params["site.tracking_uri"] == "http://mlflow.example.org:5055"
    assert not [k for k, v in params.items() if "s3cret" in v]
    spec_copy = Path(client.download_artifacts(run_id, "spec.json", str(tmp_path / "dl")))
    assert "s3cret" not in spec_copy.read_text()
    assert "mlflow.example.org:5055" in spec_copy.read_text()


# -- identity: the run uid, never the run key (issue 16, items 2 and 7) -------------------------
def sqlite_uri(folder: Path) -> str:
    return f"sqlite:///{folder / 'mlflow.db'}"


def test_two_results_folders_never_share_an_mlflow_run(tmp_path):
    uri = sqlite_uri(tmp_path / "store")
    a = make_run(tmp_path / "results-a", "fam", "copy", "h2d", run_uid=uuid.uuid4().hex)
    b = make_run(tmp_path / "results-b", "fam", "copy", "h2d", run_uid=uuid.uuid4().hex,
                 status="failed", reason="boom", final={})
    run_a = tracking.upload_run(a, uri)
    run_b = tracking.upload_run(b, uri)
    assert run_a != run_b
    client = mlflow.MlflowClient(uri)
    exp_id = client.get_experiment_by_name("fam").experiment_id
    kids = child_runs(client, exp_id, **{"hopperlab.run_key": "fam/copy/h2d#1"})
    assert {r.info.run_id: r.info.status for r in kids} == {run_a: "FINISHED", run_b: "FAILED"}
    for run_dir, run_id in ((a, run_a), (b, run_b)):
        rec = json.loads((run_dir / "record.json").read_text())
        assert client.get_run(run_id).data.tags["hopperlab.run_uid"] == rec["run_uid"]
        assert json.loads((run_dir / MLFLOW_FILE).read_text())["run_id"] == run_id
    # both folders are complete: a sync of either uploads nothing more
    for folder in ("results-a", "results-b"):
        assert tracking.sync(tmp_path / folder, uri).counts == \
            {"uploaded": 0, "already": 0, "failed": 0}
    assert len(child_runs(client, exp_id, **{"hopperlab.run_key": "fam/copy/h2d#1"})) == 2


def test_a_store_copied_from_another_folder_never_takes_this_folders_runs(tmp_path):
    """Folder A's store, copied for folder B: B's ok run must not be mapped onto A's failed one
    (nor B's failed one onto A's ok one)."""
    store_a, store_b = tmp_path / "a", tmp_path / "b"
    failed_a = make_run(tmp_path / "results-a", "fam", "copy", "h2d", status="failed",
                        reason="boom", final={}, run_uid=uuid.uuid4().hex)
    ok_a = make_run(tmp_path / "results-a", "fam", "copy", "d2h", run_uid=uuid.uuid4().hex)
    assert tracking.sync(tmp_path / "results-a", sqlite_uri(store_a)).counts["uploaded"] == 2
    shutil.copytree(store_a, store_b)
    ok_b = make_run(tmp_path / "results-b", "fam", "copy", "h2d", run_uid=uuid.uuid4().hex)
    failed_b = make_run(tmp_path / "results-b", "fam", "copy", "d2h", status="failed",
                        reason="boom", final={}, run_uid=uuid.uuid4().hex)

    report = tracking.sync(tmp_path / "results-b", sqlite_uri(store_b))
    assert sorted(report.uploaded) == ["fam/copy/d2h#1", "fam/copy/h2d#1"]
    assert report.already == []
    client = mlflow.MlflowClient(sqlite_uri(store_b))
    for run_dir, status in ((ok_b, "FINISHED"), (failed_b, "FAILED")):
        run = client.get_run(json.loads((run_dir / MLFLOW_FILE).read_text())["run_id"])
        assert run.info.status == status
        assert run.data.tags["hopperlab.run_uid"] == \
            json.loads((run_dir / "record.json").read_text())["run_uid"]
    a_ids = {json.loads((d / MLFLOW_FILE).read_text())["run_id"] for d in (failed_a, ok_a)}
    b_ids = {json.loads((d / MLFLOW_FILE).read_text())["run_id"] for d in (ok_b, failed_b)}
    assert not a_ids & b_ids


def _sync_in_a_new_process(results: Path, uri: str) -> dict:
    """`tracking.sync` in a fresh interpreter, as `hopperlab sync` runs (MLflow caches open
    stores per process)."""
    import subprocess
    import sys

    code = ("import json, sys; from pathlib import Path; from hopperlab.results import tracking; "
            "r = tracking.sync(Path(sys.argv[1]), sys.argv[2]); print(json.dumps(r.counts))")
    out = subprocess.run([sys.executable, "-c", code, str(results), uri], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_sync_asks_the_store_not_mlflow_json(tmp_path):
    """`truncate -s 0` of the SQLite store (issue 16, item 7): every run is uploaded again."""
    results, store = tmp_path / "results", tmp_path / "store"
    uri = sqlite_uri(store)
    variants = ("one", "two", "three")
    for v in variants:
        make_run(results, "fam", "copy", v, run_uid=uuid.uuid4().hex)
    # each sync in its own process, as `hopperlab sync` does: the test process opens the store
    # only afterwards (MLflow keeps a process's store open)
    assert _sync_in_a_new_process(results, uri) == {"uploaded": 3, "already": 0, "failed": 0}
    (store / "mlflow.db").write_bytes(b"")  # truncate -s 0

    assert _sync_in_a_new_process(results, uri) == {"uploaded": 3, "already": 0, "failed": 0}
    client = mlflow.MlflowClient(uri)
    exp_id = client.get_experiment_by_name("fam").experiment_id
    kids = child_runs(client, exp_id, **{"hopperlab.uploaded": "true"})
    assert sorted(r.data.tags["hopperlab.variant"] for r in kids) == sorted(variants)
    for run in kids:
        run_dir = results / "fam" / "copy" / run.data.tags["hopperlab.variant"]
        assert json.loads((run_dir / MLFLOW_FILE).read_text())["run_id"] == run.info.run_id


def test_sync_adopts_an_upload_made_before_run_uids(tmp_path):
    """A record without a run uid, uploaded by an older hopperlab (no uid tag, mlflow.json
    without one): sync keeps that MLflow run instead of uploading it twice."""
    results, uri = tmp_path / "results", sqlite_uri(tmp_path / "store")
    run_dir = make_run(results, "fam", "copy", "old")
    run_id = tracking.upload_run(run_dir, uri)
    client = mlflow.MlflowClient(uri)
    client.delete_tag(run_id, "hopperlab.run_uid")  # as the old upload left it
    info = json.loads((run_dir / MLFLOW_FILE).read_text())
    info.pop("run_uid")
    write_json_atomic(run_dir / MLFLOW_FILE, info)

    assert tracking.sync(results, uri).counts == {"uploaded": 0, "already": 1, "failed": 0}
    assert "hopperlab.run_uid" in client.get_run(run_id).data.tags
    assert tracking.sync(results, uri).counts == {"uploaded": 0, "already": 0, "failed": 0}
    exp_id = client.get_experiment_by_name("fam").experiment_id
    assert [r.info.run_id for r in child_runs(client, exp_id, **{"hopperlab.variant": "old"})] \
        == [run_id]


def test_unusable_store_folder_is_unavailable_not_an_oserror(tmp_path):
    """A store whose folder cannot be written (issue 16, item 6): TrackingUnavailable, so that
    the run waits for `hopperlab sync` instead of failing."""
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    run_dir = make_run(tmp_path / "results", "fam", "copy", "h2d")
    with pytest.raises(TrackingUnavailable) as err:
        tracking.upload_run(run_dir, f"sqlite:///{blocker / 'mlflow.db'}")
    assert str(blocker) in str(err.value)
    assert not (run_dir / MLFLOW_FILE).exists()


def test_a_python_without_mlflow_keeps_the_runs_for_a_later_sync(tmp_path, monkeypatch):
    """A lent node that carries only what its runs need (no MLflow): the upload and the
    workflow's sync are TrackingUnavailable, naming why; the run directory is untouched."""
    run_dir = make_run(tmp_path / "results", "fam", "copy", "h2d")
    before = snapshot(run_dir)
    monkeypatch.setitem(sys.modules, "mlflow", None)  # `import mlflow` raises ImportError
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with pytest.raises(TrackingUnavailable, match="mlflow is not installed"):
        tracking.upload_run(run_dir, uri)
    with pytest.raises(TrackingUnavailable, match="mlflow is not installed"):
        tracking.sync(tmp_path / "results", uri)
    assert snapshot(run_dir) == before
    assert not (tmp_path / "mlflow.db").exists()


# -- small pure helpers ----------------------------------------------------------------------------
def test_redact_uri():
    assert tracking.redact_uri("https://alice:s3cret@mlflow.example.org/") == \
        "https://mlflow.example.org"
    assert tracking.redact_uri("http://127.0.0.1:5000") == "http://127.0.0.1:5000"
    assert tracking.redact_uri("sqlite:////tmp/x.db") == "sqlite:////tmp/x.db"


def test_flatten():
    assert tracking.flatten({"a": {"b": 1, "c": [1, 2], "d": {"e": None}}, "f": "x", "g": True}) \
        == {"a.b": "1", "a.c": "[1, 2]", "a.d.e": "null", "f": "x", "g": "true"}


def test_the_ranks_of_a_distributed_run_are_not_runs_of_their_own(tmp_path):
    """ranks/<r>/record.json are rank 0's inputs to the run's record: sync must not count them."""
    from hopperlab.results.tracking.sync import find_run_dirs

    run = tmp_path / "finetune" / "exp" / "two-ranks"
    for rel in ("", "ranks/0", "ranks/1"):
        (run / rel).mkdir(parents=True, exist_ok=True)
        (run / rel / "record.json").write_text("{}")
    assert find_run_dirs(tmp_path) == [run]


# -- issue 28 item 6: two uploaders at once -------------------------------------------------------
def _sync_in_subprocess(results: str, uri: str, out) -> None:
    report = tracking.sync(Path(results), uri, progress=False)
    out.put((len(report.uploaded), len(report.already), [k for k, _ in report.failed]))


def test_two_syncs_at_once_upload_each_run_once_and_delete_nothing(mlflow_uri, tmp_path):
    """Two `hopperlab sync` at once against a server deleted each other's uploads in progress
    (100 runs: 3 uploaded twice, 62 deleted, one sync "48 failed")."""
    family = f"twosync{uid()}"
    results = tmp_path / "results"
    uids = [uuid.uuid4().hex for _ in range(24)]
    for i, run_uid in enumerate(uids):
        make_run(results, family, "e", f"v{i}", run_uid=run_uid, steps=2)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_sync_in_subprocess, args=(str(results), mlflow_uri, out))
             for _ in range(2)]
    for p in procs:
        p.start()
    reports = [out.get(timeout=500) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert all(not failed for _, _, failed in reports), reports
    assert sum(up for up, _, _ in reports) == len(uids), reports
    client = mlflow.MlflowClient(mlflow_uri)
    exp = client.get_experiment_by_name(family)
    from mlflow.entities import ViewType

    every = client.search_runs([exp.experiment_id], run_view_type=ViewType.ALL, max_results=1000)
    children = [r for r in every if r.data.tags.get("hopperlab.run_uid")]
    assert all(r.info.lifecycle_stage == "active" for r in children), \
        [r.info.run_id for r in children if r.info.lifecycle_stage != "active"]
    assert sorted(r.data.tags["hopperlab.run_uid"] for r in children) == sorted(uids)


def test_another_hosts_fresh_upload_in_progress_is_never_deleted(mlflow_uri, tmp_path):
    """Across hosts no lock is shared: a half-done upload that another host started moments ago
    is left to it (a stale one, from an uploader that died, is replaced)."""
    family = f"otherhost{uid()}"
    results = tmp_path / "results"
    fresh, stale = uuid.uuid4().hex, uuid.uuid4().hex
    make_run(results, family, "e", "fresh", run_uid=fresh)
    make_run(results, family, "e", "stale", run_uid=stale)
    tracking.prepare(mlflow_uri, {(family, "e")})
    client = mlflow.MlflowClient(mlflow_uri)
    exp = client.get_experiment_by_name(family)
    now = time.time()
    theirs = {}
    for run_uid, since in ((fresh, now - 5), (stale, now - 7200)):
        theirs[run_uid] = client.create_run(exp.experiment_id, tags={
            "hopperlab.run_uid": run_uid,
            "hopperlab.uploading": f"other-host.example 4242 {since:.0f}"}).info.run_id
    report = tracking.sync(results, mlflow_uri, progress=False)
    assert not report.failed, report.failed
    assert client.get_run(theirs[fresh]).info.lifecycle_stage == "active"
    assert client.get_run(theirs[stale]).info.lifecycle_stage == "deleted"
    assert report.busy == [f"{family}/e/fresh#1"] and report.uploaded == [f"{family}/e/stale#1"]


# -- issue 28 item 7 ------------------------------------------------------------------------------
def test_compare_shows_only_the_runs_of_this_results_folder(mlflow_uri, tmp_path):
    """On a shared server `hopperlab compare` returned runs of two other folders (one a variant
    this folder never ran)."""
    from urllib.parse import unquote

    from tests.helpers import copy_project, edit_yaml, hopperlab

    project = copy_project(tmp_path / "project")
    edit_yaml(project / "configs/sites/local.yaml",
              lambda d: d.update(tracking={"uri": mlflow_uri}))
    experiment = f"faults{uid()}"  # an experiment of its own on the shared server
    edit_yaml(project / "experiments/selftest.yaml", lambda d: d["experiments"].__setitem__(
        experiment, {**d["experiments"]["faults"]}))
    mine = make_run(project / "results", "selftest", experiment, "ok", run_uid=uuid.uuid4().hex)
    ours = tracking.upload_run(mine, mlflow_uri)
    theirs = []
    for other in ("other-a", "other-b"):
        for variant in ("ok", "raises"):
            run_dir = make_run(tmp_path / other, "selftest", experiment, variant,
                               run_uid=uuid.uuid4().hex)
            theirs.append(tracking.upload_run(run_dir, mlflow_uri))
    out = hopperlab(["compare", f"selftest/{experiment}", "--config", "families=selftest"],
                    project)
    assert out.returncode == 0, out.stderr[-2000:]
    url = unquote(out.stdout)
    assert ours in url and not any(run_id in url for run_id in theirs), url
