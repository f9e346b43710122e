"""``hopperlab references update RESULTS_DIR``: references written from repeated runs, not by
hand. Each run's samples (``samples.jsonl``) give a metric's median, its relative spread (robust:
1.4826 MAD over the median), the count and the minimum effect: the one asked for (default 5 %),
raised to ``core.effects.NOISE_K`` x the samples' noise so that a metric's own noise cannot fail
a check; a figure the host's CPU drives is written for this host's CPU beside the other CPUs'
(``host_cpu``).

Several folders (``references update A B C``): each folder's run of a key is one independent
process, reduced to the median of its samples, and the reference is made from those medians:
its spread, n and minimum effect are then the spread between processes, which windows inside
one process do not sample (2026-11-28: TPC-H host-pinned q6 read 31.56 ms in three windows
within 0.14 % and 33.3 ms in the next process; a reference of the windows failed it).

The folders must be independent and of one machine (issue 46, D12 and D15): one folder given
twice under two names (a symlink, ``F/../F``, relative and absolute) or a copy of one (the same
run, by its ``run_uid``, else its start time and host) is refused naming both; each folder's
machine is said, and the runs of different machines are never pooled into one reference
unless ``pool_machines`` asks (with ``--machine``). A record whose identity is not a name, or
not its directory's (``results.rows``), is refused with its line; the other runs update.

Which metrics: those the machine's file already references for the run (its selection is kept)
that the family judges, else the run's judged headline metrics (``FamilyInfo.judged``);
diagnostics are never written. Runs of the file that the results folder
does not hold are kept as they were.

A run whose correctness verdict reads ``DIFFERENT`` (``results.correctness``: it computed
something else than the run it is compared with, e.g. a variant whose backward never ran and
reads "2x faster") is refused: no entry from it in any folder, one line naming the run and
its verdict (``UpdateReport.refused``), its existing entry kept; the command exits 1 on it
(docs/commands.md#references). A reference of such a run would make every later honest run
of it read as a regression.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from hopperlab.core.effects import DEFAULT_MIN_EFFECT, min_effect_for
from hopperlab.core.errors import SpecError
from hopperlab.core.locks import folder_held
from hopperlab.core.run_key import key_problem
from hopperlab.core.rundir import (SAMPLES_FILE, finite_samples, read_process_samples,
                                   read_samples, write_text_atomic)
from hopperlab.core.schema import load_yaml
from hopperlab.core.stats import aggregate_samples, percentile, robust_spread
from hopperlab.node.hardware import host_cpu
from hopperlab.results import correctness
from hopperlab.results.machines import references as refs_mod
from hopperlab.results.rows import RunRow, read_runs

#: samples a reference needs: fewer give a spread that is mostly luck
MIN_SAMPLES = 3
#: the one comment line this tool writes (and rewrites at its next update: the same day's folders
#: are kept in it, an older day's line is replaced); a person's own lines, an "Updated ..."
#: paragraph of theirs included, are kept as they are
TOOL_LINE = re.compile(r"^# Updated (\d{4}-\d{2}-\d{2}) by ((?:`hopperlab references update "
                       r"[^`]*`(?: and )?)+)\.$")
_TOOL_FOLDER = re.compile(r"`hopperlab references update ([^`]*)`")
#: a metric name written without quotes
_METRIC = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*")


@dataclass
class UpdateReport:
    written: dict[str, Path]          # machine -> file
    updated: list[str]                # "machine run metric"
    skipped: list[str]                # why a run gave no reference
    #: each folder as given -> the machines its ok runs recorded
    machines: dict[str, list[str]] = field(default_factory=dict)
    #: the runs (one folder) whose references came from one process's windows, not processes
    from_windows: list[str] = field(default_factory=list)
    #: the runs refused because they read DIFFERENT (``refused_line``): no entry from them
    refused: list[str] = field(default_factory=list)


#: a metric's samples for a reference, each checked (``_values``)
Getter = Callable[[str], list[float]]


def _metrics_for(row: RunRow, existing: Mapping[str, Any]) -> list[str]:
    named = existing.get(row.key)
    if isinstance(named, Mapping) and named:
        return [str(m) for m in named if refs_mod.judged(row.family, str(m))]
    return [m for m in row.headline_metrics
            if refs_mod.direction(row.family, m) is not None and not m.endswith("_n")
            and refs_mod.judged(row.family, m) and m in row.metrics]


def _entry(row: RunRow, metric: str, values: list[float], min_effect: float,
           results: list[Path], today: str) -> dict[str, Any]:
    cpu = host_cpu(row.hardware) if refs_mod.cpu_driven(row.family, metric) else None
    spread = robust_spread(values, f"{row.key} {metric}")
    where = ", ".join(f"{r.name}/{row.key}" for r in results)
    if len(results) > 1:
        what = (f"{len(values)} independent runs (one process each, its samples reduced to "
                f"their median)")
    elif _by_process(row):
        what = (f"{len(values)} independent processes (each one's windows reduced to their "
                f"median)")
    else:
        what = f"{len(values)} repeats ({row.tags.get('repeat_unit', 'reruns')})"
    entry: dict[str, Any] = {
        "value": percentile(values, 50), "spread": spread, "n": len(values),
        "min_effect": min_effect,
        "source": f"median of {what}, measured {today} on "
                  f"{row.hardware.get('gpu_model') or 'no GPU'}, host "
                  f"{host_cpu(row.hardware)} ({where}); written by `hopperlab references "
                  f"update`"}
    if cpu:
        entry["host_cpu"] = cpu
    return entry


def _merge(old: Any, new: dict[str, Any]) -> list[dict[str, Any]]:
    """The metric's references with ``new`` in place of the one of its host CPU."""
    items = old if isinstance(old, list) else [old] if isinstance(old, Mapping) else []
    kept = [dict(i) for i in items if isinstance(i, Mapping)
            and i.get("host_cpu") != new.get("host_cpu")
            and not (new.get("host_cpu") and i.get("host_cpu") is None and "spread" not in i)]
    return kept + [new]


