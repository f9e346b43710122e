"""The run's record made from its ranks' records (``ranks/<r>/record.json``).

Each rank of a distributed run records itself like a one-process run, in ``ranks/<r>/``. The
run's own record is rank 0's figures plus what only all ranks together say: world size and
nodes, per-GPU peak memory max and min, the slowest rank's step and set-up, each node's fingerprint, and
when the run failed, the rank that failed first (not the peers that lost it) with its traceback.
Rank 0 writes it at the end of a run that went well; the submitting side writes it from the
same files when the job ended otherwise. No torch here: both sides import it.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

from hopperlab.core import energy_names as N
from hopperlab.core.rundir import (
    HARDWARE_FILE,
    RECORD_FILE,
    SAMPLES_FILE,
    SETUP_METRIC,
    STEPS_FILE,
    TRACEBACK_FILE,
    read_json,
    write_record,
    write_text_atomic,
)

RANKS_DIR = "ranks"
TASK_FILE = "task.json"
#: a failure that only says a peer went away (gloo, NCCL, the store, the timeout)
PEER_LOST = re.compile(r"gloo|nccl|Connection (closed|reset)|DistBackendError|DistNetworkError|"
                       r"DistStoreError|Broken pipe|timed out|Timeout|ProcessGroup|"
                       r"peer|Socket", re.IGNORECASE)
#: which status a run takes from its ranks, the first found in this order
STATUS_ORDER = ("failed", "timeout", "oom", "skipped", "ok")


def rank_dirs(run_dir: Path) -> dict[int, Path]:
    base = Path(run_dir) / RANKS_DIR
    if not base.is_dir():
        return {}
    return {int(p.name): p for p in sorted(base.iterdir(), key=lambda p: p.name)
            if p.is_dir() and p.name.isdigit()}


def _read(path: Path) -> Any:
    try:
        return read_json(path)
    except (OSError, ValueError):
        return None


def _root_cause(failed: dict[int, dict[str, Any]], dirs: dict[int, Path]) -> int:
    """The rank whose own error ended the run: not one that lost a peer; the earliest."""
    def when(r: int) -> float:
        tb = dirs[r] / TRACEBACK_FILE
        return (tb if tb.exists() else dirs[r] / RECORD_FILE).stat().st_mtime_ns

    own = [r for r, rec in failed.items() if not PEER_LOST.search(str(rec.get("reason") or ""))]
    return min(own or list(failed), key=when)


def _figures(recs: dict[int, dict[str, Any]]) -> dict[str, float]:
    """Across ranks: max and min of each peak-memory metric, the slowest rank's step."""
    out: dict[str, float] = {}
    names = {n for rec in recs.values() for n in rec.get("metrics", {})}
    for name in sorted(names):
        values = [rec["metrics"][name] for rec in recs.values() if name in rec.get("metrics", {})]
        if "peak" in name and name.endswith(("_gb", "_mb", "_bytes")):
            out[f"{name}_max"], out[f"{name}_min"] = max(values), min(values)
        if name in ("step_s", "s_per_iter", "step_ms"):
            out[f"slowest_rank_{name}"] = max(values)
        if name == SETUP_METRIC:  # the run is set up when its last rank is
            out[name] = max(values)
    return out


_GPU_ENERGY = re.compile(rf"(^|_){N.ENERGY_GPU_J}$")
_HOST_ENERGY = re.compile(r"(^|_)energy_(host|module)_j$")


def _energy(recs: dict[int, dict[str, Any]], metrics: dict[str, float],
            tags: dict[str, str]) -> None:
    """Energy of the whole run: each rank measured its own GPU (summed: a rank without a
    figure makes the sum "not measured", never a smaller number) and local rank 0 of each
    node its host (summed over the ranks that measured it); peak power the highest rank's."""
    names = {n for rec in recs.values() for n in rec.get("metrics", {})}
    for name in sorted(names):
        values = [rec["metrics"].get(name) for rec in recs.values()]
        have = [v for v in values if v is not None]
        if _GPU_ENERGY.search(name):
            if len(have) == len(values):
                metrics[name] = sum(have)
            else:
                metrics.pop(name, None)
                lacking = [r for r, rec in recs.items() if name not in rec.get("metrics", {})]
                prefix = name[: -len(N.ENERGY_GPU_J)]
                tags[prefix + N.TAG_GPU] = (f"not measured: ranks {lacking} have no GPU "
                                               "energy (" + "; ".join(
                                                   str(recs[r].get("tags", {}).get(
                                                       prefix + N.TAG_GPU)) for r in lacking)
                                               + ")")[:500]
        elif _HOST_ENERGY.search(name):
            metrics[name] = sum(have)
        elif name.endswith(N.POWER_GPU_PEAK_W):
            metrics[name] = max(have)
        elif name.endswith(N.POWER_GPU_MEAN_W) and len(have) == len(values):
            metrics[name] = sum(have) / len(have)
    _trace_and_label(recs, metrics, tags)


