"""The energy meter: counters at the edges of the measured window, a power trace between.

The runner opens one meter around the workload and listens to ``core.window``: each GPU's
energy counter is read when a window starts and ends (``measured_region()`` has synchronised the
device just before), a sampler thread reads power at ``rate_hz`` for the trace, and the host's
sensors are read alongside. A run whose family opens no window is measured over the whole
workload call, and says so. Repeated windows of one name add up (time and joules).

GPUs: the ones the process used, matched by UUID once torch has CUDA up: in a run of several
ranks the rank's own device, so that ranks sharing a node count each GPU once; in a run of one
process every device torch holds memory on, so that the idle GPUs of a node whose GPUs are all
visible are not counted. Before torch has CUDA up (or without torch): every visible GPU.
"""

from __future__ import annotations

import csv
import io
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence

from hopperlab.core.window import MEASURED
from hopperlab.core import energy_names as N
from hopperlab.node.energy.arithmetic import (
    AGREEMENT_MIN_S,
    COUNTER_UPDATE_S,
    NVML_WRAP_MJ,
    Accumulator,
    Energy,
    counter_delta,
    integrate,
    window_energy,
)
from hopperlab.node.energy.host import HOST_KINDS, HostSensor, host_sensors
from hopperlab.node.energy.nvml import NvmlGpus, torch_device_uuids

#: the window of a run whose family opened none
WORKLOAD = "workload"
DEFAULT_RATE_HZ = 10.0


class GpuSource(Protocol):
    """What the meter reads of the GPUs (``nvml.NvmlGpus``; recorded traces in the tests)."""

    uuids: list[str]
    power_kind: str
    errors: dict[str, str]

    def energy_mj(self, i: int) -> float | None: ...
    def power_w(self, i: int) -> float | None: ...
    def state(self, i: int) -> dict[str, Any]: ...
    def close(self) -> None: ...


@dataclass
class Sample:
    t: float
    gpu_w: dict[str, float | None]
    host_w: dict[str, float | None]


@dataclass
class Window:
    name: str
    t0: float
    gpu0: dict[str, float | None]
    host0: dict[str, float]
    t1: float | None = None
    gpu1: dict[str, float | None] = field(default_factory=dict)
    host1: dict[str, float] = field(default_factory=dict)


@dataclass
class Result:
    """What the meter gives the record."""

    metrics: dict[str, float]
    tags: dict[str, str]
    gpu_state: dict[str, list[dict[str, Any]]]
    trace_csv: str
    windows: list[dict[str, Any]]