def update(results: Path | Sequence[Path], refs_dir: Path, machine: str | None = None,
           min_effect: float | None = None, today: str | None = None,
           pool_machines: bool = False) -> UpdateReport:
    """Write (or update) ``refs_dir/<machine>.yaml`` from the ok runs under ``results`` (one
    folder: each run's processes when it ran in ``MIN_SAMPLES`` or more, else its samples;
    several: one sample per folder holding the run, the median of its samples, and a run
    needs ``MIN_SAMPLES`` folders).

    A machine is a name, never a path (``check``'s rule): ``--machine ../x`` is refused, a
    record whose machine is not a name is skipped. Every sample must be a finite positive
    number, else nothing is written. Each file is read, merged and replaced under a lock on
    the folder (concurrent updates keep every run) and replaced only by a file that loads.
    In four steps: the folders read once, every sample checked, each file merged, written."""
    today = today or date.today().isoformat()
    _check_arguments(machine, pool_machines, refs_dir)
    folders = [Path(results)] if isinstance(results, (str, Path)) else [Path(r) for r in results]
    _refuse_twice(folders)
    report = UpdateReport({}, [], [])
    by_machine = _read(folders, machine, pool_machines, report)
    values = {(name, key): _pooled([r for _, r in same], len(folders) > 1)
              for name, keys in by_machine.items() for key, same in keys.items()}
    _check_samples(by_machine, values, refs_dir)
    floor = DEFAULT_MIN_EFFECT if min_effect is None else min_effect
    for name, keys in by_machine.items():
        refs_dir.mkdir(parents=True, exist_ok=True)
        path = refs_dir / f"{name}.yaml"
        with folder_held(refs_dir):
            data = load_yaml(path, "references") if path.is_file() else {}
            body = dict(data.get("references") or {})
            merge = _Merge(name, folders, machine, floor, today, report)
            if not merge.into(body, keys, values):
                continue
            text = _header(path) + tool_line(today, [*_folders_of(path, today),
                                                     " ".join(map(str, folders))])
            _replace_checked(path, text + _dump(name, body))
        report.written[name] = path
    return report


#: machine -> run key -> (folder, run) of the key, one per folder (the first names the entry)
ByMachine = dict[str, dict[str, list[tuple[Path, RunRow]]]]


