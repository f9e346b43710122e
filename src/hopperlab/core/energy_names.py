"""Energy's one vocabulary: every metric and tag name the meter writes and the records, the
report, the tables and the probe read (issue 36: they were spelled by hand in five files).
Names of a named window are these with the window's prefix (``duckdb_energy_gpu_j``)."""

from __future__ import annotations

# metrics
ENERGY_GPU_J = "energy_gpu_j"
ENERGY_HOST_J = "energy_host_j"
ENERGY_MODULE_J = "energy_module_j"
ENERGY_WINDOW_S = "energy_window_s"
ENERGY_WINDOWS = "energy_windows"
#: integrated 10 Hz trace over the counter's joules (windows of 2 s or more)
TRACE_RATIO = "energy_gpu_trace_ratio"
#: the largest gap between two power samples inside the window (why a trace can disagree)
TRACE_MAX_GAP_S = "energy_trace_max_gap_s"
POWER_GPU_MEAN_W = "power_gpu_mean_w"
POWER_GPU_PEAK_W = "power_gpu_peak_w"
POWER_HOST_MEAN_W = "power_host_mean_w"
#: measured steps longer than SLOW_STEP_X x the median step (a stall inside the window)
SLOW_STEPS = "slow_steps"
SLOW_STEP_X = 3.0
#: the model's FLOP per joule of GPU energy, for the plausibility gate
TFLOP_PER_J = "tflop_per_j"

# tags
TAG_PREFIX = "energy."
TAG_GPU = "energy.gpu"
TAG_HOST = "energy.host"
TAG_WINDOW = "energy.window"
TAG_SAMPLER = "energy.sampler"
TAG_GPUS = "energy.gpus"
TAG_ERRORS = "energy.errors"
#: why the trace and the counter disagree by more than TRACE_TOLERANCE, or were not compared
TAG_TRACE = "energy.trace"
#: how J per unit was divided: by the work done inside the window, or by a rate
TAG_BASIS = "energy.basis"
#: set by a workload whose window's work it cannot count (why), so that a J per unit by the
#: rate says so in TAG_BASIS instead of passing for the work done
TAG_WORK_NOT_COUNTED = "energy.work_not_counted"
#: a stall inside the measured window: how many steps, how long (in the report's energy rows)
TAG_SLOW = "energy.slow_steps"
#: "implausible: ..." when the run's work per joule beats the node's own matmul probe
TAG_PLAUSIBLE = "energy.plausible"
TRACE_TOLERANCE = 0.05
#: how TAG_TRACE starts when the window was too short to compare counter and trace
TRACE_NOT_COMPARED = "not compared"
#: work per joule above the probe's by more than this marks the energy implausible
PLAUSIBLE_MARGIN = 0.10


def prefixed(window: str, name: str) -> str:
    """``name`` of the named ``window`` (``""``: the measured window)."""
    return f"{window}_{name}" if window else name