class EnergyMeter:
    def __init__(self, gpus: GpuSource | None, gpu_reason: str | None,
                 host: Sequence[HostSensor] = (), host_reason: str | None = None, *,
                 per_rank: bool = False, rate_hz: float = DEFAULT_RATE_HZ,
                 clock: Callable[[], float] = time.monotonic,
                 own_uuids: Callable[[bool], list[str] | None] | None = None) -> None:
        self.gpus, self.gpu_reason = gpus, gpu_reason
        self.host, self.host_reason = list(host), host_reason
        self.per_rank, self.rate_hz, self.clock = per_rank, rate_hz, clock
        self._own_uuids = own_uuids
        self.owned: list[str] | None = None
        self.samples: list[Sample] = []
        self.windows: list[Window] = []
        self._open: dict[str, Window] = {}
        self._acc = {s.name: Accumulator(s.wrap) for s in self.host if s.counter}
        self._prev_host: tuple[float, dict[str, float]] | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.state: dict[str, list[dict[str, Any]]] = {}
        self.t_start = self.clock()

    # -- readings ---------------------------------------------------------------------------
    def _uuids(self) -> list[str]:
        return list(self.gpus.uuids) if self.gpus else []

    def _counters(self) -> dict[str, float | None]:
        return {u: self.gpus.energy_mj(i) for i, u in enumerate(self._uuids())} if self.gpus \
            else {}

    def _host_joules(self) -> dict[str, float]:
        """The counters' running totals in joules (fed now)."""
        with self._lock:
            return {s.name: self._acc[s.name].feed(s.read()) / 1e6 for s in self.host
                    if s.counter}

    def sample(self) -> Sample:
        """One power sample (the sampler thread calls it; tests call it by hand)."""
        t = self.clock()
        gpu_w = {u: self.gpus.power_w(i) for i, u in enumerate(self._uuids())} if self.gpus \
            else {}
        host_w: dict[str, float | None] = {}
        for s in self.host:
            if not s.counter:
                raw = s.read()
                host_w[s.kind] = (host_w.get(s.kind) or 0.0) + raw / 1e6 if raw is not None \
                    else host_w.get(s.kind)
        joules = self._host_joules()
        if joules and self._prev_host is not None and t > self._prev_host[0]:
            dt = t - self._prev_host[0]
            for s in self.host:
                if s.counter and s.name in joules:
                    w = (joules[s.name] - self._prev_host[1].get(s.name, joules[s.name])) / dt
                    host_w[s.kind] = (host_w.get(s.kind) or 0.0) + w
        if joules:
            self._prev_host = (t, joules)
        smp = Sample(t, gpu_w, host_w)
        self.samples.append(smp)
        return smp

    def _states(self) -> list[dict[str, Any]]:
        return [self.gpus.state(i) for i in range(len(self._uuids()))] if self.gpus else []

    # -- the run ----------------------------------------------------------------------------
    def start(self, thread: bool = True) -> "EnergyMeter":
        self.t_start = self.clock()
        self.state["start"] = self._states()
        self.listener("start", WORKLOAD)
        if thread and (self.gpus or self.host):
            self._thread = threading.Thread(target=self._run, name="hopperlab-power",
                                            daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        period = 1.0 / self.rate_hz
        while not self._stop.wait(period):
            self.sample()

    def listener(self, event: str, name: str) -> None:
        """``core.window``'s listener: read the counters at a window's edges."""
        if event == "start":
            if name != WORKLOAD and self.owned is None and self._own_uuids is not None:
                self.owned = self._own_uuids(not self.per_rank)
            self.sample()
            self._open[name] = Window(name, self.clock(), self._counters(), self._host_joules())
        elif event == "end" and name in self._open:
            win = self._open.pop(name)
            win.gpu1, win.host1 = self._counters(), self._host_joules()
            win.t1 = self.clock()
            self.sample()
            self.windows.append(win)

    def finish(self) -> Result:
        """Stop the sampler, close the workload window, and work out the figures."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.owned is None and self._own_uuids is not None:
            self.owned = self._own_uuids(not self.per_rank)
        self.listener("end", WORKLOAD)
        self.state["end"] = self._states()
        try:
            return self._result()
        finally:
            if self.gpus:
                self.gpus.close()

    # -- figures ----------------------------------------------------------------------------
    def _owned_uuids(self) -> list[str]:
        uuids = self._uuids()
        if self.owned:
            mine = [u for u in uuids if any(u.endswith(x) for x in self.owned)]
            return mine or uuids
        return uuids

    def _gpu_energy(self, wins: list[Window], uuid: str, seconds: float) -> Energy:
        counter: float | None = 0.0
        why = None
        for w in wins:
            d = counter_delta(w.gpu0.get(uuid), w.gpu1.get(uuid), NVML_WRAP_MJ)
            if d is None:
                counter, why = None, self._counter_reason()
                break
            counter += d / 1e3  # type: ignore[operator]
        trace = self._trace_j(wins, lambda s: s.gpu_w.get(uuid))
        return window_energy(counter, trace, seconds, why)

    def _counter_reason(self) -> str:
        err = (self.gpus.errors.get("energy") if self.gpus else None) or "no reading"
        return f"NVML energy counter unavailable ({err})"

    def _trace_j(self, wins: list[Window], pick: Callable[[Sample], float | None]
                 ) -> float | None:
        total = 0.0
        for w in wins:
            pts = [(s.t, pick(s)) for s in self.samples]
            j = integrate(pts, w.t0, w.t1 or w.t0)
            if j is None:
                return None
            total += j
        return total

    def _figures(self, wins: list[Window], prefix: str) -> tuple[dict[str, float],
                                                                 dict[str, str]]:
        """The figures of the windows ``wins`` (one name), every key led by ``prefix``."""
        seconds = sum((w.t1 or w.t0) - w.t0 for w in wins)
        metrics: dict[str, float] = {N.ENERGY_WINDOW_S: seconds}
        gpu_metrics, tags = self._gpu_figures(wins, seconds)
        host_metrics, host_tags = self._host_figures(wins, seconds)
        metrics.update(gpu_metrics)
        metrics.update(host_metrics)
        tags.update(host_tags)
        return ({prefix + k: v for k, v in metrics.items()},
                {prefix + k: v for k, v in tags.items()})

    # -- GPU figures --------------------------------------------------------------------------
    def _gpu_figures(self, wins: list[Window], seconds: float
                     ) -> tuple[dict[str, float], dict[str, str]]:
        """The GPUs' energy and power, and whether the trace agrees with the counters."""
        if not self.gpus:
            return {}, {N.TAG_GPU: f"not measured: {self.gpu_reason or 'no NVML'}"}
        per = {u: self._gpu_energy(wins, u, seconds) for u in self._owned_uuids()}
        total, tag = _gpu_total(per)
        metrics: dict[str, float] = {} if total is None else {N.ENERGY_GPU_J: total}
        tags = {N.TAG_GPU: tag}
        metrics.update(self._gpu_power(wins, per, seconds))
        if total is not None:
            agree_metrics, agree_tags = self._agreement(wins, per, seconds, total)
            metrics.update(agree_metrics)
            tags.update(agree_tags)
        return metrics, tags

    def _gpu_power(self, wins: list[Window], per: dict[str, Energy], seconds: float
                   ) -> dict[str, float]:
        """Each GPU's mean (its joules over the window) and peak (its largest sample) power,
        then the mean over the GPUs (only when every GPU has one) and the peak of them all."""
        metrics: dict[str, float] = {}
        means, peaks = [], []
        for n, (u, e) in enumerate(per.items()):
            pts = self._gpu_watts(wins, u)
            if e.joules is not None and seconds > 0:
                metrics[f"power_gpu{n}_mean_w"] = e.joules / seconds
                means.append(e.joules / seconds)
            if pts:
                metrics[f"power_gpu{n}_peak_w"] = max(pts)
                peaks.append(max(pts))
        if means and len(means) == len(per):
            metrics[N.POWER_GPU_MEAN_W] = sum(means) / len(means)
        if peaks:
            metrics[N.POWER_GPU_PEAK_W] = max(peaks)
        return metrics

    def _gpu_watts(self, wins: list[Window], uuid: str) -> list[float]:
        """The GPU's power samples that fall inside one of ``wins``."""
        pts = [s.gpu_w.get(uuid) for s in self.samples
               if any(w.t0 <= s.t <= (w.t1 or w.t0) for w in wins)]
        return [p for p in pts if p is not None]

    def _agreement(self, wins: list[Window], per: dict[str, Energy], seconds: float,
                   total: float) -> tuple[dict[str, float], dict[str, str]]:
        """The integrated trace over the counters (when every GPU's figure is its counter and
        the window is long enough to compare), the sampler's largest gap, and why they
        disagree beyond the tolerance."""
        if seconds < AGREEMENT_MIN_S:
            return {}, {N.TAG_TRACE: _too_short(seconds)}
        if not all(e.source == "counter" for e in per.values()):
            return {}, {}
        traced = [self._trace_j(wins, lambda s, u=u: s.gpu_w.get(u)) for u in per]
        if not all(t is not None for t in traced):
            return {}, {}
        ratio = sum(traced) / total  # type: ignore[arg-type]
        gap = self._max_gap(wins)
        metrics = {N.TRACE_RATIO: ratio, N.TRACE_MAX_GAP_S: gap}
        if abs(ratio - 1) > N.TRACE_TOLERANCE:
            return metrics, {N.TAG_TRACE: _trace_why(ratio, gap, self.rate_hz)}
        return metrics, {}

    # -- host figures -------------------------------------------------------------------------
    def _host_figures(self, wins: list[Window], seconds: float
                      ) -> tuple[dict[str, float], dict[str, str]]:
        """The host's energy (the kinds of ``HOST_KINDS``, summed), its mean power, and the
        Grace module's energy on its own."""
        if not self.host:
            return {}, {N.TAG_HOST: f"not measured: {self.host_reason or 'no sensor'}"}
        by_kind = self._host_by_kind(wins)
        metrics: dict[str, float] = {}
        host = [by_kind[k] for k in HOST_KINDS if k in by_kind]
        if host and all(h is not None for h in host):
            metrics[N.ENERGY_HOST_J] = sum(host)  # type: ignore[arg-type]
            if seconds > 0:
                metrics[N.POWER_HOST_MEAN_W] = metrics[N.ENERGY_HOST_J] / seconds
            tag = ", ".join(sorted({s.kind for s in self.host if s.kind in HOST_KINDS}))
        else:
            tag = "not measured: a host sensor gave no reading"
        if by_kind.get("module") is not None:
            metrics[N.ENERGY_MODULE_J] = by_kind["module"]  # type: ignore[assignment]
        return metrics, {N.TAG_HOST: tag}

    def _host_by_kind(self, wins: list[Window]) -> dict[str, float | None]:
        """Joules per sensor kind over ``wins``: counters by their edge readings, power sensors
        by the trace (None: a kind with a sensor that gave no reading)."""
        by_kind: dict[str, float | None] = {}
        for s in self.host:
            if s.counter:
                j: float | None = sum(w.host1.get(s.name, 0.0) - w.host0.get(s.name, 0.0)
                                      for w in wins)
            else:
                j = self._trace_j(wins, lambda smp, k=s.kind: smp.host_w.get(k))
                if s.kind in by_kind:
                    continue  # power sensors of a kind are summed in the samples already
            prev = by_kind.get(s.kind, 0.0)
            by_kind[s.kind] = None if j is None or prev is None else prev + j
        return by_kind

    def _max_gap(self, wins: list[Window]) -> float:
        """The largest gap between power samples (or a window's edge) inside ``wins``."""
        gap = 0.0
        for w in wins:
            end = w.t1 or w.t0
            ts = [w.t0, *sorted(s.t for s in self.samples if w.t0 <= s.t <= end), end]
            gap = max([gap, *(b - a for a, b in zip(ts, ts[1:]))])
        return gap

    def _result(self) -> Result:
        by_name: dict[str, list[Window]] = {}
        for w in self.windows:
            by_name.setdefault(w.name, []).append(w)
        measured = by_name.get(MEASURED)
        main = measured or by_name.get(WORKLOAD, [])
        metrics, tags = self._figures(main, "")
        metrics[N.ENERGY_WINDOWS] = float(len(main))
        tags[N.TAG_WINDOW] = (
            f"measured: {len(main)} window(s), {metrics[N.ENERGY_WINDOW_S]:.3f} s" if measured
            else f"workload: the whole workload call ({metrics[N.ENERGY_WINDOW_S]:.3f} s; "
                 "the family opened no measured window)")
        for name, wins in by_name.items():
            if name in (MEASURED, WORKLOAD):
                continue
            m, t = self._figures(wins, f"{name}_")
            metrics.update(m)
            tags.update(t)
        tags[N.TAG_SAMPLER] = (f"{self.rate_hz:g} Hz, {len(self.samples)} samples"
                                  + (f", GPU power {self.gpus.power_kind}" if self.gpus else ""))
        if self.gpus:
            mine, seen = len(self._owned_uuids()), len(self._uuids())
            tags[N.TAG_GPUS] = (f"{mine} of {seen} visible"
                                   + (" (the ones torch used)" if self.owned else ""))
        return Result(metrics, tags, self.state, self._trace_csv(), self._windows_json())

    def _trace_csv(self) -> str:
        uuids = self._owned_uuids()
        kinds = sorted({k for s in self.samples for k in s.host_w})
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(["t_s", "window", *(f"gpu{n}_w" for n in range(len(uuids))),
                    *(f"host_{k}_w" for k in kinds)])
        for s in self.samples:
            inside = next((x.name for x in self.windows if x.name != WORKLOAD
                           and x.t0 <= s.t <= (x.t1 or x.t0)), "")
            w.writerow([f"{s.t - self.t_start:.4f}", inside,
                        *(_cell(s.gpu_w.get(u)) for u in uuids),
                        *(_cell(s.host_w.get(k)) for k in kinds)])
        return buf.getvalue()

    def _windows_json(self) -> list[dict[str, Any]]:
        return [{"name": w.name, "start_s": w.t0 - self.t_start,
                 "end_s": (w.t1 or w.t0) - self.t_start, "gpu_counter_mj_start": w.gpu0,
                 "gpu_counter_mj_end": w.gpu1, "host_j_start": w.host0, "host_j_end": w.host1}
                for w in self.windows]


def _gpu_total(per: dict[str, Energy]) -> tuple[float | None, str]:
    """The GPUs' joules (None unless every GPU has a figure) and the tag that says where the
    figures came from, or which GPUs have none and why."""
    missing = [u for u, e in per.items() if e.joules is None]
    if missing:
        return None, "not measured: " + "; ".join(f"{u}: {per[u].note}" for u in missing)
    sources = sorted({e.source for e in per.values()})
    notes = sorted({e.note for e in per.values() if e.note})
    return (sum(e.joules for e in per.values()),  # type: ignore[misc]
            "+".join(sources) + (f" ({'; '.join(notes)})" if notes else ""))


def _trace_why(ratio: float, gap: float, rate_hz: float) -> str:
    """Why the integrated trace and the counter disagree (the counter is the figure)."""
    head = f"trace/counter {ratio:.3f}, beyond {N.TRACE_TOLERANCE:.0%}: "
    if gap > 3 / rate_hz:
        return head + (f"the {rate_hz:g} Hz sampler's largest gap was {gap:.2f} s (the process "
                       f"held the interpreter, e.g. a CPU optimizer step): its samples miss the "
                       f"low-power stretches, so the trace is biased; the counter is the figure")
    return head + (f"the sampler kept its rate (largest gap {gap:.2f} s): power changed faster "
                   f"than {rate_hz:g} Hz sees; the counter is the figure")


def _too_short(seconds: float) -> str:
    """Why counter and trace were not compared: the window is too short for 5 %."""
    return (f"{N.TRACE_NOT_COMPARED}: the window was {seconds:.2f} s, under "
            f"{AGREEMENT_MIN_S:g} s: the counter updates every 20-100 ms, so each edge alone "
            f"may be off by up to {COUNTER_UPDATE_S:g} s of the window's power "
            f"({2 * COUNTER_UPDATE_S / max(seconds, 1e-9):.0%} of it for both); a longer "
            f"window (more measured steps) gets the comparison")


def _cell(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}"


def open_meter(*, per_rank: bool, measure_host: bool,
               rate_hz: float = DEFAULT_RATE_HZ) -> EnergyMeter:
    """A meter on this process's GPUs (NVML) and, where ``measure_host``, the node's host
    sensors (one rank per node measures the host, so that it is counted once)."""
    gpus, why = NvmlGpus.open()
    if measure_host:
        sensors, host_why = host_sensors()
    else:
        sensors, host_why = [], "measured by local rank 0 of this node"
    return EnergyMeter(gpus, why, sensors, host_why, per_rank=per_rank, rate_hz=rate_hz,
                       own_uuids=torch_device_uuids)