def _check_arguments(machine: str | None, pool_machines: bool, refs_dir: Path) -> None:
    if machine is not None and not refs_mod.MACHINE_NAME.fullmatch(machine):
        raise SpecError(f"--machine {machine!r}: not a machine name (letters, digits and . _ + "
                        f"-, no path): references are {refs_dir}/<machine>.yaml")
    if pool_machines and machine is None:
        raise SpecError("references update --pool-machines: give --machine, the one machine "
                        "the pooled folders' references are for")


def _read(folders: list[Path], machine: str | None, pool_machines: bool,
          report: UpdateReport) -> ByMachine:
    """Every folder's ok runs, read once, grouped by machine and key; the folders checked to
    be independent and (unless pooled) of one machine."""
    runs_of: dict[Path, list[RunRow]] = {}
    for f in folders:
        found, refused = read_runs(f)
        report.skipped += refused
        runs_of[f] = [r for r in found if r.status == "ok"]
    for folder, found in runs_of.items():
        if not found:
            raise SpecError(f"{folder}: no run ended ok: nothing to take references from")
        report.machines[str(folder)] = sorted({r.machine or "unknown" for r in found})
    if len(folders) > 1:
        _refuse_copies(runs_of)
    wrong = _refuse_different(runs_of, report)
    recorded = {m for ms in report.machines.values() for m in ms}
    if machine is not None and len(recorded) > 1 and not pool_machines:
        raise SpecError(f"references update --machine {machine}: the folders hold runs of "
                        f"{len(recorded)} machines ({_machines_said(report.machines)}): a "
                        f"reference pools runs of one machine; give one machine's folders, or "
                        f"--pool-machines to take them all as {machine}'s")
    by_machine: ByMachine = {}
    for folder, found in runs_of.items():
        for r in found:
            if r.key in wrong:
                continue
            name = machine or r.machine or "unknown"
            if not refs_mod.MACHINE_NAME.fullmatch(name):
                report.skipped.append(f"{r.key}: its record's machine {name!r} is not a machine "
                                      f"name (letters, digits and . _ + -, no path): give "
                                      f"--machine")
                continue
            by_machine.setdefault(name, {}).setdefault(r.key, []).append((folder, r))
    return by_machine


def _check_samples(by_machine: ByMachine, values: Mapping[tuple[str, str], Getter],
                   refs_dir: Path) -> None:
    """Every sample of every metric to be written checked before any file is touched."""
    for name, keys in by_machine.items():
        path = refs_dir / f"{name}.yaml"
        data = load_yaml(path, "references") if path.is_file() else {}
        body = data.get("references") if isinstance(data, Mapping) else None
        for key, same in keys.items():
            for metric in _metrics_for(same[0][1], body if isinstance(body, Mapping) else {}):
                values[name, key](metric)


@dataclass
class _Merge:
    """One machine's new entries merged into its file's ``references`` body."""

    name: str
    folders: list[Path]
    machine: str | None
    floor: float
    today: str
    report: UpdateReport

    def into(self, body: dict[str, Any], keys: Mapping[str, list[tuple[Path, RunRow]]],
             values: Mapping[tuple[str, str], Getter]) -> bool:
        """Merge every run of ``keys`` into ``body``; whether anything changed."""
        changed = False
        for key, same in keys.items():
            row = same[0][1]
            for metric in _metrics_for(row, body):
                got = values[self.name, key](metric)
                if len(got) < MIN_SAMPLES:
                    self.report.skipped.append(
                        f"{row.key} {metric}: {len(got)} sample(s); a reference needs "
                        f"{MIN_SAMPLES} or more: {self._how(same)}")
                    continue
                old_runs = body.setdefault(row.key, {})
                new = _entry(row, metric, got, min_effect_for(got, self.floor),
                             [f for f, _ in same], self.today)
                merged = _merge(old_runs.get(metric), new)
                old_runs[metric] = merged[0] if len(merged) == 1 else merged
                self.report.updated.append(f"{self.name} {row.key} {metric}")
                if len(self.folders) == 1 and not _by_process(row):
                    self.report.from_windows.append(row.key)
                changed = True
        return changed

    def _how(self, same: list[tuple[Path, RunRow]]) -> str:
        if len(self.folders) == 1:
            return ("run it in independent processes (--config processes=3), or with "
                    "repeats (--config repeats=N)")
        return _where_it_ran(self.name, [f for f, _ in same], self.folders,
                             self.report.machines, self.machine)