def _trace_and_label(recs: dict[int, dict[str, Any]], metrics: dict[str, float],
                     tags: dict[str, str]) -> None:
    """The run's trace/counter agreement over every rank's GPU (each rank's ratio weighted by
    its joules: the sum of the traces over the sum of the counters), the reason where a rank's
    trace disagrees, and how many GPUs the joules sum (not rank 0's "1 of 2 visible")."""
    if N.ENERGY_GPU_J not in metrics:
        return
    per = {r: rec.get("metrics", {}) for r, rec in recs.items()}
    pairs = [(m.get(N.TRACE_RATIO), m.get(N.ENERGY_GPU_J)) for m in per.values()]
    if all(ratio is not None and j for ratio, j in pairs):
        metrics[N.TRACE_RATIO] = sum(ratio * j for ratio, j in pairs) / sum(
            j for _, j in pairs)  # type: ignore[operator,misc]
        gaps = [m[N.TRACE_MAX_GAP_S] for m in per.values() if N.TRACE_MAX_GAP_S in m]
        if gaps:
            metrics[N.TRACE_MAX_GAP_S] = max(gaps)
    else:
        metrics.pop(N.TRACE_RATIO, None)
    why = [f"rank {r}: {rec['tags'][N.TAG_TRACE]}" for r, rec in sorted(recs.items())
           if N.TAG_TRACE in rec.get("tags", {})]
    if why:
        tags[N.TAG_TRACE] = "; ".join(why)[:500]
    else:
        tags.pop(N.TAG_TRACE, None)
    owned = [re.match(r"(\d+) of", str(rec.get("tags", {}).get(N.TAG_GPUS, "")))
             for rec in recs.values()]
    gpus = sum(int(m.group(1)) for m in owned if m) if all(owned) else None
    tags[N.TAG_GPUS] = (f"{gpus if gpus is not None else 'the'} GPUs summed over {len(recs)} "
                        f"ranks (each rank measured the GPU it used)")


def _on_hosts(ranks_: list[int], tasks: dict[int, dict[str, Any]]) -> str:
    """`` (on n2)`` / `` (on n1, n2)``: where the given ranks ran, as far as their task files
    say (a node that died took its ranks' records with it, not their task files)."""
    hosts = sorted({str(tasks[r]["host"]) for r in ranks_ if tasks.get(r, {}).get("host")})
    return f" (on {', '.join(hosts)})" if hosts else ""


def merged_record(run_dir: Path, attempt: int, world_size: int) -> dict[str, Any] | None:
    """The run's record from its ranks' records of ``attempt`` (None: no rank wrote one)."""
    dirs = rank_dirs(run_dir)
    recs = {r: rec for r, d in dirs.items()
            if (rec := _read(d / RECORD_FILE)) and rec.get("attempt") == attempt}
    if not recs:
        return None
    lead = 0 if 0 in recs else min(recs)
    tasks = {r: _read(dirs[r] / TASK_FILE) or {} for r in dirs}
    status, reason, tb_rank = _verdict(recs, dirs, tasks, lead, world_size)
    hardware = {r: _read(dirs[r] / HARDWARE_FILE) or {} for r in dirs}
    nodes_hw = _hardware_by_node(hardware, tasks)
    rec = dict(recs[lead])
    metrics = dict(rec.get("metrics", {})) if status == "ok" else {}
    if status == "ok":
        metrics.update(_figures(recs))
        _energy(recs, metrics, rec.setdefault("tags", {}))
        metrics.update(world_size=float(world_size), nodes=float(len(nodes_hw) or 1))
    rec.update(status=status, reason=reason, metrics=metrics, world_size=world_size,
               nodes=len(nodes_hw) or 1, hardware=hardware.get(lead) or rec.get("hardware", {}),
               node_hardware=nodes_hw, ranks=_rank_lines(recs, tasks, world_size))
    rec.setdefault("tags", {})["world_size"] = str(world_size)
    if tb_rank is not None and (dirs[tb_rank] / TRACEBACK_FILE).exists():
        rec["traceback_rank"] = tb_rank
    return rec


