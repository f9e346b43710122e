"""Issue 36: joules per unit from the work done inside the window, slow steps flagged, the
plausibility gate against the node's matmul probe, and the label of a multi-rank run's GPUs.
Figures from the H200 runs of 2026-11-28 (../shared/data/gpu-2026-11-28/energy-h200-*)."""

from __future__ import annotations

from hopperlab.config.energy import energy_basis, energy_figures, plausibility, work_done
from hopperlab.core import energy_names as N
from hopperlab.run.ranks import _energy
from hopperlab.workloads import family_info
from hopperlab.workloads.finetune.metrics import StepRecord, window_work

#: finetune/full-1b/bf16-compile on the H200: 10 measured steps of 8,192 tokens, one of them
#: 3.3 s among 0.13 s ones, in a 4.518 s window of 1,429.6 J; p50 63,250 tokens/s
FULL_1B = {N.ENERGY_GPU_J: 1429.627, N.ENERGY_WINDOW_S: 4.518, N.ENERGY_WINDOWS: 1.0,
           "tokens_per_s": 63250.0, "flops_per_token": 9.0e9}
PROBE_BF16 = 0.947  # energy-probe-h200.json: TFLOP per joule of a bf16 matmul loop


def _steps() -> list[StepRecord]:
    times = [0.13] * 9 + [3.295]
    return [StepRecord(step=i, loss=1.0, step_s=t, data_wait_s=0.0, tokens=8192, measured=True)
            for i, t in enumerate(times)]


def test_the_work_done_and_the_stall_inside_the_window():
    work = window_work([StepRecord(0, 2.0, 20.0, 0.0, 8192, False), *_steps()])
    assert work["measured_tokens"] == 81920.0     # the warm-up step is not in the window
    assert work[N.SLOW_STEPS] == 1.0 and work["step_time_max_s"] == 3.295


def test_joules_per_unit_divide_by_the_work_done_not_the_p50_rate():
    units = family_info("finetune").work_units
    by_rate = energy_figures(FULL_1B, units)
    done = {**FULL_1B, **window_work(_steps())}
    by_work = energy_figures(done, units)
    assert work_done(units[0], done) == 81920.0
    # the rate hides the stall: 198.9 tokens per joule; the work done: 57.3
    assert abs(by_rate["train_tokens_per_j"] - 198.9) < 1.0
    assert abs(by_work["train_tokens_per_j"] - 81920 / 1429.627) < 1e-6
    assert abs(by_work["energy_per_1m_train_tokens_j"] - 1429.627 / 0.08192) < 1e-3
    assert energy_basis(done, units).startswith("work done: 81920")
    assert energy_basis(FULL_1B, units).startswith("rate:")
    # the gate: the rate's figure beats the matmul probe (implausible), the work done's not
    assert plausibility({**FULL_1B, **by_rate}, PROBE_BF16).startswith("implausible: 1.8 TFLOP")
    assert plausibility({**done, **by_work}, PROBE_BF16) is None
    assert plausibility({**done, **by_work}, None) is None


def test_two_ranks_sum_two_gpus_and_say_so_with_the_trace_why():
    def rank(j: float, ratio: float, why: str | None = None):
        tags = {N.TAG_GPUS: "1 of 2 visible (the ones torch used)"}
        if why:
            tags[N.TAG_TRACE] = why
        return {"metrics": {N.ENERGY_GPU_J: j, N.TRACE_RATIO: ratio, N.TRACE_MAX_GAP_S: 0.9},
                "tags": tags}
    recs = {0: rank(100.0, 1.0), 1: rank(300.0, 1.2, "trace/counter 1.200, ...")}
    metrics: dict[str, float] = {}
    tags: dict[str, str] = {}
    _energy(recs, metrics, tags)
    assert metrics[N.ENERGY_GPU_J] == 400.0
    assert abs(metrics[N.TRACE_RATIO] - (100 * 1.0 + 300 * 1.2) / 400) < 1e-9
    assert tags[N.TAG_GPUS].startswith("2 GPUs summed over 2 ranks")
    assert tags[N.TAG_TRACE].startswith("rank 1: trace/counter 1.200")


def test_the_basis_names_the_unit_the_run_measured():
    """membench declares two units (copies, its matmul probe): a matmul run's basis names the
    TFLOP it did, not the copies' GB/s it never measured (the lent H200, 2026-12-02: "rate: the
    window's mean power over gbps_at_largest" on both probe runs)."""
    units = family_info("membench").work_units
    probe = {N.ENERGY_GPU_J: 2075.0, N.ENERGY_WINDOW_S: 3.135, N.ENERGY_WINDOWS: 1.0,
             "tflops": 663.2, "measured_tflop": 2079.0}
    assert energy_basis(probe, units).startswith("work done: 2079 units")
    assert "measured_tflop" in energy_basis(probe, units)
    copy = {N.ENERGY_GPU_J: 378.4, N.ENERGY_WINDOW_S: 2.979, "gbps_at_largest": 98.8}
    assert energy_basis(copy, units) == ("rate: the window's mean power over gbps_at_largest "
                                         "(the p50 figure)")