def _refuse_twice(folders: Sequence[Path]) -> None:
    """One folder named twice (a symlink to it, ``F/../F``, relative and absolute) is one
    process counted twice: refused, both names said."""
    seen: dict[Path, Path] = {}
    for f in folders:
        real = f.resolve()
        if real in seen:
            raise SpecError(f"references update: {seen[real]} and {f} are one folder given "
                            f"twice ({real}): each folder counts as one independent run; give "
                            f"it once")
        seen[real] = f


def _run_identity(row: RunRow) -> str | None:
    """What makes a run this one and no other: its ``run_uid``, else its start and host."""
    if row.run_uid:
        return f"run_uid {row.run_uid}"
    if row.started_at:
        return f"started {row.started_at} on {row.hostname or 'an unnamed host'}"
    return None


def _refuse_copies(runs_of: Mapping[Path, list[RunRow]]) -> None:
    """A folder copied (``cp -a``) holds the same runs as the original: not independent."""
    seen: dict[tuple[str, str], Path] = {}
    for folder, rows in runs_of.items():
        for r in rows:
            ident = _run_identity(r)
            if ident is None:
                continue
            first = seen.setdefault((r.key, ident), folder)
            if first != folder:
                raise SpecError(f"references update: {first} and {folder} hold the same run of "
                                f"{r.key} ({ident}): a copy of a folder is not an independent "
                                f"run; give folders of separate runs")


def refused_line(row: RunRow, folder: Path) -> str:
    """``KEY in FOLDER: DIFFERENT against X: detail``: why a run gave no reference."""
    v = row.correctness
    return (f"{row.key} in {folder}: {v.state} against {v.against}: {v.detail}: it computed "
            f"something else, no reference from it (the existing entry is kept)")


def _refuse_different(runs_of: Mapping[Path, list[RunRow]], report: UpdateReport) -> set[str]:
    """The keys of the runs that read DIFFERENT in any folder, each said once per folder: none
    of their folders' runs makes a reference (a process that computed something else is no
    sample of the variant)."""
    wrong: set[str] = set()
    for folder, rows in runs_of.items():
        for r in rows:
            if not correctness.offered(r):
                report.refused.append(refused_line(r, folder))
                wrong.add(r.key)
    return wrong


def _machines_said(machines: Mapping[str, list[str]]) -> str:
    return ", ".join(f"{f}: {' and '.join(ms)}" for f, ms in machines.items())


def _where_it_ran(name: str, held: Sequence[Path], folders: Sequence[Path],
                  machines: Mapping[str, list[str]], given: str | None) -> str:
    """Which of this machine's folders held the run and which did not, and the folders of
    other machines (never pooled with these)."""
    mine = [f for f in folders if given or name in machines[str(f)]]
    lacking = [str(f) for f in mine if f not in held]
    other = [f"{f} ({' and '.join(machines[str(f)])})" for f in folders if f not in mine]
    return (f"it ran in {len(held)} of the {len(mine)} folders of machine {name}"
            + (f"; not in {', '.join(lacking)}" if lacking else "")
            + (f"; folders of other machines are not pooled: {', '.join(other)}" if other
               else ""))


def _by_process(row: RunRow) -> bool:
    """Whether the run's one folder holds ``MIN_SAMPLES`` or more independent processes."""
    return len(read_process_samples(row.run_dir)) >= MIN_SAMPLES


def _pooled(runs: list[RunRow], per_process: bool) -> Getter:
    """A metric's samples for a reference: the one run's samples, or (``per_process``, the
    runs of several folders) one sample per run, the median of its own."""
    getters = [_values(r) for r in runs]
    if not per_process:
        return getters[0]

    def get(metric: str) -> list[float]:
        return [percentile(got, 50) for got in (g(metric) for g in getters) if got]

    return get


