"""Energy over the measured window (issue 30): counters, the power trace, host sensors, ranks.

Everything runs on recorded readings: a GPU source that replays a trace, and sensor trees under
tests/fixtures/energy copied to a temporary folder (values move by rewriting the files).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from hopperlab.core import window
from hopperlab.node.energy import arithmetic as ar
from hopperlab.node.energy.host import grace_sensors, host_sensors, rapl_sensors
from hopperlab.node.energy.meter import EnergyMeter
from hopperlab.node.energy.nvml import visible

FIXTURES = Path(__file__).parents[1] / "fixtures" / "energy"


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class ReplayGpus:
    """GPUs whose counters and power follow recorded functions of the clock."""

    power_kind = "instant"

    def __init__(self, clock: Clock, watts: list[float], counters: list | None = None) -> None:
        self.clock, self.watts = clock, watts
        self.uuids = [f"GPU-000{i}" for i in range(len(watts))]
        self.errors: dict[str, str] = {}
        self.counters = counters or [None] * len(watts)
        self.closed = False

    def energy_mj(self, i: int) -> float | None:
        c = self.counters[i]
        if c == "missing":
            self.errors["energy"] = "NVMLError_NotSupported: Not Supported"
            return None
        if c == "stuck":
            return 5_000.0
        start = c if isinstance(c, int) else 10**9
        return (start + round(self.watts[i] * (self.clock.t - 100.0) * 1e3)) % ar.NVML_WRAP_MJ

    def power_w(self, i: int) -> float | None:
        return self.watts[i]

    def state(self, i: int) -> dict:
        return {"index": i, "uuid": self.uuids[i], "power_limit_w": 700.0, "sm_clock_mhz": 1980,
                "mem_clock_mhz": 2619, "temperature_c": round(40 + self.clock.t - 100)}

    def close(self) -> None:
        self.closed = True


def _measure(meter: EnergyMeter, clock: Clock, seconds: float, name: str = "measured",
             step: float = 0.1, warm: float = 1.0):
    """Warm-up, then a window of ``seconds`` sampled every ``step``, then finish."""
    meter.start(thread=False)
    clock.t += warm
    with window.listening(meter.listener), window.window(name):
        for _ in range(round(seconds / step)):
            clock.t += step
            meter.sample()
    clock.t += 0.5
    return meter.finish()


# ----------------------------------------------------------------------------- arithmetic
def test_a_wrapped_nvml_counter_counts_across_the_wrap():
    start = ar.NVML_WRAP_MJ - 5_000
    assert ar.counter_delta(start, 3_000, ar.NVML_WRAP_MJ) == 8_000
    assert ar.counter_delta(10, 3, None) is None  # a decrease without a known wrap: no figure
    assert ar.counter_delta(None, 3, ar.NVML_WRAP_MJ) is None


def test_rapl_read_often_counts_several_wraps():
    acc = ar.Accumulator(wrap=1000.0)
    for raw in (900, 100, 600, 50, 400):  # wraps twice: 200 + 500 + 450 + 350
        acc.feed(raw)
    assert acc.total == 1500.0
    assert acc.lost == 0


def test_the_trace_integrates_with_interpolated_edges():
    flat = [(t / 10, 500.0) for t in range(0, 41)]
    assert ar.integrate(flat, 1.0, 3.0) == pytest.approx(1000.0)
    ramp = [(0.0, 0.0), (2.0, 200.0)]
    assert ar.integrate(ramp, 0.5, 1.5) == pytest.approx(100.0)
    assert ar.integrate([(0.0, 100.0)], 0.0, 1.0) is None  # one sample is no integral
    assert ar.integrate(flat, 2.0, 2.0) is None


def test_window_energy_trusts_the_counter_and_says_why_not():
    assert ar.window_energy(1000.0, 990.0, 2.0) == ar.Energy(1000.0, "counter")
    stuck = ar.window_energy(0.0, 990.0, 2.0)
    assert (stuck.joules, stuck.source) == (990.0, "trace") and "did not move" in stuck.note
    short = ar.window_energy(0.0, 9.0, 0.05)
    assert short.source == "trace" and "update period" in short.note
    reset = ar.window_energy(1e9, 990.0, 2.0)
    assert reset.joules == 990.0 and "reset" in reset.note
    missing = ar.window_energy(None, None, 2.0, "NVML energy counter unavailable")
    assert missing.joules is None and missing.source == "not measured"
    assert ar.window_energy(0.0, None, 2.0).joules is None  # never 0 J for "unknown"


# ----------------------------------------------------------------------------- the meter
def test_counter_and_trace_agree_over_the_measured_window():
    clock = Clock()
    gpus = ReplayGpus(clock, [600.0, 300.0])
    res = _measure(EnergyMeter(gpus, None, clock=clock), clock, 3.0)
    m = res.metrics
    assert m["energy_window_s"] == pytest.approx(3.0)
    assert m["energy_gpu_j"] == pytest.approx(3.0 * 900.0)
    assert m["power_gpu0_mean_w"] == pytest.approx(600.0)
    assert m["power_gpu_peak_w"] == 600.0
    assert m["energy_gpu_trace_ratio"] == pytest.approx(1.0, abs=0.05)
    assert res.tags["energy.gpu"] == "counter"
    assert res.tags["energy.window"].startswith("measured: 1 window")
    assert res.gpu_state["start"][0]["power_limit_w"] == 700.0
    assert res.gpu_state["end"][0]["temperature_c"] > res.gpu_state["start"][0]["temperature_c"]
    assert gpus.closed
    assert res.trace_csv.splitlines()[0] == "t_s,window,gpu0_w,gpu1_w"


def test_a_counter_across_nvml_wrap_still_gives_the_energy():
    clock = Clock()
    gpus = ReplayGpus(clock, [500.0], counters=[ar.NVML_WRAP_MJ - 700_000])
    res = _measure(EnergyMeter(gpus, None, clock=clock), clock, 2.0)
    assert res.metrics["energy_gpu_j"] == pytest.approx(1000.0)
    assert res.tags["energy.gpu"] == "counter"


def test_a_stuck_counter_falls_back_to_the_trace_and_says_so():
    clock = Clock()
    gpus = ReplayGpus(clock, [400.0], counters=["stuck"])
    res = _measure(EnergyMeter(gpus, None, clock=clock), clock, 2.0)
    assert res.metrics["energy_gpu_j"] == pytest.approx(800.0)
    assert "did not move" in res.tags["energy.gpu"]
    assert "energy_gpu_trace_ratio" not in res.metrics


def test_a_missing_energy_sensor_uses_the_trace():
    clock = Clock()
    gpus = ReplayGpus(clock, [250.0], counters=["missing"])
    res = _measure(EnergyMeter(gpus, None, clock=clock), clock, 2.0)
    assert res.metrics["energy_gpu_j"] == pytest.approx(500.0)
    assert res.tags["energy.gpu"].startswith("trace (NVML energy counter unavailable")


def test_a_rank_without_nvml_reads_not_measured_never_zero():
    clock = Clock()
    res = _measure(EnergyMeter(None, "nvidia-ml-py (pynvml) is not installed", clock=clock),
                   clock, 2.0)
    assert "energy_gpu_j" not in res.metrics and "power_gpu_mean_w" not in res.metrics
    assert res.tags["energy.gpu"] == "not measured: nvidia-ml-py (pynvml) is not installed"
    assert res.metrics["energy_window_s"] == pytest.approx(2.0)


def test_no_measured_window_measures_the_workload_and_says_so():
    clock = Clock()
    meter = EnergyMeter(ReplayGpus(clock, [100.0]), None, clock=clock).start(thread=False)
    for _ in range(30):
        clock.t += 0.1
        meter.sample()
    res = meter.finish()
    assert res.tags["energy.window"].startswith("workload: the whole workload call")
    assert res.metrics["energy_gpu_j"] == pytest.approx(300.0)


def test_a_named_window_has_its_own_figures():
    clock = Clock()
    res = _measure(EnergyMeter(ReplayGpus(clock, [80.0]), None, clock=clock), clock, 2.0,
                   name="duckdb")
    assert res.metrics["duckdb_energy_gpu_j"] == pytest.approx(160.0)
    assert res.metrics["duckdb_energy_window_s"] == pytest.approx(2.0)
    assert res.tags["energy.window"].startswith("workload")


def test_a_rank_counts_only_its_own_gpu():
    clock = Clock()
    gpus = ReplayGpus(clock, [600.0, 100.0])
    meter = EnergyMeter(gpus, None, clock=clock, per_rank=True,
                        own_uuids=lambda all_devices: ["0001"])  # torch's UUID has no "GPU-"
    res = _measure(meter, clock, 2.0)
    assert res.metrics["energy_gpu_j"] == pytest.approx(200.0)


def test_a_listener_that_raises_never_breaks_the_run():
    def bad(event, name):
        raise RuntimeError("sensor gone")

    with window.listening(bad), window.window():
        pass
    assert window.errors() == ["start measured: RuntimeError: sensor gone",
                               "end measured: RuntimeError: sensor gone"]


# ----------------------------------------------------------------------------- host sensors
def _tree(tmp_path: Path, name: str) -> Path:
    dst = tmp_path / name
    shutil.copytree(FIXTURES / name, dst)
    return dst


def test_rapl_package_and_dram_across_the_package_wrap(tmp_path):
    root = _tree(tmp_path, "rapl")
    sensors, why = rapl_sensors(root)
    assert why is None
    assert sorted(s.kind for s in sensors) == ["dram", "package"]  # core is inside the package
    clock = Clock()
    meter = EnergyMeter(None, "no NVML", sensors, clock=clock)
    pkg, dram = root / "intel-rapl:0" / "energy_uj", root / "intel-rapl:0:0" / "energy_uj"
    meter.start(thread=False)
    with window.listening(meter.listener), window.window():
        # package from 262_100_000_000 uJ: +43 J, then past its wrap at 262_143_328_850: 100 J
        for value, d in ((262_143_000_000, 2_000_000), (56_671_150, 21_000_000)):
            clock.t += 1.0
            pkg.write_text(str(value))
            dram.write_text(str(d))
            meter.sample()
    res = meter.finish()
    assert res.metrics["energy_host_j"] == pytest.approx(100.0 + 20.0)
    assert res.metrics["power_host_mean_w"] == pytest.approx(60.0)
    assert res.tags["energy.host"] == "dram, package"


def test_rapl_readable_by_root_only_says_so(tmp_path):
    sensors, why = rapl_sensors(_tree(tmp_path, "rapl-root-only"))
    assert sensors == [] and "root only" in why
    sensors, why = host_sensors(tmp_path / "none", tmp_path / "none")
    assert sensors == [] and "no RAPL zones" in why and "no " in why.split(";")[1]


def test_grace_sensors_make_the_host_and_keep_the_module_apart(tmp_path):
    root = _tree(tmp_path, "hwmon")
    sensors, why = grace_sensors(root)
    assert why is None
    assert sorted(s.kind for s in sensors) == ["cpu", "grace", "module", "sysio"]
    clock = Clock()
    res = _measure(EnergyMeter(None, "no NVML", sensors, clock=clock), clock, 2.0)
    assert res.metrics["energy_host_j"] == pytest.approx(2.0 * 152.0)  # Grace socket only
    assert res.metrics["energy_module_j"] == pytest.approx(2.0 * 612.0)
    assert res.tags["energy.host"] == "grace"


def test_a_missing_grace_sensor_is_left_out(tmp_path):
    root = _tree(tmp_path, "hwmon")
    (root / "hwmon1" / "power1_average").unlink()
    sensors, _ = grace_sensors(root)
    assert "grace" not in {s.kind for s in sensors}
    clock = Clock()
    res = _measure(EnergyMeter(None, "no NVML", sensors, clock=clock), clock, 2.0)
    assert "energy_host_j" not in res.metrics  # module alone is not the host's energy
    assert res.metrics["energy_module_j"] == pytest.approx(2.0 * 612.0)


def test_cuda_visible_devices_picks_nvml_devices():
    uuids = ["GPU-aaa", "GPU-bbb", "GPU-ccc"]
    assert visible(uuids, None) == [0, 1, 2]
    assert visible(uuids, "2,0") == [2, 0]
    assert visible(uuids, "GPU-bbb") == [1]
    assert visible(uuids, "7") == []


# ----------------------------------------------------------------------------- the runner
def test_every_run_through_the_runner_carries_its_energy_record(tmp_path, monkeypatch):
    """A run on a node without NVML: the window and its length are recorded, GPU energy reads
    "not measured" (no 0), the trace and windows are artifacts, GPU state has its slot."""
    from dataclasses import replace

    from hopperlab.config.matrix import load_matrix
    from hopperlab.core.rundir import load_record, write_json_atomic
    from hopperlab.run.runner import ENERGY_WINDOWS, POWER_TRACE, execute

    monkeypatch.setitem(__import__("sys").modules, "pynvml", None)  # import fails: no NVML
    root = Path(__file__).resolve().parents[2]
    spec = load_matrix(root, {"families": ["selftest"], "scale": "smoke"}).runs[
        "selftest/faults/ok"]
    run_dir = tmp_path / "selftest" / "faults" / "ok"
    spec = replace(spec, run_dir=str(run_dir))
    data = spec.to_dict()
    data["attempt"] = 1
    write_json_atomic(run_dir / "spec.json", data)
    execute(str(run_dir / "spec.json"))
    rec = load_record(run_dir)
    assert rec["status"] == "ok"
    assert rec["tags"]["energy.gpu"] == "not measured: nvidia-ml-py (pynvml) is not installed"
    assert rec["tags"]["energy.window"].startswith("workload")
    assert rec["metrics"]["energy_window_s"] > 0
    assert "energy_gpu_j" not in rec["metrics"]
    assert rec["hardware"]["gpu_state"] == {"start": [], "end": []}
    assert (run_dir / "artifacts" / POWER_TRACE).exists()
    assert (run_dir / "artifacts" / ENERGY_WINDOWS).exists()


def test_ranks_add_their_gpus_and_a_rank_without_nvml_leaves_the_sum_unmeasured(tmp_path):
    from hopperlab.core.rundir import write_json_atomic
    from hopperlab.run import ranks

    def rank(r, metrics, tags=None):
        write_json_atomic(tmp_path / f"ranks/{r}/record.json",
                          {"attempt": 1, "status": "ok", "metrics": metrics, "tags": tags or {}})

    rank(0, {"energy_gpu_j": 1000.0, "energy_host_j": 300.0, "power_gpu_peak_w": 650.0,
             "power_gpu_mean_w": 500.0})
    rank(1, {"energy_gpu_j": 900.0, "power_gpu_peak_w": 690.0, "power_gpu_mean_w": 450.0})
    m = ranks.merged_record(tmp_path, 1, 2)["metrics"]
    assert m["energy_gpu_j"] == 1900.0 and m["energy_host_j"] == 300.0
    assert m["power_gpu_peak_w"] == 690.0 and m["power_gpu_mean_w"] == 475.0
    rank(1, {"power_gpu_peak_w": 690.0},
         {"energy.gpu": "not measured: NVML unavailable: NVMLError_LibraryNotFound"})
    rec = ranks.merged_record(tmp_path, 1, 2)
    assert "energy_gpu_j" not in rec["metrics"]
    assert rec["tags"]["energy.gpu"].startswith("not measured: ranks [1]")
    assert "LibraryNotFound" in rec["tags"]["energy.gpu"]


def test_the_fingerprint_line_says_power_limit_clocks_and_temperatures():
    from hopperlab.node.hardware import gpu_state_line

    clock = Clock()
    res = _measure(EnergyMeter(ReplayGpus(clock, [600.0]), None, clock=clock), clock, 2.0)
    line = gpu_state_line({"gpu_state": res.gpu_state})
    assert line == "power limit 700 W, SM 1980 MHz, memory 2619 MHz at end, 40->43 C"
    assert gpu_state_line({}) is None


def test_measured_region_is_the_energy_window_with_or_without_cuda():
    pytest.importorskip("torch")
    from hopperlab.cuda.nvtx import measured_region, profiled_region

    heard = []
    with window.listening(lambda e, n: heard.append((e, n))):
        with measured_region():
            heard.append(("inside", ""))
        with profiled_region("none", None):
            pass
    assert heard == [("start", "measured"), ("inside", ""), ("end", "measured"),
                     ("start", "measured"), ("end", "measured")]


class FakeNvml:
    """The part of pynvml the meter calls, over recorded values (H200-like: 700 W limit)."""

    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 1, 2, 0
    NVML_FI_DEV_POWER_INSTANT = 186

    class NotSupported(Exception):
        pass

    def __init__(self, instant: bool = True, energy: bool = True) -> None:
        self.instant, self.energy, self.shut = instant, energy, False

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        self.shut = True

    def nvmlDeviceGetCount(self):
        return 3

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetUUID(self, h):
        return f"GPU-{h}{h}{h}".encode()

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        if not self.energy:
            raise self.NotSupported("Not Supported")
        return 2**64 - 1 if h == 0 else 1000 * h

    def nvmlDeviceGetFieldValues(self, h, ids):
        from types import SimpleNamespace

        assert ids == [186]
        return [SimpleNamespace(nvmlReturn=0 if self.instant else 3,
                                value=SimpleNamespace(uiVal=650_000 + h))]

    def nvmlDeviceGetPowerUsage(self, h):
        return 640_000

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return 700_000

    def nvmlDeviceGetClockInfo(self, h, kind):
        return 1980 if kind == 1 else 3201

    def nvmlDeviceGetTemperature(self, h, kind):
        return 41


def test_the_nvml_reader_through_a_recorded_pynvml(monkeypatch):
    from hopperlab.node.energy.nvml import NvmlGpus

    fake = FakeNvml()
    monkeypatch.setitem(__import__("sys").modules, "pynvml", fake)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    gpus, why = NvmlGpus.open()
    assert why is None and gpus.uuids == ["GPU-222", "GPU-000"] and gpus.indices == [2, 0]
    assert gpus.energy_mj(1) == 2**64 - 1 and isinstance(gpus.energy_mj(1), int)
    assert gpus.power_w(0) == pytest.approx(650.002) and gpus.power_kind == "instant"
    assert gpus.state(0) == {"index": 2, "uuid": "GPU-222", "power_limit_w": 700.0,
                             "sm_clock_mhz": 1980, "mem_clock_mhz": 3201, "temperature_c": 41}
    gpus.keep(["222"])
    assert gpus.uuids == ["GPU-222"]
    gpus.close()
    assert fake.shut


def test_nvml_without_instant_power_or_energy_counter(monkeypatch):
    from hopperlab.node.energy.nvml import NvmlGpus

    monkeypatch.setitem(__import__("sys").modules, "pynvml", FakeNvml(instant=False,
                                                                       energy=False))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpus, _ = NvmlGpus.open()
    assert len(gpus.uuids) == 3
    assert gpus.power_w(0) == 640.0 and gpus.power_kind == "average"
    assert gpus.energy_mj(0) is None and "Not Supported" in gpus.errors["energy"]


def test_a_one_process_run_counts_the_gpus_it_used_not_the_idle_ones():
    clock = Clock()
    asked = []

    def used(all_devices):
        asked.append(all_devices)
        return ["0001"]

    gpus = ReplayGpus(clock, [80.0, 600.0, 80.0, 80.0])  # a 4-GPU node, all visible
    res = _measure(EnergyMeter(gpus, None, clock=clock, own_uuids=used), clock, 2.0)
    assert res.metrics["energy_gpu_j"] == pytest.approx(1200.0)
    assert res.tags["energy.gpus"] == "1 of 4 visible (the ones torch used)"
    assert asked == [True]  # asked once, for every device torch holds memory on