def _verdict(recs: dict[int, dict[str, Any]], dirs: dict[int, Path], tasks: dict[int, Any],
             lead: int, world_size: int) -> tuple[str, Any, int | None]:
    """(status, reason, the rank whose traceback tells) of the whole run: the worst rank's
    status (a failure's root cause among the failed ranks), ranks that left no record named."""
    status = next(s for s in STATUS_ORDER if any(r.get("status") == s for r in recs.values())
                  or s == "ok")
    missing = sorted(set(range(world_size)) - set(recs))
    lost = _on_hosts(missing, tasks)
    if status != "ok":
        bad = {r: rec for r, rec in recs.items() if rec.get("status") == status}
        tb_rank = _root_cause(bad, dirs) if status == "failed" else min(bad)
        reason = f"rank {tb_rank}: {bad[tb_rank].get('reason')}"
        if missing and PEER_LOST.search(reason):  # the one that died left nothing (killed)
            reason = f"ranks {missing}{lost} of {world_size} left no record (killed?); " + reason
        return status, reason, tb_rank
    if missing:
        return "failed", f"ranks {missing}{lost} of {world_size} left no record", None
    return status, recs[lead].get("reason"), None


def _hardware_by_node(hardware: dict[int, Any], tasks: dict[int, Any]) -> dict[str, Any]:
    """Each node's hardware, as its lowest rank recorded it."""
    nodes_hw: dict[str, Any] = {}
    for r in sorted(hardware):
        host = tasks[r].get("host") or hardware[r].get("hostname") or f"rank{r}"
        nodes_hw.setdefault(host, hardware[r])
    return nodes_hw


def _rank_lines(recs: dict[int, dict[str, Any]], tasks: dict[int, Any],
                world_size: int) -> list[dict[str, Any]]:
    """One line per rank of the record's ``ranks``: host, status and reason (or none left)."""
    return [{"rank": r, "host": tasks.get(r, {}).get("host"),
             "status": recs[r].get("status") if r in recs else None,
             "reason": recs[r].get("reason") if r in recs else "no record"}
            for r in range(world_size)]


def write_run_files(run_dir: Path, rec: dict[str, Any]) -> None:
    """The run-level files from the ranks': record, rank 0's steps, samples (a run measured with
    repeats: what ``references update`` and ``compare`` read, as of a one-process run) and
    hardware, and the failing rank's traceback."""
    run_dir = Path(run_dir)
    dirs = rank_dirs(run_dir)
    lead = dirs.get(0) or next(iter(dirs.values()), None)
    if lead is not None:
        for name in (STEPS_FILE, SAMPLES_FILE, HARDWARE_FILE):
            if (lead / name).exists():
                shutil.copyfile(lead / name, run_dir / name)
    tb_rank = rec.get("traceback_rank")
    if tb_rank is not None:
        host = next((x["host"] for x in rec.get("ranks", []) if x["rank"] == tb_rank), None)
        text = (dirs[tb_rank] / TRACEBACK_FILE).read_text(errors="replace")
        write_text_atomic(run_dir / TRACEBACK_FILE, f"rank {tb_rank} ({host}):\n{text}")
    write_record(run_dir, {k: v for k, v in rec.items() if k != RECORD_FILE})


class HangWatch:
    """Asked while a distributed job runs: a reason to stop it once a rank has failed and
    another has still not ended ``grace_s`` later (a hung rank, not in a collective, would
    otherwise hold the job to its time limit although its peers gave up on it)."""

    def __init__(self, run_dir: Path, attempt: int, world_size: int, grace_s: float) -> None:
        self.run_dir, self.attempt, self.world_size = Path(run_dir), attempt, world_size
        self.grace_s = grace_s
        self._failed_at: float | None = None

    def __call__(self) -> str | None:
        import time

        recs = {}
        for r in range(self.world_size):
            rec = _read(self.run_dir / RANKS_DIR / str(r) / RECORD_FILE)
            if isinstance(rec, dict) and rec.get("attempt") == self.attempt:
                recs[r] = rec
        failed = sorted(r for r, rec in recs.items() if rec.get("status") in ("failed", "timeout"))
        missing = sorted(set(range(self.world_size)) - set(recs))
        if not failed or not missing:
            self._failed_at = None
            return None
        if self._failed_at is None:
            self._failed_at = time.monotonic()
            return None
        if time.monotonic() - self._failed_at < self.grace_s:
            return None
        first = failed[0]
        why = str(recs[first].get("reason") or "")[:200]
        return (f"rank{'s' * (len(missing) > 1)} {', '.join(map(str, missing))} still ran "
                f"{self.grace_s:.0f} s after rank {first} failed ({why}): hung; the job was "
                f"cancelled")