def _values(row: RunRow) -> Callable[[str], list[float]]:
    """A metric's samples of ``row`` (its one value when it has none), each checked: a
    sample that is not a finite positive number refuses the update (a reference of it would
    never load, or would fail every later check)."""
    groups = read_process_samples(row.run_dir)
    if len(groups) >= MIN_SAMPLES:  # processes: one sample each, the median of its windows
        samples = [aggregate_samples(g, ()) for g in groups]
    else:  # one process's windows (of a run of fewer processes: its first's)
        samples = groups[0] if groups else read_samples(row.run_dir)
    where = Path(row.run_dir) / SAMPLES_FILE

    def get(metric: str) -> list[float]:
        if samples:
            got = finite_samples(row.run_dir, samples, metric)
        else:
            one = row.metrics.get(metric)
            got = [] if one is None else [float(one)]
            if got and not math.isfinite(got[0]):
                raise SpecError(f"{Path(row.run_dir) / 'metrics.json'}: {metric} is {one!r}, "
                                f"not a finite number: no reference written")
        bad = [v for v in got if v <= 0]
        if bad:
            raise SpecError(f"{where}: {metric}: {len(bad)} sample(s) <= 0 (the first "
                            f"{bad[0]:g}): a reference is a positive figure; no reference "
                            f"written, the references files are as they were")
        return got

    return get


def _replace_checked(path: Path, text: str) -> None:
    """``path`` replaced by ``text`` only if that loads as a references file (strictly, under
    its final name, in a hidden folder beside it), then moved into place at once: a reader
    sees the old file or the new one, never a broken or half-written one."""
    tmp_dir = Path(tempfile.mkdtemp(prefix=f".{path.stem}.update-", dir=path.parent))
    try:
        tmp = tmp_dir / path.name
        write_text_atomic(tmp, text)
        try:
            refs_mod.load_references(tmp)
        except SpecError as exc:
            raise SpecError(f"{path}: not replaced: the updated references would not load: "
                            f"{str(exc).replace(str(tmp), str(path))}") from None
        os.replace(tmp, path)
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)



def tool_line(day: str, folders: list[str]) -> str:
    """This tool's comment line: the day and every folder that day's updates read, in order."""
    once = list(dict.fromkeys(folders))
    return (f"# Updated {day} by "
            + " and ".join(f"`hopperlab references update {f}`" for f in once) + ".\n")


def _folders_of(path: Path, day: str) -> list[str]:
    """The folders of ``path``'s own tool line when it is of ``day`` (else none: an older
    update's line is replaced, its entries keep their own ``source``)."""
    if not path.is_file():
        return []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        found = TOOL_LINE.match(line)
        if found and found.group(1) == day:
            return _TOOL_FOLDER.findall(found.group(2))
    return []


def _header(path: Path) -> str:
    """The file's leading comment lines (kept: they say where the figures come from)."""
    if not path.is_file():
        return ("# References written from repeated runs by `hopperlab references update` "
                "(docs/benchmarks/noise.md):\n# value (median), spread (relative, of one sample),"
                " n (samples), min_effect (the smallest change\n# worth reporting), host_cpu "
                "(figures the host's CPU drives).\n")
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        if not TOOL_LINE.match(line):
            lines.append(line)
    return "\n".join(lines) + "\n" if lines else ""


def _flow(entry: Mapping[str, Any]) -> str:
    parts = []
    for k, v in entry.items():
        if isinstance(v, str):
            parts.append(f"{k}: {json.dumps(v)}")
        elif isinstance(v, float):
            parts.append(f"{k}: {v:.6g}")
        else:
            parts.append(f"{k}: {v}")
    return "{" + ", ".join(parts) + "}"


def _name(key: str, plain: bool) -> str:
    """A mapping key as written: plain when it is a name (or a run key of names), else quoted
    (a hand-written glob, an odd metric), so that no key can become lines of its own."""
    return key if plain else json.dumps(key)


def _dump(machine: str, body: Mapping[str, Any]) -> str:
    out = [f"machine: {machine}", "references:"]
    for run in sorted(body):
        out.append(f"  {_name(run, key_problem(run) is None)}:")
        for metric, ref in body[run].items():
            metric = _name(str(metric), _METRIC.fullmatch(str(metric)) is not None)
            if isinstance(ref, list):
                out.append(f"    {metric}:")
                out.extend(f"      - {_flow(r)}" for r in ref)
            else:
                out.append(f"    {metric}: {_flow(ref)}")
    return "\n".join(out) + "\n"
